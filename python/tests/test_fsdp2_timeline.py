"""FSDP2's own execution against `export fsdp2`'s `fsdp2_timeline` (DESIGN §3.12): plans of
TinyGPT are exported, applied with `apply_plan`, and one optimizer step runs with
`shardplan_torch.fsdp_timeline.TimelineRecorder` on; at every module boundary, in execution
order, the units FSDP2 holds unsharded (gathered, or their all-gather issued), the all-gathers
its hook issued, in order, the bytes it holds unsharded, and the groups it resharded and reduced
before the next boundary, in order, equal the export's prediction.

The grid: N = 2 (gloo) and N = 4 declared as 2 nodes × 2, each at K = 1 and K = 2 (with the
micro-batch switches: fsdp2-nosync, ddp-nosync: no gradient sync; zero2: no reshard after
backward; hsdp-ra-once: `set_requires_all_reduce(False)`; on the first micro-batch), every
baseline of the profile with and without checkpointing (the offload ones: test_offload_export.py),
and the ILP's plans at two caps (none, and 5% above the smallest peak of the target) for the
runtime target and the fsdp2 target (at K = 2 the micro-batch MIP over FSDP2's space, its switches
per unit). One process group per (N, K) runs every plan."""

import json
import pathlib
import tempfile
import unittest

import torch
import torch.multiprocessing as mp

from shardplan_torch import start_micro_batch
from shardplan_torch.fsdp import apply_plan
from shardplan_torch.fsdp_timeline import TimelineRecorder
from shardplan_torch.testing import TinyGPT, batch, free_port, in_process_group, loss_fn, shardplan, tiny_profile


RECORDED = ["at", "unsharded", "issued", "unsharded_bytes", "resharded", "reduced"]


def record(rank, world, exported):
    """Each exported plan's recorded timeline, by name, on this rank."""
    recorded = {}
    for kind, path in exported.items():
        torch.manual_seed(0)
        model = TinyGPT()
        apply_plan(model, model.units(), path)
        recorder = TimelineRecorder(model, model.units())
        with open(path) as f:
            micro_batches = json.load(f)["micro_batches"]
        for m in range(micro_batches):
            start_micro_batch(model, model.units(), path, m)
            loss_fn(model, batch(rank, world)).backward()
        recorded[kind] = recorder.entries
    return recorded


def worker(rank, world, exported, result_path, port):
    recorded = in_process_group(rank, world, port, record, rank, world, exported)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(recorded, f)


class Fsdp2Timeline(unittest.TestCase):
    def check(self, d, prof, kinds, world, plans=None):
        """Exports the baselines `kinds` (and the plan files `plans`, by name) of `prof`, runs them
        at `world` ranks and compares; the predictions by name."""
        plans = dict(plans or {})
        for kind in kinds:
            plans[kind] = d / f"{kind}.plan.toml"
            name, ckpt = kind.removesuffix("+ckpt"), ["--checkpoint"] if kind.endswith("+ckpt") else []
            shardplan("baseline", "--profile", str(prof), "--kind", name, *ckpt, "--out", str(plans[kind]))
        exported, predicted, sharded = {}, {}, {}
        for kind, plan in plans.items():
            path = d / f"{kind}.fsdp2.json"
            # An ILP plan's FSDP2 settings may peak above its cap (DESIGN §3.12): --force.
            shardplan("export", "fsdp2", "--plan", str(plan), "--profile", str(prof), "--out", str(path), "--force")
            exported[kind] = str(path)
            export = json.loads(path.read_text())
            timeline = export["fsdp2_timeline"]
            sharded[kind] = any(u["sharded"] for u in export["units"])
            predicted[kind] = [{k: e[k] for k in RECORDED} for e in timeline]
        result = d / "recorded.json"
        mp.spawn(worker, args=(world, exported, str(result), free_port()), nprocs=world)
        recorded = json.loads(result.read_text())
        for kind in plans:
            with self.subTest(plan=kind):
                self.assertEqual(recorded[kind], predicted[kind])
                if sharded[kind]:  # some boundary holds a prefetched unit
                    self.assertTrue(any(len(e["unsharded"]) > 1 for e in predicted[kind]), predicted[kind])
        return predicted

    def ilp(self, d, prof, targets):
        """The ILP's plans of `prof` for each target without a cap and at 5% above the target's
        smallest peak (FSDP2's, its buffers beside the model's, for the fsdp2 target), by name."""
        plans = {}
        for target in targets:
            smallest = json.loads(shardplan("solve", "--profile", str(prof), "--objective", "memory",
                                            "--target", target, "--out", str(d / f"m-{target}.toml"),
                                            "--json"))
            key = "fsdp2_peak_memory_bytes" if target == "fsdp2" else "peak_memory_bytes"
            for cap, value in [("unlimited", "unlimited"), ("tight", str(int(smallest[key] * 1.05)))]:
                name = f"ilp-{target}-{cap}"
                plans[name] = d / f"{name}.plan.toml"
                shardplan("solve", "--profile", str(prof), "--memory-cap", value, "--time-limit", "10",
                          "--target", target, "--out", str(plans[name]))
        return plans

    def grid(self, world, micro_batches, extra_kinds=()):
        """Every baseline (± checkpointing) and the ILP's plans of one (N, K) cell; the exports by
        name."""
        kinds = ["ddp", "zero2", "fsdp1", "fsdp2", "zero3", "best-grid", *extra_kinds]
        kinds += [f"{k}+ckpt" for k in kinds]
        nodes = {} if world == 2 else {"gpus_per_node": 2}
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            prof = d / "tiny.toml"
            tiny_profile(d, batch(0, 1), prof, name=f"tiny gpt n{world} k{micro_batches}", world=world,
                         micro_batches=micro_batches, **nodes)
            plans = self.ilp(d, prof, ["runtime", "fsdp2"])
            predicted = self.check(d, prof, kinds, world, plans)
            exports = {name: json.loads((d / f"{name}.fsdp2.json").read_text()) for name in plans}
        for name, export in exports.items():
            if "fsdp2" in name:  # exported exactly: FSDP2's time is the plan's (DESIGN §4.9)
                self.assertEqual(export["approximations"], [])
                self.assertEqual(export["fsdp2_iteration_time_us"], export["plan_iteration_time_us"])
        return predicted

    def test_two_ranks_one_micro_batch(self):
        self.grid(2, 1)

    def test_two_ranks_two_micro_batches(self):
        predicted = self.grid(2, 2, ["ddp-nosync", "fsdp2-nosync"])
        # zero2 keeps its parameters into the second micro-batch: its first forward finds them whole.
        units = len(predicted["zero2"]) // 4
        self.assertEqual(len(predicted["zero2"][2 * units]["unsharded"]), units)

    def test_four_ranks_on_two_nodes_one_micro_batch(self):
        self.grid(4, 1, ["hsdp", "hpz"])

    def test_four_ranks_on_two_nodes_two_micro_batches(self):
        self.grid(4, 2, ["ddp-nosync", "fsdp2-nosync", "hsdp", "hsdp-nosync", "hsdp-ra-once", "hpz",
                         "hpz-nosync"])

if __name__ == "__main__":
    unittest.main()
