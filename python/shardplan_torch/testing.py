"""What the package's tests and examples share: a GPT-like model small enough for the CPU (no
Hugging Face): token embedding, pre-norm blocks (causal one-head attention and MLP) and a head,
as shardplan units `embedding`, `block.1..L`, `head`; its loss and a deterministic batch per
rank; the `shardplan` binary run as a command (`SHARDPLAN_BIN`, else the repository's release
build), alone or under mpirun, a free port for a process group, and a spawned rank's run inside
a gloo group that it leaves with none of the group's threads left running."""

import os
import pathlib
import socket
import subprocess

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("SHARDPLAN_BIN", str(ROOT / "target" / "release" / "shardplan"))


def free_port():
    """A TCP port on 127.0.0.1 nothing listens on now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, *args):
    """Runs the binary with `args`, under `mpirun -np world` when world > 1; the finished
    process (its code, stdout and stderr as text)."""
    cmd = [BIN, *args]
    if world > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world), *cmd]
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def shardplan(*args):
    """Runs the binary with `args`; its stdout, or an AssertionError with its stderr."""
    out = subprocess.run([BIN, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"shardplan {' '.join(args)} failed: {out.stderr}")
    return out.stdout

VOCAB, DIM, SEQ, BATCH = 64, 32, 16, 4


class Block(torch.nn.Module):
    """Pre-norm attention (causal, one head) and MLP."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.mlp(self.ln2(x))


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.out = torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.out(self.ln(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, blocks=3):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.head = Head()

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def units(self):
        return [("embedding", self.embedding)] + [(f"block.{k + 1}", b) for k, b in enumerate(self.blocks)] + [("head", self.head)]


def loss_fn(model, tokens):
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def batch(rank, world):
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, VOCAB, (BATCH * world, SEQ + 1), generator=g)
    return tokens[rank * BATCH:(rank + 1) * BATCH]


def tiny_profile(directory, tokens, out, name="tiny gpt x2", world=2, gpus_per_node=None,
                 bytes_per_param=(4, 4, 8), micro_batches=1):
    """Profiles a fresh TinyGPT (seed 0) on `tokens` into `out` for `world` ranks (on nodes of
    `gpus_per_node`, where given) and `micro_batches` a step, with the collective curves of the
    catalog's H100s (16 KiB blocks) and `bytes_per_param` (gathered parameter, gradient, optimizer
    state); returns the model."""
    from .profiler import profile

    comm = pathlib.Path(directory) / "comm.toml"
    nodes = [] if gpus_per_node is None else ["--gpus-per-node", str(gpus_per_node)]
    shardplan("profile", "analytic", "--model", str(ROOT / "models/gpt2-small.toml"), "--device", "h100-sxm",
              "--world-size", str(world), "--block-size", "16KiB", "--micro-batches", str(micro_batches), *nodes,
              "--out", str(comm))
    torch.manual_seed(0)
    model = TinyGPT()
    profile(model, model.units(), tokens, loss_fn, comm, out, name=name, bytes_per_param=bytes_per_param)
    return model


def train_tiny_gpt(model, batches):
    """One Adam step (lr 1e-2) of `model` per batch of `batches`; each step's loss, averaged over
    the ranks where a process group is up (a sharded model trains each rank's share of a batch),
    else the loss itself (the unsharded reference, on the union of the shares)."""
    import torch.distributed as dist

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for tokens in batches:
        loss = loss_fn(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if dist.is_initialized():
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / dist.get_world_size())
        else:
            losses.append(loss.item())
    return losses


def sharded_tiny_gpt(plan):
    """A fresh TinyGPT (seed 0) sharded by the exported `plan` over the process group."""
    from .fsdp import apply_plan

    torch.manual_seed(0)
    model = TinyGPT()
    apply_plan(model, model.units(), plan)
    return model


def in_process_group(rank, world, port, body, *args):
    """In a spawned process: joins a gloo group of `world` on 127.0.0.1:`port` as `rank`, runs
    `body(*args)` and returns what it returns, after leaving the group: every rank waits for the
    others, the groups are destroyed and their gloo threads joined, while the interpreter is
    whole.

    A sharded model's meshes keep their process groups (`DeviceMesh._pg_registry`) past
    `destroy_process_group`, and a mesh outlives the model that used it (DTensor's sharding
    specs hold it), so without this every group's gloo threads (two `pt_gloo_runloop` per group
    and the `gloo_tcp_loop`s: 8 in a rank of a ddp plan) were still running when the interpreter
    finalized and the process exited, torn down by whichever finalizer or exit handler reached
    them first, while the peer rank, not waited for, was already closing its connections; a
    rank then aborted now and then ("terminate called without an active exception"). The model
    and everything of it live in `body`'s frame, gone once it returns; a group still alive after
    leaving is an error, naming the threads."""
    import gc

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = body(*args)
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
    for mesh in [o for o in gc.get_objects() if isinstance(o, DeviceMesh)]:
        mesh._pg_registry.clear()
    gc.collect()
    alive = gloo_threads()
    if alive:
        raise RuntimeError(f"rank {rank}: gloo threads still running after leaving the group: {alive}")
    return result


def gloo_threads():
    """The names of this process's gloo threads (Linux: /proc/self/task/*/comm)."""
    tasks = pathlib.Path("/proc/self/task")
    names = []
    for task in tasks.iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except FileNotFoundError:
            continue
    return sorted(n for n in names if "gloo" in n)
