"""Apply a plan exported by `shardplan export fsdp2` with FSDP2's `fully_shard`.

Per unit (a `shardplan_torch.Unit`: its modules are one FSDP group, so tied parameters share
one): `fsdp` → `fully_shard(modules, reshard_after_forward=True)`; `sdp` → the same with False;
`none` → `fully_shard` over a (world, 1) mesh, i.e. HSDP with shard groups of one: full
parameters on every rank and gradients all-reduced, which is DDP for that unit; recompute →
activation checkpointing of each of the unit's compute modules (composable `checkpoint`, applied
before sharding), with a transformers model's key/value cache switched off. On nodes (DESIGN
§3.11) a unit with a `shard_group` S is sharded over the 2-D
(world/S, S) replicate × shard mesh (HSDP: shard groups of S consecutive ranks, replicated across
them), and one with a `secondary_group` H reshards after forward to H ranks
(`reshard_after_forward=H`, hpZ). The model itself is then wrapped as the root, and each unit's forward and
backward prefetch lists are set from the plan's gather slots, each unit named by its group's
FSDP module. FSDP2 gathers a unit whole and reduces right after its backward; the export lists
what that rounds (`approximations`).

A plan made for a bf16 profile (2 bytes per gathered parameter, DESIGN §6.9) carries
`mixed_precision`: every `fully_shard` gets FSDP2's `MixedPrecisionPolicy(param_dtype,
reduce_dtype)` from it (the sharded parameters, the optimizer's, stay float32).

A unit the plan offloads (DESIGN §3.13) carries `offload_policy`: its `fully_shard` gets FSDP2's
`CPUOffloadPolicy(pin_memory=...)`, its sharded parameters, gradients and optimizer state on the
host and `optimizer.step()` there after the backward (pinned memory needs a GPU, so under gloo
the policy is not pinned).

With several micro-batches per step (`micro_batches` in the export), call `start_micro_batch`
before each: a unit that accumulates skips gradient sync, and a unit that keeps its parameters
skips resharding after backward, on every micro-batch but the last.
"""

import json

import torch.distributed as dist
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import init_device_mesh
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from .units import check


def _load(plan):
    if isinstance(plan, dict):
        return plan
    with open(plan) as f:
        return json.load(f)


def apply_plan(model, units, plan):
    """Shards `model` in place per `plan` (a path to the exported JSON, or its dict); `units` is
    the unit map the profile was made with (`shardplan_torch.units(model)`, `Unit`s, or
    (name, module) pairs). The plan, the process group and the units are checked before anything
    is sharded. Returns the model."""
    plan = _load(plan)
    world = dist.get_world_size()
    if plan["world_size"] != world:
        raise ValueError(f"the plan is for {plan['world_size']} ranks, this process group has {world}")
    units = check(model, units)
    planned = [u["name"] for u in plan["units"]]
    if planned != [u.name for u in units]:
        raise ValueError(f"the plan's units {planned} differ from the model's {[u.name for u in units]}")
    by_name = {u.name: u for u in units}
    if any(u["recompute"] for u in plan["units"]):
        _no_cache_in_training(model)
    precision = plan.get("mixed_precision")
    policy = MixedPrecisionPolicy()
    if precision is not None:
        policy = MixedPrecisionPolicy(
            param_dtype=getattr(torch, precision["param_dtype"]),
            reduce_dtype=getattr(torch, precision["reduce_dtype"]),
        )
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    shard_mesh = init_device_mesh(device, (world,))
    replicate_mesh = init_device_mesh(device, (world, 1), mesh_dim_names=("replicate", "shard"))
    hsdp_meshes = {}
    for u in plan["units"]:
        unit = by_name[u["name"]]
        if u["recompute"]:
            for module in unit.compute:
                checkpoint(module)
        group = unit.modules if len(unit.modules) > 1 else unit.modules[0]
        s = u.get("shard_group")
        if s is not None and s not in hsdp_meshes:
            hsdp_meshes[s] = init_device_mesh(device, (world // s, s), mesh_dim_names=("replicate", "shard"))
        if u["sharded"]:
            reshard = u.get("secondary_group") or u["reshard_after_forward"]
            mesh = shard_mesh if s is None else hsdp_meshes[s]
            fully_shard(group, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy,
                        offload_policy=_offload_policy(u.get("offload_policy"), device))
        else:
            fully_shard(group, mesh=replicate_mesh, mp_policy=policy)
    fully_shard(model, mesh=shard_mesh, mp_policy=policy)
    fsdp_module = {name: unit.modules[0] for name, unit in by_name.items()}
    for u in plan["units"]:
        module = fsdp_module[u["name"]]
        if u["forward_prefetch"]:
            module.set_modules_to_forward_prefetch([fsdp_module[n] for n in u["forward_prefetch"]])
        if u["backward_prefetch"]:
            module.set_modules_to_backward_prefetch([fsdp_module[n] for n in u["backward_prefetch"]])
    return model


def _offload_policy(exported, device):
    """FSDP2's offload policy of a unit's exported `offload_policy` (None: none); pinned only
    where there is a GPU to pin for."""
    if exported is None:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=exported["pin_memory"] and device == "cuda")


def _no_cache_in_training(model):
    """Switches off a transformers model's key/value cache (`config.use_cache`), which it keeps in
    training by default: a recomputed block runs its forward a second time and would append its
    keys and values to the cache again (a sliding window's cache then no longer matches its
    mask). transformers' own gradient checkpointing does the same."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        config.use_cache = False


def start_micro_batch(model, units, plan, index):
    """Sets FSDP2's switches for micro-batch `index` (0-based) of a step of the plan's
    `micro_batches` on `model` sharded by `apply_plan`: a unit whose gradients accumulate
    (`requires_gradient_sync` false) reduces only in the last micro-batch, a unit that keeps its
    parameters (`reshard_after_backward` false) reshards only after the last backward, and an
    HSDP unit whose replica all-reduce runs once (`requires_all_reduce` false) reduce-scatters
    every micro-batch and all-reduces only in the last."""
    plan = _load(plan)
    count = plan.get("micro_batches", 1)
    if not 0 <= index < count:
        raise ValueError(f"micro-batch {index} of a step of {count}")
    last = index + 1 == count
    by_name = {u.name: u for u in check(model, units)}
    for u in plan["units"]:
        module = by_name[u["name"]].modules[0]
        module.set_requires_gradient_sync(last or u["requires_gradient_sync"], recurse=False)
        module.set_reshard_after_backward(last or u["reshard_after_backward"], recurse=False)
        if not u.get("requires_all_reduce", True):
            module.set_requires_all_reduce(last, recurse=False)
