"""Apply a plan exported by `shardplan export fsdp2` with FSDP2's `fully_shard`.

Per unit: `fsdp` → `fully_shard(unit, reshard_after_forward=True)`; `sdp` → the same with False;
`none` → `fully_shard` over a (world, 1) mesh, i.e. HSDP with shard groups of one: full
parameters on every rank and gradients all-reduced, which is DDP for that unit; recompute →
activation checkpointing of the unit (composable `checkpoint`, applied before sharding). The
model itself is then wrapped as the root, and each unit's forward and backward prefetch lists are
set from the plan's gather slots. FSDP2 gathers a unit whole and reduces right after its
backward; the export lists what that rounds (`approximations`).
"""

import json

import torch.distributed as dist
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def apply_plan(model, units, plan):
    """Shards `model` in place per `plan` (a path to the exported JSON, or its dict); `units` is
    the list of (name, module) the profile was made with. Returns the model."""
    if not isinstance(plan, dict):
        with open(plan) as f:
            plan = json.load(f)
    world = dist.get_world_size()
    if plan["world_size"] != world:
        raise ValueError(f"the plan is for {plan['world_size']} ranks, this process group has {world}")
    modules = dict(units)
    planned = [u["name"] for u in plan["units"]]
    if planned != [n for n, _ in units]:
        raise ValueError(f"the plan's units {planned} differ from the model's {[n for n, _ in units]}")
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    shard_mesh = init_device_mesh(device, (world,))
    replicate_mesh = init_device_mesh(device, (world, 1), mesh_dim_names=("replicate", "shard"))
    for u in plan["units"]:
        module = modules[u["name"]]
        if u["recompute"]:
            checkpoint(module)
        if u["sharded"]:
            fully_shard(module, mesh=shard_mesh, reshard_after_forward=u["reshard_after_forward"])
        else:
            fully_shard(module, mesh=replicate_mesh)
    fully_shard(model, mesh=shard_mesh)
    for u in plan["units"]:
        module = modules[u["name"]]
        if u["forward_prefetch"]:
            module.set_modules_to_forward_prefetch([modules[n] for n in u["forward_prefetch"]])
        if u["backward_prefetch"]:
            module.set_modules_to_backward_prefetch([modules[n] for n in u["backward_prefetch"]])
    return model

