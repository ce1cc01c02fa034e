"""Hierarchical sharding through FSDP2 (DESIGN §3.11): a GPT-like model profiled by
shardplan_torch for 4 ranks declared as 2 nodes of 2, planned by `shardplan` (hsdp: every block
sharded over its node and replicated across the two; hpz: fsdp over the world, each block
keeping a node-local secondary shard after its forward; and the ILP), exported with
`shardplan export fsdp2`, applied with FSDP2 at world size 4 (gloo: a 2-D (2, 2) mesh for HSDP,
`reshard_after_forward=2` for hpZ) and trained three steps; every plan's losses equal unsharded
training on the union of the four ranks' batches."""

import json
import pathlib
import tempfile
import unittest

import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from shardplan_torch.testing import (SEQ, VOCAB, TinyGPT, free_port, in_process_group, shardplan, sharded_tiny_gpt,
                                     tiny_profile, train_tiny_gpt)

WORLD, NODE, STEPS, PER_RANK = 4, 2, 3, 2


def step_batch(step, rank):
    """Rank `rank`'s sequences of step `step`."""
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (PER_RANK * WORLD, SEQ + 1), generator=g)
    return tokens[rank * PER_RANK:(rank + 1) * PER_RANK]


def sharded_run(rank, plan_path):
    model = sharded_tiny_gpt(plan_path)
    meshes = sorted({p.device_mesh.ndim for p in model.parameters() if isinstance(p, DTensor)})
    losses = train_tiny_gpt(model, (step_batch(step, rank) for step in range(STEPS)))
    return {"losses": losses, "mesh_dims": meshes}


def worker(rank, world, plan_path, result_path, port):
    result = in_process_group(rank, world, port, sharded_run, rank, plan_path)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)


def reference():
    """One process, the union of the four ranks' sequences."""
    torch.manual_seed(0)
    batches = (torch.cat([step_batch(step, r) for r in range(WORLD)]) for step in range(STEPS))
    return train_tiny_gpt(TinyGPT(), batches)


class Hierarchical(unittest.TestCase):
    def test_hsdp_hpz_and_ilp_plans_train_as_unsharded(self):
        expected = reference()
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            prof = d / "tiny.toml"
            tiny_profile(d, step_batch(0, 0), prof, name="tiny gpt 2x2", world=WORLD, gpus_per_node=NODE)
            plans = {}
            for kind in ["hsdp", "hpz"]:
                plans[kind] = d / f"{kind}.plan.toml"
                shardplan("baseline", "--profile", str(prof), "--kind", kind, "--out", str(plans[kind]))
            plans["ilp"] = d / "ilp.plan.toml"
            shardplan("solve", "--profile", str(prof), "--memory-cap", "unlimited", "--time-limit", "20",
                      "--out", str(plans["ilp"]))
            for name, plan in plans.items():
                with self.subTest(plan=name):
                    exported = d / f"{name}.fsdp2.json"
                    shardplan("export", "fsdp2", "--plan", str(plan), "--profile", str(prof), "--out", str(exported))
                    units = json.loads(exported.read_text())["units"]
                    if name == "hsdp":
                        self.assertTrue(any(u["shard_group"] == NODE for u in units), units)
                    if name == "hpz":
                        self.assertTrue(any(u["secondary_group"] == NODE for u in units), units)
                    result = d / f"{name}.losses.json"
                    mp.spawn(worker, args=(WORLD, str(exported), str(result), free_port()), nprocs=WORLD)
                    run = json.loads(result.read_text())
                    for got, want in zip(run["losses"], expected):
                        self.assertAlmostEqual(got, want, places=4)
                    if name == "hsdp":
                        self.assertIn(2, run["mesh_dims"], "HSDP units hold 2-D (replicate, shard) DTensors")


if __name__ == "__main__":
    unittest.main()
