"""`scripts/gpt2-compare --bf16` (the comparison gpu-check §4b makes of CUDA's bf16 weights with
the CPU backend's) on its CPU analogue: gpt2-tiny under `precision = "bf16"`, fsdp2 with
checkpointing, trained 3 steps at N = 1 and at N = 2 (mpirun), whose reduction sums the same
gradients in another order. The plain measure (every tensor within 5e-2 of the update) fails,
on the attention's key bias alone: its gradient is zero in exact arithmetic, so its sign is the
rounding's and AdamW steps by lr regardless. The bf16 measure passes, and fails on real
divergences written into the N = 2 run's weights: one element moved past AdamW's reach, one
tensor's update reversed, one tensor moved by a tenth of its update."""

import pathlib
import subprocess
import tempfile
import tomllib
import unittest

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel

from shardplan_torch.gpt2 import config, sample_text
from shardplan_torch.testing import launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPARE = ROOT / "scripts" / "gpt2-compare"
STEPS = 3


def shardplan(world, *args):
    result = launch(world, *args)
    if result.returncode != 0:
        raise AssertionError(f"shardplan {' '.join(args)} at N = {world} failed:\n{result.stderr}")
    return result.stdout


def compare(*args):
    """gpt2-compare's exit code and output."""
    out = subprocess.run(["python3", str(COMPARE), *map(str, args)], capture_output=True, text=True)
    return out.returncode, out.stdout + out.stderr


class Bf16Rounding(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.d = pathlib.Path(cls.tmp.name)
        text = (ROOT / "models" / "gpt2-tiny.toml").read_text()
        cls.model = d / "gpt2-tiny-bf16.toml"
        cls.model.write_text(text.replace("[training]\n", '[training]\nprecision = "bf16"\nreduce = "bf16"\n'))
        cls.spec = tomllib.loads(cls.model.read_text())
        torch.manual_seed(0)
        GPT2LMHeadModel(config(cls.spec)).float().save_pretrained(d / "init", safe_serialization=True)
        cls.init = d / "init" / "model.safetensors"
        (d / "data.txt").write_bytes(sample_text(ROOT))
        for world in (1, 2):
            profile, plan = d / f"n{world}.profile.toml", d / f"n{world}.plan.toml"
            shardplan(1, "profile", "analytic", "--model", str(cls.model), "--device", "h100-sxm",
                      "--world-size", str(world), "--out", str(profile))
            shardplan(1, "baseline", "--profile", str(profile), "--kind", "fsdp2", "--checkpoint", "--out", str(plan))
            report = shardplan(world, "run", "--backend", "cpu", "--profile", str(profile), "--plan", str(plan),
                               "--model", str(cls.model), "--data", str(d / "data.txt"), "--init-weights",
                               str(cls.init), "--steps", str(STEPS), "--semantics",
                               "relaxed" if world == 2 else "strict", "--save-weights",
                               str(d / f"n{world}.safetensors"), "--json")
            (d / f"n{world}.json").write_text(report)
        code, out = compare("--reference-from", d / "n1.json", d / "n1.safetensors", cls.init, d / "n1.reference")
        assert code == 0, out

    def bf16(self, weights):
        return compare("--bf16", self.model, self.d / "n1.reference", self.d / "n2.json", weights)

    def test_the_plain_measure_fails_on_the_key_bias_alone(self):
        code, out = compare(self.d / "n1.reference", self.d / "n2.json", self.d / "n2.safetensors", 1e-3, 5e-2)
        self.assertEqual(code, 1, out)
        failures = [line for line in out.splitlines() if line.startswith("FAILED")]
        self.assertTrue(failures, out)
        self.assertTrue(all(".attn.c_attn.bias:" in line for line in failures), out)
        ours, theirs = load_file(self.d / "n2.safetensors"), load_file(self.d / "n1.safetensors")
        hidden = self.spec["hidden"]
        for layer in range(self.spec["layers"]):
            name = f"transformer.h.{layer}.attn.c_attn.bias"
            gap = ours[name] - theirs[name]
            key = gap[hidden:2 * hidden].norm()
            self.assertGreater(key, 10 * gap[:hidden].norm(), f"layer {layer}: the query bias differs as much")
            self.assertGreater(key, 10 * gap[2 * hidden:].norm(), f"layer {layer}: the value bias differs as much")

    def test_the_bf16_measure_passes_two_reduction_orders(self):
        code, out = self.bf16(self.d / "n2.safetensors")
        self.assertEqual(code, 0, out)
        print(out)

    def perturbed(self, name, change):
        weights = load_file(self.d / "n2.safetensors")
        initial = load_file(self.init)
        weights[name] = change(weights[name].clone(), initial[name])
        path = self.d / "perturbed.safetensors"
        save_file(weights, path)
        return self.bf16(path)

    def assert_fails(self, result, expected):
        code, out = result
        self.assertEqual(code, 1, out)
        self.assertIn(expected, out)

    def test_real_divergences_fail(self):
        lr = self.spec["training"]["learning_rate"]

        def moved(w, w0):
            w.view(-1)[17] += 10 * STEPS * lr
            return w

        hidden = self.spec["hidden"]

        def key_moved(w, w0):
            w[hidden + 5] += 10 * STEPS * lr
            return w

        with self.subTest("one element past AdamW's reach"):
            self.assert_fails(self.perturbed("transformer.h.0.mlp.c_fc.weight", moved),
                              "transformer.h.0.mlp.c_fc.weight: 1 elements beyond AdamW's reach")
        with self.subTest("one key bias element past AdamW's reach"):
            self.assert_fails(self.perturbed("transformer.h.1.attn.c_attn.bias", key_moved),
                              "transformer.h.1.attn.c_attn.bias: 1 elements beyond AdamW's reach")
        with self.subTest("one tensor's update reversed"):
            self.assert_fails(self.perturbed("transformer.h.2.ln_1.weight", lambda w, w0: 2 * w0 - w),
                              "elements differ by more than lr/2, at most 2 may")
        with self.subTest("a tenth of the update added"):
            self.assert_fails(self.perturbed("transformer.h.1.attn.c_proj.weight", lambda w, w0: w + 0.1 * (w - w0)),
                              "transformer.h.1.attn.c_proj.weight: the other elements")


if __name__ == "__main__":
    unittest.main()
