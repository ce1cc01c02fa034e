"""PyTorch side of shardplan: map a model's modules onto shardplan's units, measure them into a
shardplan profile, and apply a plan exported with `shardplan export fsdp2` with FSDP2's
`fully_shard`."""

from .fsdp import apply_plan, start_micro_batch
from .profiler import profile
from .units import Unit, units
from .units import check as check_units

__all__ = ["Unit", "apply_plan", "check_units", "profile", "start_micro_batch", "units"]
