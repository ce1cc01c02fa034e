"""FSDP2's own execution against `export fsdp2`'s `fsdp2_timeline` (DESIGN §3.12): baseline plans
of TinyGPT at N = 2 (gloo) are exported, applied with `apply_plan`, and one training step runs
with `shardplan_torch.fsdp_timeline.TimelineRecorder` on; at every module boundary, in execution
order, the units FSDP2 holds unsharded (gathered, or their all-gather issued) equal the export's
prediction."""

import json
import os
import pathlib
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardplan_torch.fsdp import apply_plan
from shardplan_torch.fsdp_timeline import TimelineRecorder
from shardplan_torch.testing import TinyGPT, batch, free_port, loss_fn, shardplan, tiny_profile

KINDS = ["fsdp2", "fsdp1", "zero2", "zero3", "ddp"]


def worker(rank, world, exported, result_path, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    recorded = {}
    for kind, path in exported.items():
        torch.manual_seed(0)
        model = TinyGPT()
        apply_plan(model, model.units(), path)
        recorder = TimelineRecorder(model, model.units())
        loss_fn(model, batch(rank, world)).backward()
        recorded[kind] = recorder.entries
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(recorded, f)
    dist.destroy_process_group()


class Fsdp2Timeline(unittest.TestCase):
    def test_recorded_boundaries_equal_the_exported_timeline(self):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            prof = d / "tiny.toml"
            tiny_profile(d, batch(0, 1), prof)
            exported, predicted = {}, {}
            for kind in KINDS:
                plan = d / f"{kind}.plan.toml"
                shardplan("baseline", "--profile", str(prof), "--kind", kind, "--out", str(plan))
                path = d / f"{kind}.fsdp2.json"
                shardplan("export", "fsdp2", "--plan", str(plan), "--profile", str(prof), "--out", str(path))
                exported[kind] = str(path)
                timeline = json.loads(path.read_text())["fsdp2_timeline"]
                predicted[kind] = [{"at": e["at"], "unsharded": e["unsharded"]} for e in timeline]
            result = d / "recorded.json"
            mp.spawn(worker, args=(2, exported, str(result), free_port()), nprocs=2)
            recorded = json.loads(result.read_text())
            for kind in KINDS:
                with self.subTest(plan=kind):
                    self.assertEqual(recorded[kind], predicted[kind])
                    self.assertTrue(any(len(e["unsharded"]) > 1 for e in predicted[kind]) or kind == "ddp")


if __name__ == "__main__":
    unittest.main()
