"""What FSDP2 holds unsharded at each module boundary, recorded from its own hooks, to compare
with the `fsdp2_timeline` that `shardplan export fsdp2` predicts (DESIGN §3.12).

`TimelineRecorder(model, units)` on a model sharded by `apply_plan` records, right after FSDP2's
pre-forward of each unit (a forward pre-hook appended after FSDP2's prepended one) and after its
pre-backward (FSDP2's `FSDPState._pre_backward`, which its post-forward registers on the unit's
outputs, wrapped on the state), `{"at": "F:<unit>" | "B:<unit>", "unsharded": [<unit>, ...],
"issued": [<unit>, ...]}`: the units whose parameters are unsharded or whose all-gather is issued
and not yet waited for, and the all-gathers that hook issued, in order (each group's `unshard`,
wrapped, notes the ones that start a collective). A replicated unit's pending "all-gather" over a
group of one is no collective (its parameters are copied at its own wait), so it counts as
neither until then.
"""

import torch

from .units import check


class TimelineRecorder:
    def __init__(self, model, units):
        self.entries = []
        self._groups = []
        self._handles = []
        self._issued = []
        for unit in check(model, units):
            module = unit.modules[0]
            state = module._get_fsdp_state()
            self._groups.append((unit.name, state._fsdp_param_group))
            self._wrap_unshard(state._fsdp_param_group, unit.name)
            self._handles.append(module.register_forward_pre_hook(self._forward_hook(state, unit.name)))
            self._wrap_pre_backward(state, unit.name)

    def unsharded(self):
        return [name for name, group in self._groups if group.is_unsharded or _in_flight(group)]

    def _record(self, at):
        # A pre-backward hook fires once per output tensor that needs a gradient: the first counts.
        if self.entries and self.entries[-1]["at"] == at:
            return
        self.entries.append({"at": at, "unsharded": self.unsharded(), "issued": self._issued})
        self._issued = []

    def _wrap_unshard(self, group, name):
        original = group.unshard

        def unshard(*args, **kwargs):
            before = _in_flight(group)
            out = original(*args, **kwargs)
            if not before and _in_flight(group):
                self._issued.append(name)
            return out

        group.unshard = unshard

    def _forward_hook(self, state, name):
        def hook(module, args):
            # A checkpointed unit's forward runs again inside its backward: not a boundary.
            if torch.is_grad_enabled() and state._training_state.name != "PRE_BACKWARD":
                self._record(f"F:{name}")

        return hook

    def _wrap_pre_backward(self, state, name):
        original = state._pre_backward

        def pre_backward(grad):
            out = original(grad)
            self._record(f"B:{name}")
            return out

        state._pre_backward = pre_backward


def _in_flight(group):
    """Whether the group's all-gather collective is issued and not yet waited for."""
    pending = group._all_gather_result
    return pending is not None and len(pending.all_gather_input_split_sizes) > 0
