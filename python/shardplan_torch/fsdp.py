"""Apply a plan exported by `shardplan export fsdp2` with FSDP2's `fully_shard`.

Per unit (a `shardplan_torch.Unit`: its modules are one FSDP group, so tied parameters share
one): `fsdp` → `fully_shard(modules, reshard_after_forward=True)`; `sdp` → the same with False;
`none` → `fully_shard` over a (world, 1) mesh, i.e. HSDP with shard groups of one: full
parameters on every rank and gradients all-reduced, which is DDP for that unit; recompute →
activation checkpointing of each of the unit's compute modules (composable `checkpoint`, applied
before sharding). The model itself is then wrapped as the root, and each unit's forward and
backward prefetch lists are set from the plan's gather slots, each unit named by its group's
FSDP module. FSDP2 gathers a unit whole and reduces right after its backward; the export lists
what that rounds (`approximations`).
"""

import json

import torch.distributed as dist
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from .units import check


def apply_plan(model, units, plan):
    """Shards `model` in place per `plan` (a path to the exported JSON, or its dict); `units` is
    the unit map the profile was made with (`shardplan_torch.units(model)`, `Unit`s, or
    (name, module) pairs). The plan, the process group and the units are checked before anything
    is sharded. Returns the model."""
    if not isinstance(plan, dict):
        with open(plan) as f:
            plan = json.load(f)
    world = dist.get_world_size()
    if plan["world_size"] != world:
        raise ValueError(f"the plan is for {plan['world_size']} ranks, this process group has {world}")
    units = check(model, units)
    planned = [u["name"] for u in plan["units"]]
    if planned != [u.name for u in units]:
        raise ValueError(f"the plan's units {planned} differ from the model's {[u.name for u in units]}")
    by_name = {u.name: u for u in units}
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    shard_mesh = init_device_mesh(device, (world,))
    replicate_mesh = init_device_mesh(device, (world, 1), mesh_dim_names=("replicate", "shard"))
    for u in plan["units"]:
        unit = by_name[u["name"]]
        if u["recompute"]:
            for module in unit.compute:
                checkpoint(module)
        group = unit.modules if len(unit.modules) > 1 else unit.modules[0]
        if u["sharded"]:
            fully_shard(group, mesh=shard_mesh, reshard_after_forward=u["reshard_after_forward"])
        else:
            fully_shard(group, mesh=replicate_mesh)
    fully_shard(model, mesh=shard_mesh)
    fsdp_module = {name: unit.modules[0] for name, unit in by_name.items()}
    for u in plan["units"]:
        module = fsdp_module[u["name"]]
        if u["forward_prefetch"]:
            module.set_modules_to_forward_prefetch([fsdp_module[n] for n in u["forward_prefetch"]])
        if u["backward_prefetch"]:
            module.set_modules_to_backward_prefetch([fsdp_module[n] for n in u["backward_prefetch"]])
    return model
