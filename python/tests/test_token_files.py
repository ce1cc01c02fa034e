"""Token files as people feed GPT-2, written by numpy: nanoGPT's raw uint16 `train.bin` and llm.c's
`.bin` (256 int32 of header, then uint16 tokens). `shardplan run --data` on either trains a GPT-2
with a vocabulary past bytes (1,000 tokens) to the losses transformers computes on the same
tokens, from the same initial weights, at N = 1 and N = 2; a token at or above the vocabulary is
refused naming the file and its position; and a file far larger than the run's memory is mapped,
not read: the process's peak resident memory stays below the file's size."""

import json
import pathlib
import subprocess
import tempfile
import time
import tomllib
import unittest

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from shardplan_torch.gpt2 import config, train
from shardplan_torch.testing import BIN, launch, shardplan

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB, STEPS = 1000, 3
LLMC_MAGIC = 20240520


def write_llmc(path, tokens):
    """llm.c's layout (its `write_datafile`): header int32[256] = magic, version 1, count."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [LLMC_MAGIC, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def structured_tokens(count):
    """Tokens with structure (so the loss falls): a walk over the vocabulary with repeats."""
    rng = np.random.default_rng(0)
    steps = rng.choice([1, 1, 1, 7, 500], size=count)
    return (np.cumsum(steps) % VOCAB).astype(np.uint16)


class TokenFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        d = cls.d = pathlib.Path(cls.dir.name)
        text = (ROOT / "models" / "gpt2-tiny.toml").read_text()
        cls.model = d / "gpt2-vocab1000.toml"
        cls.model.write_text(text.replace('name = "gpt2-tiny"', 'name = "gpt2-vocab1000"')
                             .replace("vocab = 256", f"vocab = {VOCAB}"))
        cls.spec = tomllib.loads(cls.model.read_text())
        cls.tokens = structured_tokens(20_000)
        cls.raw = d / "train.bin"
        cls.tokens.tofile(cls.raw)
        cls.llmc = d / "train_llmc.bin"
        write_llmc(cls.llmc, cls.tokens)
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config(cls.spec)).float()
        model.save_pretrained(d / "init", safe_serialization=True)
        cls.init = d / "init" / "model.safetensors"
        cls.hf_losses = train(model, cls.spec, cls.tokens.tolist(), STEPS)

    def plan(self, world):
        profile, plan = self.d / f"p{world}.toml", self.d / f"fsdp2-{world}.plan.toml"
        if not plan.exists():
            shardplan("profile", "measure", "--backend", "cpu", "--model", str(self.model),
                      "--world-size", str(world), "--device", "h100-sxm", "--repeats", "1",
                      "--out", str(profile))
            shardplan("baseline", "--profile", str(profile), "--kind", "fsdp2", "--out", str(plan))
        return profile, plan

    def run_on(self, data, world=1, steps=STEPS):
        profile, plan = self.plan(world)
        return launch(world, "run", "--backend", "cpu", "--profile", str(profile), "--plan", str(plan),
                      "--model", str(self.model), "--steps", str(steps), "--data", str(data),
                      "--init-weights", str(self.init), "--json")

    def losses(self, data, world=1):
        out = self.run_on(data, world)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)["losses"]

    def test_both_layouts_train_to_transformers_losses(self):
        raw, llmc = self.losses(self.raw), self.losses(self.llmc)
        self.assertEqual(raw, llmc)
        for ours, theirs in zip(raw, self.hf_losses, strict=True):
            self.assertLess(abs(ours - theirs) / abs(theirs), 1e-4, f"{raw} vs {self.hf_losses}")
        self.assertLess(self.hf_losses[-1], self.hf_losses[0])

    def test_two_ranks_see_the_same_global_batch(self):
        two = self.losses(self.raw, world=2)
        for ours, theirs in zip(two, self.hf_losses, strict=True):
            self.assertLess(abs(ours - theirs) / abs(theirs), 1e-4, f"{two} vs {self.hf_losses}")

    def test_a_token_past_the_vocab_is_named_with_its_position(self):
        bad = self.tokens.copy()
        bad[12_345] = VOCAB
        path = self.d / "bad.bin"
        bad.tofile(path)
        out = self.run_on(path)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("bad.bin", out.stdout + out.stderr)
        self.assertIn(f"token {VOCAB} at position 12345", out.stdout + out.stderr)

    def test_a_file_larger_than_the_run_is_mapped_not_read(self):
        """The run's own peak resident memory (VmHWM, polled while it runs: a forked child's
        rusage would count this Python's memory too) stays below half the file."""
        big = self.d / "big.bin"
        with open(big, "wb") as f:
            for _ in range(10_000):  # 400 MB of uint16 tokens, never held whole here
                self.tokens.tofile(f)
        profile, plan = self.plan(1)
        run = subprocess.Popen(
            [BIN, "run", "--backend", "cpu", "--profile", str(profile), "--plan", str(plan),
             "--model", str(self.model), "--steps", "1", "--data", str(big), "--json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        while run.poll() is None:
            try:
                status = pathlib.Path(f"/proc/{run.pid}/status").read_text()
            except OSError:
                break
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
            time.sleep(0.01)
        self.assertEqual(run.wait(), 0)
        self.assertGreater(peak, 0)
        self.assertLess(peak, big.stat().st_size / 2, f"peak resident {peak} bytes")
        big.unlink()

if __name__ == "__main__":
    unittest.main()
