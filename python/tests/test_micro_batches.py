"""Gradient accumulation through FSDP2 (DESIGN §3.10): a GPT-like model profiled by
shardplan_torch for K = 4 micro-batches, planned by `shardplan` (fsdp2, which reduces and
reshards every micro-batch; fsdp2-nosync, which accumulates unsharded gradients; zero2, which keeps
gathered parameters; the ILP under a tight cap), exported
with `shardplan export fsdp2`, applied with FSDP2 at world size 2 (gloo) and trained two steps of
four micro-batches with `start_micro_batch`; every plan's losses equal unsharded training that
accumulates the same micro-batches (each loss divided by 4)."""

import json
import pathlib
import tempfile
import tomllib
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from shardplan_torch import profile, start_micro_batch
from shardplan_torch.testing import (ROOT, SEQ, VOCAB, TinyGPT, free_port, in_process_group, loss_fn, shardplan,
                                     sharded_tiny_gpt)

MICRO_BATCHES = 4
STEPS = 2
PER_RANK = 2


def micro_batch(step, m, rank, world):
    """Rank `rank`'s sequences of micro-batch `m` of step `step`."""
    g = torch.Generator().manual_seed(1000 * step + m)
    tokens = torch.randint(0, VOCAB, (PER_RANK * world, SEQ + 1), generator=g)
    return tokens[rank * PER_RANK:(rank + 1) * PER_RANK]


def accumulated_run(rank, world, plan_path):
    model = sharded_tiny_gpt(plan_path)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, reduced_early = [], None
    for step in range(STEPS):
        total = 0.0
        for m in range(MICRO_BATCHES):
            start_micro_batch(model, model.units(), plan_path, m)
            loss = loss_fn(model, micro_batch(step, m, rank, world)) / MICRO_BATCHES
            loss.backward()
            if reduced_early is None:
                # After the first backward: a resharded unit's parameters are DTensors again, and
                # they hold a gradient only where it was reduced; a kept unit's stay unsharded.
                reduced_early = [(isinstance(p, DTensor), p.grad is not None) for p in model.parameters()]
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            total += mean.item() / world
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return {"losses": losses, "reduced_early": reduced_early}


def worker(rank, world, plan_path, result_path, port):
    result = in_process_group(rank, world, port, accumulated_run, rank, world, plan_path)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)


def reference():
    """One process, the union of both ranks' micro-batches, the same accumulation."""
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        total = 0.0
        for m in range(MICRO_BATCHES):
            tokens = torch.cat([micro_batch(step, m, r, 2) for r in range(2)])
            loss = loss_fn(model, tokens) / MICRO_BATCHES
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses


class MicroBatches(unittest.TestCase):
    def test_accumulating_plans_train_as_unsharded_accumulation(self):
        expected = reference()
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            comm = d / "comm.toml"
            shardplan("profile", "analytic", "--model", str(ROOT / "models/gpt2-small.toml"), "--device", "h100-sxm",
                      "--world-size", "2", "--block-size", "16KiB", "--micro-batches", str(MICRO_BATCHES),
                      "--out", str(comm))
            prof = d / "tiny.toml"
            torch.manual_seed(0)
            model = TinyGPT()
            # K comes from the comm profile; the precision is the fp32 this test trains in.
            profile(model, model.units(), micro_batch(0, 0, 0, 1), loss_fn, comm, prof, name="tiny gpt x2",
                    bytes_per_param=(4, 4, 8))
            with open(prof, "rb") as f:
                self.assertEqual(tomllib.load(f)["micro_batches"], MICRO_BATCHES, "K carried from the comm profile")
            plans = {}
            for kind in ["fsdp2", "fsdp2-nosync", "zero2"]:
                plans[kind] = d / f"{kind}.plan.toml"
                shardplan("baseline", "--profile", str(prof), "--kind", kind, "--out", str(plans[kind]))
            smallest = json.loads(shardplan("baseline", "--profile", str(prof), "--kind", "fsdp2", "--checkpoint",
                                            "--out", str(d / "s.toml"), "--json"))
            cap = str(int(smallest["peak_memory_bytes"] * 1.2))
            plans["ilp"] = d / "ilp.plan.toml"
            solved = json.loads(shardplan("solve", "--profile", str(prof), "--memory-cap", cap, "--time-limit", "20",
                                          "--out", str(plans["ilp"]), "--json"))
            self.assertIn(solved["status"], ["optimal", "gap_limit", "time_limit"])
            for name, plan in plans.items():
                with self.subTest(plan=name):
                    exported = d / f"{name}.fsdp2.json"
                    # The ILP's cap may be below its FSDP2 settings' peak (DESIGN §3.12): --force.
                    shardplan("export", "fsdp2", "--plan", str(plan), "--profile", str(prof), "--out", str(exported),
                              "--force")
                    units = json.loads(exported.read_text())["units"]
                    if name == "fsdp2-nosync":
                        self.assertFalse(any(u["requires_gradient_sync"] for u in units), units)
                    if name == "zero2":
                        self.assertFalse(any(u["reshard_after_backward"] for u in units), units)
                    result = d / f"{name}.losses.json"
                    mp.spawn(worker, args=(2, str(exported), str(result), free_port()), nprocs=2)
                    run = json.loads(result.read_text())
                    for got, want in zip(run["losses"], expected):
                        self.assertAlmostEqual(got, want, places=4)
                    sharded = [s for s, _ in run["reduced_early"]]
                    reduced = [r for _, r in run["reduced_early"]]
                    if name == "fsdp2":
                        self.assertTrue(all(sharded) and all(reduced), "resharded and reduced every micro-batch")
                    if name == "fsdp2-nosync":
                        self.assertTrue(all(sharded) and not any(reduced), "nothing reduced before the last micro-batch")
                    if name == "zero2":
                        self.assertFalse(any(sharded), "parameters kept unsharded between micro-batches")


if __name__ == "__main__":
    unittest.main()
