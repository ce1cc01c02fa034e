"""Round trip on CPU: a GPT-like model (no Hugging Face) is profiled by shardplan_torch, solved
by `shardplan solve` at 1% above the smallest feasible cap, exported with `shardplan export fsdp2`, applied with
FSDP2 at world size 2 (gloo), and trained a step; the loss equals unsharded training's."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import tomllib
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from shardplan_torch import apply_plan, profile  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("SHARDPLAN_BIN", str(ROOT / "target" / "release" / "shardplan"))
VOCAB, DIM, SEQ, BATCH = 64, 32, 16, 4


class Block(torch.nn.Module):
    """Pre-norm attention (causal, one head) and MLP."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.mlp(self.ln2(x))


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.out = torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.out(self.ln(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, blocks=3):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.head = Head()

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def units(self):
        return [("embedding", self.embedding)] + [(f"block.{k + 1}", b) for k, b in enumerate(self.blocks)] + [("head", self.head)]


def loss_fn(model, tokens):
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def batch(rank, world):
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, VOCAB, (BATCH * world, SEQ + 1), generator=g)
    return tokens[rank * BATCH:(rank + 1) * BATCH]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shardplan(*args):
    out = subprocess.run([BIN, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"shardplan {' '.join(args)} failed: {out.stderr}")
    return out.stdout


def worker(rank, world, plan_path, result_path, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = TinyGPT()
    apply_plan(model, model.units(), plan_path)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(2):
        loss = loss_fn(model, batch(rank, world))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


class RoundTrip(unittest.TestCase):
    def test_profile_solve_export_apply_train(self):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            comm = d / "comm.toml"
            shardplan("profile", "analytic", "--model", str(ROOT / "models/gpt2-small.toml"), "--device", "h100-sxm",
                      "--world-size", "2", "--block-size", "16KiB", "--out", str(comm))
            torch.manual_seed(0)
            model = TinyGPT()
            prof = d / "tiny.toml"
            profile(model, model.units(), batch(0, 1), loss_fn, comm, prof, name="tiny gpt x2")
            with open(prof, "rb") as f:
                units = tomllib.load(f)["units"]
            self.assertEqual([u["name"] for u in units], [n for n, _ in model.units()])
            self.assertTrue(all(u["forward_us"] > 0 and u["backward_us"] > 0 for u in units[1:]), units)
            self.assertTrue(all(u["activation_bytes"] > 0 for u in units), units)
            smallest = json.loads(shardplan("solve", "--profile", str(prof), "--objective", "memory", "--out", str(d / "m.toml"), "--json"))
            cap = str(int(smallest["peak_memory_bytes"] * 1.01))
            plan = d / "tiny.plan.toml"
            solved = json.loads(shardplan("solve", "--profile", str(prof), "--memory-cap", cap, "--out", str(plan), "--json"))
            self.assertIn(solved["status"], ["optimal", "gap_limit"])
            exported = d / "tiny.fsdp2.json"
            shardplan("export", "fsdp2", "--plan", str(plan), "--profile", str(prof), "--out", str(exported))
            levels = [u["level"] for u in json.loads(exported.read_text())["units"]]
            self.assertIn("fsdp", levels, f"a tight cap shards some unit fully: {levels}")
            result = d / "losses.json"
            mp.spawn(worker, args=(2, str(exported), str(result), free_port()), nprocs=2)
            sharded = json.loads(result.read_text())
            # Unsharded reference: one process on the union of both ranks' batches.
            torch.manual_seed(0)
            reference = TinyGPT()
            optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
            expected = []
            for _ in range(2):
                loss = loss_fn(reference, torch.cat([batch(0, 2), batch(1, 2)]))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                expected.append(loss.item())
            for got, want in zip(sharded, expected):
                self.assertAlmostEqual(got, want, places=4)


if __name__ == "__main__":
    unittest.main()
