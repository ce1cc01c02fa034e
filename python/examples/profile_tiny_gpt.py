"""Profile the GPT-like model of shardplan_torch.testing on the CPU into a shardplan profile
(`pip install ./python` first).

    target/release/shardplan profile analytic --model models/gpt2-small.toml --device h100-sxm \
        --world-size 2 --block-size 16KiB --out comm.toml
    .venv/bin/python python/examples/profile_tiny_gpt.py comm.toml tiny.toml
    target/release/shardplan solve --profile tiny.toml --objective memory --out tiny.plan.toml
"""

import sys

import torch

from shardplan_torch import profile
from shardplan_torch.testing import TinyGPT, batch, loss_fn

if __name__ == "__main__":
    comm, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = TinyGPT()
    profile(model, model.units(), batch(0, 1), loss_fn, comm, out, name="tiny gpt")
    print(f"wrote {out}")
