"""Profile a model's units into a shardplan profile (schema 1).

Per unit (`shardplan_torch.Unit`s, e.g. `shardplan_torch.units(model)`), with hooks on its
compute modules: forward time (the first one's pre-forward hook to the last one's post-forward
hook), backward time (from the last compute module's backward pre-hook to the next unit's in
backward order, the first unit's ending when `backward()` returns), parameter count (the unit's
own, tied ones once), saved-activation bytes (every tensor autograd saves while the unit's
forward runs, parameters excluded, each storage once), checkpointed bytes (the unit's inputs:
what full recompute keeps), forward workspace (the output bytes) and backward workspace (the
gradients of the unit's output and input). A unit that reads another's parameters (GPT-2's head,
the tied `wte`) is recorded with `reads_params_of`. Every parameter must belong to exactly one
unit: a map that leaves one out is refused, naming it. Times are the median of `repeats`
runs after `warmup`; on CUDA they are taken with CUDA events. Collective curves, block size and
world size come from an existing shardplan profile (`shardplan profile analytic` for the target
hardware and run, or one with curves imported from nccl-tests), and with them, unless given, what
that profile says of the run: its micro-batches per step K, its precision (bytes per parameter)
and its node layout (topology).
"""

import statistics
import time
import tomllib

import torch

from .units import check


def _bytes(obj):
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_bytes(o) for o in obj.values())
    return 0


class _Clock:
    """Wall-clock on CPU, CUDA events on GPU (synchronised when read)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.marks = []

    def mark(self, key):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((key, event))
        else:
            self.marks.append((key, time.perf_counter()))

    def times_us(self):
        if self.cuda:
            torch.cuda.synchronize()
            first = self.marks[0][1]
            return {k: first.elapsed_time(e) * 1e3 for k, e in self.marks}
        first = self.marks[0][1]
        return {k: (t - first) * 1e6 for k, t in self.marks}


def _measure(model, units, sample_batch, loss_fn, cuda):
    """One forward and backward with hooks; returns per-unit times and bytes."""
    clock = _Clock(cuda)
    params = {p.data_ptr() for p in model.parameters()}
    names = [u.name for u in units]
    current = [None]
    saved = {n: {} for n in names}
    info = {n: {"in": 0, "out": 0, "grad": 0} for n in names}
    handles = []

    def pack(t):
        if current[0] is not None and t.data_ptr() not in params:
            saved[current[0]][(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
        return t

    for unit in units:
        name, first, last = unit.name, unit.compute[0], unit.compute[-1]

        def pre(mod, args, name=name):
            current[0] = name
            info[name]["in"] = _bytes(args)
            clock.mark(("f0", name))

        def post(mod, args, out, name=name):
            clock.mark(("f1", name))
            info[name]["out"] = _bytes(out)
            current[0] = None

        def bpre(mod, grad_out, name=name):
            info[name]["grad"] = _bytes(grad_out)
            clock.mark(("b0", name))

        handles += [first.register_forward_pre_hook(pre), last.register_forward_hook(post),
                    last.register_full_backward_pre_hook(bpre)]
    try:
        clock.mark(("start", None))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(model, sample_batch)
        loss.backward()
        clock.mark(("end", None))
    finally:
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)
    t = clock.times_us()
    result = {}
    for k, name in enumerate(names):
        backward_end = t[("b0", names[k - 1])] if k > 0 else t[("end", None)]
        result[name] = {
            "forward_us": t[("f1", name)] - t[("f0", name)],
            "backward_us": backward_end - t[("b0", name)],
            "activation_bytes": sum(saved[name].values()),
            "checkpoint_activation_bytes": info[name]["in"],
            "forward_workspace_bytes": info[name]["out"],
            "backward_workspace_bytes": info[name]["grad"] + info[name]["in"],
        }
    return result


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v)} to TOML")


def _curves(table, comm):
    """The TOML lines of the three collective curves of `comm` under `table`."""
    lines = []
    for op in ["all_gather", "reduce_scatter", "all_reduce"]:
        points = [[int(b), float(t)] for b, t in comm[op]["points"]]
        lines += ["", f"[{table}.{op}]", f"points = {_toml_value(points)}"]
    return lines


def profile(model, units, sample_batch, loss_fn, comm_profile, out, *, name="pytorch model",
            micro_batches=None, bytes_per_param=None, warmup=2, repeats=5):
    """Measures `units` (`Unit`s, or (name, module) pairs, in forward order; every parameter of
    `model` in exactly one) of `model` running `loss_fn(model, sample_batch)` (a scalar loss) and
    writes a shardplan profile to `out`.
    Collective curves, block size and world size are taken from the profile at `comm_profile`,
    and its topology (ranks per node, the groups' curves, the communicators' bytes) where it has
    one.
    `micro_batches` is K, the micro-batches per optimizer step `sample_batch` is one of;
    `bytes_per_param` (gathered parameter, gradient, optimizer state) bytes per parameter, the
    precision: (4, 4, 8) fp32, (2, 4, 12) bf16 with fp32 reductions, (2, 2, 12) bf16. Each
    is the comm profile's where not given (K = 1 where it has none)."""
    units = check(model, units)
    with open(comm_profile, "rb") as f:
        base = tomllib.load(f)
    if micro_batches is None:
        micro_batches = int(base.get("micro_batches", 1))
    if bytes_per_param is None:
        given = base["bytes_per_param"]
        bytes_per_param = (given["param"], given["grad"], given["optimizer"])
    cuda = next(model.parameters()).is_cuda
    for _ in range(warmup):
        _measure(model, units, sample_batch, loss_fn, cuda)
    runs = [_measure(model, units, sample_batch, loss_fn, cuda) for _ in range(repeats)]
    lines = [
        "schema = 1",
        f"name = {_toml_value(name)}",
        f"world_size = {base['world_size']}",
        f"micro_batches = {int(micro_batches)}",
        f"block_size_bytes = {base['block_size_bytes']}",
        f"overlap_slowdown = {_toml_value(float(base['overlap_slowdown']))}",
        "iteration_extra_us = 0.0",
        "",
        "[source]",
        'generator = "shardplan_torch"',
        f"comm_from = {_toml_value(str(comm_profile))}",
        f'device = "{"cuda" if cuda else "cpu"}"',
        "",
        "[bytes_per_param]",
        f"param = {bytes_per_param[0]}",
        f"grad = {bytes_per_param[1]}",
        f"optimizer = {bytes_per_param[2]}",
    ]
    for unit in units:
        samples = [r[unit.name] for r in runs]
        median = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        lines += [
            "",
            "[[units]]",
            f"name = {_toml_value(unit.name)}",
            f"params = {sum(p.numel() for p in unit.parameters())}",
            f"forward_us = {_toml_value(max(float(median['forward_us']), 0.0))}",
            f"backward_us = {_toml_value(max(float(median['backward_us']), 0.0))}",
        ]
        for key in ["activation_bytes", "checkpoint_activation_bytes", "forward_workspace_bytes",
                    "backward_workspace_bytes"]:
            lines.append(f"{key} = {int(median[key])}")
        if unit.reads_params_of is not None:
            lines.append(f"reads_params_of = {_toml_value(unit.reads_params_of)}")
    lines += _curves("comm", base["comm"])
    topology = base.get("topology")
    if topology is not None:
        lines += ["", "[topology]", f"gpus_per_node = {int(topology['gpus_per_node'])}",
                  f"communicator_bytes = {int(topology.get('communicator_bytes', 0))}"]
        for group in topology.get("groups", []):
            lines += ["", "[[topology.groups]]", f"ranks = {int(group['ranks'])}",
                      f"link = {_toml_value(group['link'])}"]
            lines += _curves("topology.groups.comm", group["comm"])
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return out
