"""PyTorch side of shardplan: measure a model's units into a shardplan profile, and apply a
plan exported with `shardplan export fsdp2` to a model with FSDP2's `fully_shard`."""

from .fsdp import apply_plan
from .profiler import profile

__all__ = ["apply_plan", "profile"]
