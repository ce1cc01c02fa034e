"""Profile the GPT-like model of python/tests on the CPU into a shardplan profile.

    target/release/shardplan profile analytic --model models/gpt2-small.toml --device h100-sxm \
        --world-size 2 --block-size 16KiB --out comm.toml
    .venv/bin/python python/examples/profile_tiny_gpt.py comm.toml tiny.toml
    target/release/shardplan solve --profile tiny.toml --objective memory --out tiny.plan.toml
"""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from shardplan_torch import profile  # noqa: E402
from test_roundtrip import TinyGPT, batch, loss_fn  # noqa: E402

if __name__ == "__main__":
    comm, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = TinyGPT()
    profile(model, model.units(), batch(0, 1), loss_fn, comm, out, name="tiny gpt")
    print(f"wrote {out}")
