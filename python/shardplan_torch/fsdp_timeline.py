"""What FSDP2 holds unsharded at each module boundary, and what it frees and reduces between
them, recorded from its own hooks, to compare with the `fsdp2_timeline` that `shardplan export
fsdp2` predicts (DESIGN §3.12).

`TimelineRecorder(model, units)` on a model sharded by `apply_plan` records, right after FSDP2's
pre-forward of each unit (a forward pre-hook appended after FSDP2's prepended one) and after its
pre-backward (FSDP2's `FSDPState._pre_backward`, which its post-forward registers on the unit's
outputs, wrapped on the state), an entry

    {"at": "F:<unit>" | "B:<unit>", "unsharded": [<unit>, ...], "issued": [<unit>, ...],
     "unsharded_bytes": int, "resharded": [<unit>, ...], "reduced": [<unit>, ...]}

- `unsharded`: the units whose parameters are unsharded or whose all-gather is issued and not
  yet waited for; `issued`: the all-gathers that hook issued, in order (each group's `unshard`,
  wrapped, notes the ones that start a collective). A replicated unit's pending "all-gather" over
  a group of one is no collective (its parameters are copied at its own wait), so it counts as
  neither until then.
- `unsharded_bytes`: the bytes those units hold, read from FSDP2's tensors: an unsharded group's
  unsharded parameters (`FSDPParam._unsharded_param`, in the gathered dtype), an in-flight
  group's all-gather output (`AllGatherResult.all_gather_output`).
- `resharded`, `reduced`: the groups whose unsharded parameters were freed (each group's
  `reshard`, wrapped: the group left the unsharded state) and whose gradients were reduced (each
  group's `post_backward`, wrapped: it queued a reduce-scatter of its own) after this entry's
  hook and before the next entry's, in order.

A tied unit's group (GPT-2's `wte` with `lm_head`, `fully_shard([wte, wpe, lm_head])`) has one
pre-backward, registered on `lm_head`'s output: it is recorded there, before the head's.
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
            group = state._fsdp_param_group
            self._groups.append((unit.name, group))
            self._wrap_unshard(group, unit.name)
            self._wrap_reshard(group, unit.name)
            self._wrap_post_backward(group, unit.name)
            self._handles.append(module.register_forward_pre_hook(self._forward_hook(state, unit.name)))
            self._wrap_pre_backward(state, unit.name)

    def unsharded(self):
        return [(name, group) for name, group in self._groups if group.is_unsharded or _in_flight(group)]

    def _record(self, at):
        # A pre-backward hook fires once per output tensor that needs a gradient: the first counts.
        if self.entries and self.entries[-1]["at"] == at:
            return
        held = self.unsharded()
        self.entries.append({
            "at": at,
            "unsharded": [name for name, _ in held],
            "issued": self._issued,
            "unsharded_bytes": sum(_unsharded_bytes(group) for _, group in held),
            "resharded": [],
            "reduced": [],
        })
        self._issued = []

    def _note(self, kind, name):
        """An event after the latest entry's hook (one before any hook gets an entry of its own,
        which no prediction has)."""
        if not self.entries:
            self.entries.append({"at": "before the first hook", "resharded": [], "reduced": []})
        self.entries[-1][kind].append(name)

    def _wrap_unshard(self, group, name):
        original = group.unshard

        def unshard(*args, **kwargs):
            before = _in_flight(group)
            out = original(*args, **kwargs)
            if not before and _in_flight(group):
                self._issued.append(name)
            return out

        group.unshard = unshard

    def _wrap_reshard(self, group, name):
        original = group.reshard

        def reshard(*args, **kwargs):
            before = group.is_unsharded
            out = original(*args, **kwargs)
            if before and not group.is_unsharded:
                self._note("resharded", name)
            return out

        group.reshard = reshard

    def _wrap_post_backward(self, group, name):
        original = group.post_backward

        def post_backward(*args, **kwargs):
            states = group.comm_ctx.reduce_scatter_states
            latest = states[-1] if states else None
            out = original(*args, **kwargs)
            if states and states[-1] is not latest and states[-1].param_group is group:
                self._note("reduced", name)
            return out

        group.post_backward = post_backward

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


def _unsharded_bytes(group):
    """The bytes of the group's unsharded parameters, or of its all-gather output in flight."""
    if _in_flight(group):
        output = group._all_gather_result.all_gather_output
        return output.numel() * output.element_size()
    return sum(p._unsharded_param.numel() * p._unsharded_param.element_size() for p in group.fsdp_params)
