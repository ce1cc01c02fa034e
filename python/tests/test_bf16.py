"""The bf16 policy (DESIGN §6.9) against PyTorch running the same policy: gpt2-tiny with
`[training] precision = "bf16"` (reduce fp32) is profiled by `shardplan profile measure`, each
baseline plan of it is trained by `shardplan run` at N = 2 (mpirun, CPU backend) and, exported
with `shardplan export fsdp2`, by transformers' GPT2LMHeadModel under FSDP2 with
`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` (gloo, N = 2, each rank on
its share of the global batch, the loss over float32 logits as transformers' own loss takes
it), from the same initial weights on the same batches. Each of 5 losses must be within 1% of
PyTorch's, and closer to PyTorch's than unsharded fp32 training's are; the test prints both runs' differences from unsharded fp32 training (PyTorch's own
bf16-versus-fp32 difference, the yardstick) for docs/runtime-results.md. With `reduce = "bf16"`
(gradients reduced in bf16, NCCL's and a user-defined MPI sum that rounds at every addition)
the same holds against `reduce_dtype=bfloat16`."""

import json
import pathlib
import tempfile
import tomllib
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from shardplan_torch import apply_plan, units
from shardplan_torch.gpt2 import adamw, batches, config, sample_text, train
from shardplan_torch.testing import free_port, in_process_group, launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gpt2-tiny.toml"
WORLD, STEPS = 2, 5


def shardplan(world, *args):
    result = launch(world, *args)
    if result.returncode != 0:
        raise AssertionError(f"shardplan {' '.join(args)} at N = {world} failed:\n{result.stderr}")
    return result.stdout


def exported_losses(rank, world, spec_path, init, exported):
    """Trains transformers' GPT-2 under the exported plan (and its mixed precision) on this
    rank's share of each step's batch; the mean loss over the ranks per step."""
    from transformers import GPT2LMHeadModel

    spec = tomllib.loads(pathlib.Path(spec_path).read_text())
    model = GPT2LMHeadModel(config(spec)).float()
    model.load_state_dict(load_file(init), strict=False)
    model.tie_weights()
    apply_plan(model, units(model), exported)
    optimizer = adamw(model, spec["training"])
    share = spec["training"]["batch_size"] // world
    losses = []
    for x, y in batches(sample_text(ROOT), spec["seq_len"], spec["training"]["batch_size"], STEPS):
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return losses


def worker(rank, world, spec_path, init, exported, result, port):
    """Rank `rank` of the PyTorch run; rank 0 writes the losses to `result`."""
    losses = in_process_group(rank, world, port, exported_losses, rank, world, spec_path, init, exported)
    if rank == 0:
        pathlib.Path(result).write_text(json.dumps(losses))


class Bf16AgainstPyTorch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import GPT2LMHeadModel

        cls.dir = tempfile.TemporaryDirectory()
        d = pathlib.Path(cls.dir.name)
        cls.spec = tomllib.loads(MODEL.read_text())
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config(cls.spec)).float()
        model.save_pretrained(d / "init", safe_serialization=True)
        cls.init = d / "init" / "model.safetensors"
        cls.data = d / "data.txt"
        cls.data.write_bytes(sample_text(ROOT))
        cls.fp32 = train(model, cls.spec, sample_text(ROOT), STEPS)

    def model_file(self, reduce):
        path = pathlib.Path(self.dir.name) / f"gpt2-tiny-bf16-{reduce}.toml"
        path.write_text(MODEL.read_text().replace(
            "[training]\n", f"[training]\nprecision = \"bf16\"\nreduce = \"{reduce}\"\n"))
        return path

    def both(self, reduce, kind, checkpoint):
        """shardplan's and PyTorch's losses under `kind`'s plan of the bf16 profile."""
        d = pathlib.Path(self.dir.name)
        model = self.model_file(reduce)
        tag = f"{reduce}-{kind}{'-ckpt' if checkpoint else ''}"
        profile, plan, exported = d / f"{reduce}.profile.toml", d / f"{tag}.plan.toml", d / f"{tag}.json"
        if not profile.exists():
            shardplan(1, "profile", "measure", "--backend", "cpu", "--model", str(model),
                      "--world-size", str(WORLD), "--device", "h100-sxm", "--repeats", "1",
                      "--out", str(profile))
        shardplan(1, "baseline", "--profile", str(profile), "--kind", kind,
                  *(["--checkpoint"] if checkpoint else []), "--out", str(plan))
        shardplan(1, "export", "fsdp2", "--plan", str(plan), "--profile", str(profile), "--out", str(exported))
        policy = json.loads(exported.read_text())["mixed_precision"]
        self.assertEqual(policy, {"param_dtype": "bfloat16", "reduce_dtype": {"fp32": "float32", "bf16": "bfloat16"}[reduce]})
        report = json.loads(shardplan(
            WORLD, "run", "--backend", "cpu", "--profile", str(profile), "--plan", str(plan),
            "--model", str(model), "--steps", str(STEPS), "--data", str(self.data),
            "--init-weights", str(self.init), "--json"))
        self.assertEqual(report["arena_bytes"], report["predicted_peak_memory_bytes"], tag)
        result = d / f"{tag}.losses.json"
        mp.spawn(worker, args=(WORLD, str(model), str(self.init), str(exported), str(result), free_port()),
                 nprocs=WORLD)
        return report["losses"], json.loads(result.read_text())

    def check(self, reduce, kind, checkpoint=False):
        ours, torch_bf16 = self.both(reduce, kind, checkpoint)
        relative = lambda a, b: [abs(x - y) / abs(y) for x, y in zip(a, b, strict=True)]
        to_torch, torch_to_fp32, ours_to_fp32 = (
            relative(ours, torch_bf16), relative(torch_bf16, self.fp32), relative(ours, self.fp32))
        print(f"\nbf16 reduce {reduce}, {kind}{'+ckpt' if checkpoint else ''}: shardplan {ours}\n"
              f"  PyTorch FSDP2 {torch_bf16}\n  fp32 {self.fp32}\n"
              f"  max |ours − PyTorch bf16| {max(to_torch):.3%}, |PyTorch bf16 − fp32| "
              f"{max(torch_to_fp32):.3%}, |ours − fp32| {max(ours_to_fp32):.3%}")
        self.assertLess(max(to_torch), 0.01, (ours, torch_bf16))
        # Ours rounds as PyTorch's bf16 run does where it matters: closer to it than fp32 is.
        self.assertLess(max(to_torch), max(torch_to_fp32), (ours, torch_bf16, self.fp32))
        # The policy took effect: bf16 parameters do not train to fp32's numbers.
        self.assertGreater(max(ours_to_fp32), 1e-5, (ours, self.fp32))

    def test_fp32_reductions_under_sharded_and_replicated_plans(self):
        for kind, checkpoint in [("fsdp2", True), ("zero2", False), ("ddp", False)]:
            with self.subTest(kind=kind, checkpoint=checkpoint):
                self.check("fp32", kind, checkpoint)

    def test_bf16_reductions(self):
        self.check("bf16", "zero3")


if __name__ == "__main__":
    unittest.main()
