"""The body of scripts/bench-torch-cpu (see there)."""

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import GPT2LMHeadModel

from shardplan_torch.gpt2 import adamw, config as gpt2_config

from benchlib import ROOT, prepare, shardplan, training_text, write_section


def batch(data, seq, rows):
    """`rows` consecutive sequences of `seq` tokens and their targets (what `--data` feeds)."""
    x = torch.tensor([list(data[r * seq:(r + 1) * seq]) for r in rows])
    y = torch.tensor([list(data[r * seq + 1:(r + 1) * seq + 1]) for r in rows])
    return x, y


def train(model, spec, steps, rank=0, world=1):
    """AdamW steps on this rank's share of each global batch; the step times in µs."""
    t = spec["training"]
    opt = adamw(model, t)
    data = training_text()
    seq, global_batch = spec["seq_len"], t["batch_size"]
    windows = (len(data) - 1) // seq
    per_rank = global_batch // world
    times = []
    for k in range(steps):
        first = k * global_batch + rank * per_rank
        x, y = batch(data, seq, [(first + j) % windows for j in range(per_rank)])
        start = time.perf_counter()
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def distributed(rank, world, spec, steps, kind, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = GPT2LMHeadModel(gpt2_config(spec))
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    times = train(model, spec, steps, rank, world)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def torch_runs(spec, steps, work):
    """(label, threads per process, step times) of each PyTorch run."""
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        torch.manual_seed(1)
        runs.append((f"PyTorch eager, 1 process, {threads} thread(s)", train(GPT2LMHeadModel(gpt2_config(spec)), spec, steps)))
    for port, kind in ((29611, "ddp"), (29612, "fsdp2")):
        out = work / f"{kind}.json"
        try:
            mp.spawn(distributed, args=(2, spec, steps, kind, port, str(out)), nprocs=2, join=True)
            runs.append((f"PyTorch {kind.upper()} (gloo), 2 processes × 1 thread", json.loads(out.read_text())))
        except Exception as error:  # a kind PyTorch cannot run on CPU is reported, not fatal
            runs.append((f"PyTorch {kind.upper()} (gloo), 2 processes: failed: {str(error).splitlines()[0]}", None))
    return runs


def shardplan_runs(model, steps, work):
    data = work / "data.txt"
    data.write_bytes(training_text())
    runs = []
    for world, kind in ((1, "ddp"), (2, "ddp"), (2, "fsdp2")):
        profile = work / f"n{world}.profile.toml"
        if not profile.exists():
            shardplan(["profile", "measure", "--backend", "cpu", "--model", model, "--world-size", world,
                       "--max-message", "4MiB", "--repeats", 3, "--out", profile], world=world)
        plan = work / f"{kind}-{world}.plan.toml"
        shardplan(["baseline", "--profile", profile, "--kind", kind, "--out", plan])
        report = json.loads(shardplan(["run", "--backend", "cpu", "--profile", profile, "--plan", plan,
                                       "--model", model, "--steps", steps, "--data", data, "--json"], world=world))
        runs.append((f"shardplan {kind}, {world} rank(s) × (compute + communication thread)", report["step_us"]))
    return runs


def main():
    parser = argparse.ArgumentParser(description="shardplan against PyTorch on the CPU")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", default="gpt2-tiny")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "runtime-results.md")
    args = parser.parse_args()
    prepare()
    model = ROOT / "models" / f"{args.model}.toml"
    spec = tomllib.loads(model.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs = torch_runs(spec, args.steps, work) + shardplan_runs(model, args.steps, work)
    eager = statistics.median(runs[0][1][1:])
    lines = [
        f"### {args.model} on this CPU against PyTorch {torch.__version__}, {datetime.date.today()} ({os.cpu_count()} cores)",
        "",
        f"`scripts/bench-torch-cpu --steps {args.steps} --model {args.model}`: global batch "
        f"{spec['training']['batch_size']} × {spec['seq_len']} tokens, AdamW; median of steps 2–{args.steps}.",
        "",
        "| run | step (ms) | against PyTorch eager, 1 thread |",
        "|---|---|---|",
    ]
    for label, times in runs:
        if times is None:
            lines.append(f"| {label} | – | – |")
            continue
        median = statistics.median(times[1:])
        lines.append(f"| {label} | {median / 1e3:.2f} | {median / eager:.2f}× |")
    text = "\n".join(lines)
    write_section(args.out, f"torch-cpu-{args.model}", text)
    print(text)


if __name__ == "__main__":
    main()
