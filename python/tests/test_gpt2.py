"""GPT-2 training numerics against Hugging Face transformers: a random-initialized
`GPT2LMHeadModel` (built from models/gpt2-tiny.toml's config, no download) is saved with
`save_pretrained(safe_serialization=True)`; transformers + torch.optim.AdamW train it K steps on
the byte-tokenized batches `shardplan run --data` takes; `shardplan run --init-weights` trains
the same weights under baseline plans at N = 1, 2 and 4 (mpirun). Per-step losses must agree to
1e-4 relative and the trained weights' update to 1e-2 relative (‖W_ours − W_hf‖ / ‖W_hf − W_0‖).
With K = 4 micro-batches per step (`[training] micro_batches = 4`), transformers runs four
forward/backward passes per AdamW step, each loss divided by 4, and every K-aware baseline
(reduce every micro-batch, accumulate, keep) must match it the same way. Random plans
(recompute, multi-slot launches, accumulate and keep, strict and relaxed) are checked against the
N = 1 DDP run by tests/gpt2.rs."""

import json
import pathlib
import tempfile
import tomllib
import unittest

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel

from shardplan_torch.gpt2 import config, sample_text, train
from shardplan_torch.testing import launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gpt2-tiny.toml"
STEPS = 3


def text():
    return sample_text(ROOT)


def shardplan(world, *args):
    result = launch(world, *args)
    if result.returncode != 0:
        raise AssertionError(f"shardplan {' '.join(args)} at N = {world} failed:\n{result.stderr}")
    return result.stdout


def with_offload(plan, offload):
    """`plan` (a plan file's text) with `offload = mode` added to each unit `offload` names."""
    offload = dict(offload)
    head, *units = plan.split("[[units]]\n")
    for i, unit in enumerate(units):
        name = tomllib.loads(unit)["name"]
        if name in offload:
            units[i] = unit.rstrip("\n") + f'\noffload = "{offload.pop(name)}"\n\n'
    if offload:
        raise AssertionError(f"the plan has no unit {sorted(offload)}")
    return "[[units]]\n".join([head, *units])


class Gpt2AgainstTransformers(unittest.TestCase):
    MICRO_BATCHES = 1

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        d = pathlib.Path(cls.dir.name)
        cls.model = MODEL
        if cls.MICRO_BATCHES > 1:
            cls.model = d / "gpt2-tiny-k.toml"
            cls.model.write_text(MODEL.read_text().replace(
                "[training]\n", f"[training]\nmicro_batches = {cls.MICRO_BATCHES}\n"))
        cls.spec = tomllib.loads(cls.model.read_text())
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config(cls.spec)).float()
        model.save_pretrained(d / "init", safe_serialization=True)
        cls.init = d / "init" / "model.safetensors"
        cls.w0 = load_file(cls.init)
        cls.data = d / "data.txt"
        cls.data.write_bytes(text())
        cls.hf_losses = train(model, cls.spec, text(), STEPS)
        cls.hf = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def check(self, world, kind, checkpoint=False, semantics="strict", node=None, host=False, offload=None):
        """Trains `kind`'s plan (a baseline, or "ilp": a hierarchical plan of the solver) at `world` ranks,
        on nodes of `node` where given (on a profile with a measured host link where `host`), with
        `offload` ({unit name: mode}) written into the baseline's units where given, and checks it
        against transformers."""
        d = pathlib.Path(self.dir.name)
        nodes = ("" if node is None else f"g{node}") + ("h" if host else "")
        edited = "".join(f"-{name}.{mode}" for name, mode in (offload or {}).items())
        tag = f"{kind}{'-ckpt' if checkpoint else ''}{edited}-{semantics}-n{world}{nodes}"
        profile, plan, out = d / f"p{world}{nodes}.toml", d / f"{tag}.plan.toml", d / f"{tag}.safetensors"
        if not profile.exists() and node is None:
            shardplan(1, "profile", "measure", "--backend", "cpu", "--model", str(self.model),
                      "--world-size", str(world), "--device", "h100-sxm", "--repeats", "1",
                      *(["--host-link", "--max-message", "1MiB"] if host else []), "--out", str(profile))
        elif not profile.exists():
            # Measured among the ranks: on the catalog's GPU curves this CPU's compute hides every
            # collective, and the ILP has no reason to choose a group.
            shardplan(world, "profile", "measure", "--backend", "cpu", "--model", str(self.model),
                      "--world-size", str(world), "--gpus-per-node", str(node), "--repeats", "3",
                      "--max-message", "4MiB", *(["--host-link"] if host else []), "--out", str(profile))
        if kind == "ilp":
            self.solve_hierarchical(profile, plan)
        else:
            shardplan(1, "baseline", "--profile", str(profile), "--kind", kind,
                      *(["--checkpoint"] if checkpoint else []), "--out", str(plan))
            if offload:
                plan.write_text(with_offload(plan.read_text(), offload))
        report = json.loads(shardplan(
            world, "run", "--backend", "cpu", "--profile", str(profile), "--plan", str(plan),
            "--model", str(self.model), "--steps", str(STEPS), "--data", str(self.data),
            "--init-weights", str(self.init), "--save-weights", str(out),
            "--semantics", semantics, "--json"))
        for ours, theirs in zip(report["losses"], self.hf_losses, strict=True):
            self.assertLess(abs(ours - theirs) / abs(theirs), 1e-4, f"{tag}: {report['losses']} vs {self.hf_losses}")
        ours = load_file(out)
        for name, w0 in self.w0.items():
            hf = self.hf[name]
            update = (hf - w0).norm().item()
            error = (ours[name] - hf).norm().item()
            self.assertLess(error, 1e-2 * update, f"{tag}: {name}: |ours-hf| {error:.3e}, |hf-w0| {update:.3e}")
        return report

    def test_single_rank_ddp(self):
        report = self.check(1, "ddp")
        self.assertLess(self.hf_losses[-1], self.hf_losses[0])
        self.assertEqual(report["arena_bytes"], report["predicted_peak_memory_bytes"])

    def test_two_ranks_every_level(self):
        for kind, checkpoint in [("zero2", False), ("fsdp2", True), ("zero3", False)]:
            with self.subTest(kind=kind, checkpoint=checkpoint):
                self.check(2, kind, checkpoint)

    def test_four_ranks_relaxed(self):
        self.check(4, "fsdp1", True, "relaxed")

    def test_offload_at_one_and_two_ranks(self):
        """The offload baselines (DESIGN §6.12: `full` and `optimizer` offload, the host arena, the
        copy and host threads) on a profile with a measured host link; the arenas are the
        predicted device peak and host bytes."""
        if self.MICRO_BATCHES > 1:
            self.skipTest("offload is modelled at one micro-batch per step (DESIGN §3.13)")
        for world, kind, semantics in [(1, "fsdp2-offload", "strict"), (1, "zero3-offload", "relaxed"),
                                       (2, "fsdp2-offload", "relaxed"), (2, "zero3-offload", "strict")]:
            with self.subTest(world=world, kind=kind):
                report = self.check(world, kind, semantics=semantics, host=True)
                self.assertEqual(report["arena_live_peak_bytes"], report["predicted_peak_memory_bytes"])
                self.assertEqual(report["host_arena_bytes"] * world, report["predicted_host_node_bytes"])

    def test_offload_over_shard_groups_and_hpz(self):
        """Offload on nodes (DESIGN §3.13, §6.12) at N = 4 declared as 2 nodes of 2: HSDP with
        `optimizer` and `full` units over the shard group of 2 (their copies to the host and host
        steps after the replica AllReduce), hpZ with an `optimizer` unit (its backward gather reads
        the secondary shard), strict and relaxed; the arenas are the predicted device peak and host
        bytes of the edited plan, which the run simulates."""
        if self.MICRO_BATCHES > 1:
            self.skipTest("offload is modelled at one micro-batch per step (DESIGN §3.13)")
        for kind, offload, semantics in [("hsdp", {"block.1": "optimizer", "block.3": "full"}, "strict"),
                                         ("hsdp", {"block.2": "full", "block.4": "optimizer"}, "relaxed"),
                                         ("hpz", {"block.2": "optimizer", "head": "optimizer"}, "relaxed")]:
            with self.subTest(kind=kind, offload=offload, semantics=semantics):
                report = self.check(4, kind, semantics=semantics, node=2, host=True, offload=offload)
                self.assertEqual(report["arena_live_peak_bytes"], report["predicted_peak_memory_bytes"])
                host = tomllib.loads((pathlib.Path(self.dir.name) / "p4g2h.toml").read_text())["host"]
                self.assertEqual(report["host_arena_bytes"] * host["ranks_per_node"],
                                 report["predicted_host_node_bytes"])
                self.assertGreater(report["host_arena_bytes"], 0)

    def solve_hierarchical(self, profile, plan):
        """The ILP's plan under the first of a ladder of caps, from fsdp1+ckpt's peak to hsdp's,
        whose plan shards a unit over a node or keeps an hpZ shard (at loose caps the flat levels
        may win)."""
        d = pathlib.Path(self.dir.name)

        def peak(kind, *extra):
            path = d / f"{kind}-ladder.plan.toml"
            shardplan(1, "baseline", "--profile", str(profile), "--kind", kind, *extra, "--out", str(path))
            return tomllib.loads(path.read_text())["predicted"]["peak_memory_bytes"]

        low, high = peak("fsdp1", "--checkpoint"), peak("hsdp")
        caps = [int(low + (high - low) * k / 11) for k in range(12)]
        for cap in caps:
            shardplan(1, "solve", "--profile", str(profile), "--memory-cap", str(cap), "--time-limit", "10",
                      "--model", str(self.model), "--out", str(plan))
            if any("shard_group" in u or "secondary_group" in u for u in tomllib.loads(plan.read_text())["units"]):
                return
        self.fail(f"no cap from fsdp1+ckpt's peak to hsdp's ({caps}) gives a hierarchical ILP plan")

    def test_four_ranks_as_two_nodes(self):
        """Hierarchical plans (DESIGN §3.11, §6.11) at N = 4 declared as 2 nodes of 2: HSDP (shard
        group of 2, replica AllReduce across the nodes), hpZ (a secondary shard of 2 after each
        forward) and the ILP's plan, strict and relaxed; the baselines' arena is the predicted peak."""
        for kind, checkpoint, semantics in [("hsdp", False, "strict"), ("hsdp", True, "relaxed"),
                                            ("hpz", False, "relaxed"), ("hpz", True, "strict"),
                                            ("ilp", False, "strict"), ("ilp", False, "relaxed")]:
            with self.subTest(kind=kind, checkpoint=checkpoint, semantics=semantics):
                report = self.check(4, kind, checkpoint, semantics, node=2)
                if kind != "ilp":  # The ILP's plan is packed within its cap by `solve --model`.
                    self.assertEqual(report["arena_bytes"], report["predicted_peak_memory_bytes"])
                plan = pathlib.Path(self.dir.name) / f"{kind}{'-ckpt' if checkpoint else ''}-{semantics}-n4g2.plan.toml"
                units = tomllib.loads(plan.read_text())["units"]
                self.assertTrue(any("shard_group" in u or "secondary_group" in u for u in units), kind)

    def test_saved_weights_load_in_transformers(self):
        """The file `--save-weights` writes is a transformers checkpoint: from_pretrained loads
        every tensor as written (the head tied to wte)."""
        d = pathlib.Path(self.dir.name)
        self.check(1, "ddp")
        checkpoint = d / "trained"
        checkpoint.mkdir(exist_ok=True)
        (checkpoint / "config.json").write_text((d / "init" / "config.json").read_text())
        (checkpoint / "model.safetensors").write_bytes((d / "ddp-strict-n1.safetensors").read_bytes())
        loaded = GPT2LMHeadModel.from_pretrained(str(checkpoint)).state_dict()
        written = load_file(checkpoint / "model.safetensors")
        self.assertEqual(set(written), set(self.w0))
        for name, value in written.items():
            self.assertTrue(torch.equal(loaded[name], value), name)
        self.assertTrue(torch.equal(loaded["lm_head.weight"], written["transformer.wte.weight"]))


class Gpt2AccumulatingAgainstTransformers(Gpt2AgainstTransformers):
    """The same checks at K = 4 micro-batches per optimizer step, and the K-aware baselines."""

    MICRO_BATCHES = 4

    def test_single_rank_ddp(self):
        report = self.check(1, "ddp")
        self.assertEqual(report["arena_bytes"], report["predicted_peak_memory_bytes"])
        self.check(1, "ddp-nosync", True)

    def test_two_ranks_every_level(self):
        for kind, checkpoint in [("fsdp2", False), ("fsdp2-nosync", True), ("zero2", False),
                                 ("ddp-nosync", False), ("ddp", True), ("zero3", True),
                                 ("fsdp1", False), ("best-grid", True)]:
            with self.subTest(kind=kind, checkpoint=checkpoint):
                report = self.check(2, kind, checkpoint)
                self.assertEqual(report["arena_bytes"], report["predicted_peak_memory_bytes"])

    def test_four_ranks_relaxed(self):
        for kind, checkpoint in [("fsdp2-nosync", False), ("zero2", True), ("fsdp1", True)]:
            with self.subTest(kind=kind, checkpoint=checkpoint):
                self.check(4, kind, checkpoint, "relaxed")

    # The weights file's format does not depend on K; hierarchical levels at K = 2:
    # test_gpt2_hierarchical_micro_batches.py.
    test_saved_weights_load_in_transformers = None
    test_four_ranks_as_two_nodes = None


if __name__ == "__main__":
    unittest.main()
