"""Hierarchical sharding with gradient accumulation through FSDP2 (DESIGN §3.11.1): TinyGPT
profiled for 4 ranks declared as 2 nodes of 2 and K = 2 micro-batches, planned by `shardplan`
(hsdp: reduce-scatter and replica all-reduce every micro-batch; hsdp-ra-once: reduce-scatter every
micro-batch, the replica all-reduce once, `set_requires_all_reduce(False)` on the first;
hsdp-nosync and hpz-nosync: unsharded gradients accumulated, `set_requires_gradient_sync(False)`
on the first), exported with `shardplan export fsdp2`, applied with FSDP2 at world size 4 (gloo)
and trained two steps of two micro-batches with `start_micro_batch`; every plan's losses equal
unsharded training that accumulates the same micro-batches (each loss divided by 2)."""

import json
import pathlib
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardplan_torch import start_micro_batch
from shardplan_torch.testing import (SEQ, VOCAB, TinyGPT, free_port, in_process_group, loss_fn, shardplan,
                                     sharded_tiny_gpt, tiny_profile)

WORLD, NODE, MICRO_BATCHES, STEPS, PER_RANK = 4, 2, 2, 2, 2


def micro_batch(step, m, rank):
    """Rank `rank`'s sequences of micro-batch `m` of step `step`."""
    g = torch.Generator().manual_seed(700 + 10 * step + m)
    tokens = torch.randint(0, VOCAB, (PER_RANK * WORLD, SEQ + 1), generator=g)
    return tokens[rank * PER_RANK:(rank + 1) * PER_RANK]


def accumulated_run(rank, plan_path):
    model = sharded_tiny_gpt(plan_path)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        total = 0.0
        for m in range(MICRO_BATCHES):
            start_micro_batch(model, model.units(), plan_path, m)
            loss = loss_fn(model, micro_batch(step, m, rank)) / MICRO_BATCHES
            loss.backward()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            total += mean.item() / WORLD
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return {"losses": losses}


def worker(rank, world, plan_path, result_path, port):
    result = in_process_group(rank, world, port, accumulated_run, rank, plan_path)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)


def reference():
    """One process, the union of the four ranks' micro-batches, the same accumulation."""
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        total = 0.0
        for m in range(MICRO_BATCHES):
            tokens = torch.cat([micro_batch(step, m, r) for r in range(WORLD)])
            loss = loss_fn(model, tokens) / MICRO_BATCHES
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses


class HierarchicalMicroBatches(unittest.TestCase):
    def test_hierarchical_accumulating_plans_train_as_unsharded_accumulation(self):
        expected = reference()
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            prof = d / "tiny.toml"
            tiny_profile(d, micro_batch(0, 0, 0), prof, name="tiny gpt 2x2 k2", world=WORLD, gpus_per_node=NODE,
                         micro_batches=MICRO_BATCHES)
            for kind in ["hsdp", "hsdp-ra-once", "hsdp-nosync", "hpz-nosync"]:
                with self.subTest(plan=kind):
                    plan = d / f"{kind}.plan.toml"
                    shardplan("baseline", "--profile", str(prof), "--kind", kind, "--out", str(plan))
                    exported = d / f"{kind}.fsdp2.json"
                    shardplan("export", "fsdp2", "--plan", str(plan), "--profile", str(prof), "--out", str(exported))
                    export = json.loads(exported.read_text())
                    self.assertTrue(export["exact"], export["approximations"])
                    units = export["units"]
                    if kind.startswith("hsdp"):
                        self.assertTrue(any(u["shard_group"] == NODE for u in units), units)
                    if kind == "hsdp-ra-once":
                        self.assertFalse(all(u["requires_all_reduce"] for u in units), units)
                    if kind.endswith("-nosync"):
                        self.assertFalse(any(u["requires_gradient_sync"] for u in units), units)
                    result = d / f"{kind}.losses.json"
                    mp.spawn(worker, args=(WORLD, str(exported), str(result), free_port()), nprocs=WORLD)
                    run = json.loads(result.read_text())
                    self.assertEqual(len(run["losses"]), STEPS)
                    for got, want in zip(run["losses"], expected):
                        self.assertAlmostEqual(got, want, places=4)


if __name__ == "__main__":
    unittest.main()
