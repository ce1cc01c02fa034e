"""The docs/families.md table: each real-size transformers config of python/tests/hf_families.py
profiled analytically at N = 64 (8 nodes × 8 H100 SXM), sequence 4096 (GPT-2: 1024), solved by
the ILP under 79.65 GiB with a 10 s limit, against the best baseline that fits (every kind, with
and without recompute).

    SHARDPLAN_BIN=target/release/shardplan .venv/bin/python scripts/families_table.py
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
import hf_families  # noqa: E402

BIN = os.environ.get("SHARDPLAN_BIN", str(ROOT / "target" / "release" / "shardplan"))
CAP = "79.65GiB"


def run(*args):
    out = subprocess.run([BIN, *args, "--json"], capture_output=True, text=True)
    if out.returncode not in (0, 3):
        raise SystemExit(f"shardplan {' '.join(args)}: {out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def row(name, d):
    config = hf_families.real(name)
    config.save_pretrained(d)
    seq_len = 1024 if name.startswith("GPT-2") else 4096
    profile = run("profile", "analytic", "--model", f"{d}/config.json", "--device", "h100-sxm",
                  "--world-size", "64", "--gpus-per-node", "8", "--seq-len", str(seq_len),
                  "--out", f"{d}/p.toml")
    baselines = {}
    kinds = ["ddp", "zero2", "fsdp1", "fsdp2", "zero3", "best-grid", "hsdp", "hpz"]
    for kind, checkpoint in [(k, c) for k in kinds for c in (False, True)]:
        tag = f"{kind} + recompute" if checkpoint else kind
        b = run("baseline", "--profile", f"{d}/p.toml", "--kind", kind, "--memory-cap", CAP,
                *(["--checkpoint"] if checkpoint else []), "--out", f"{d}/{kind}.toml")
        if b.get("fits_cap"):
            baselines[tag] = b["iteration_time_us"]
    solved = run("solve", "--profile", f"{d}/p.toml", "--memory-cap", CAP, "--time-limit", "10",
                 "--out", f"{d}/ilp.toml")
    best = min(baselines, key=baselines.get) if baselines else None
    params = profile["total_params"]
    cells = [name, f"{params:,}", str(seq_len)]
    if solved.get("iteration_time_us") is None:
        return cells + ["no plan fits", "—", best or "none fits", "—", "—"]
    ilp = solved["iteration_time_us"] / 1e3
    gap = solved.get("gap")
    cells += [f"{ilp:,.1f} ms ({solved['status']}, gap {gap:.2%})" if gap is not None else f"{ilp:,.1f} ms",
              f"{solved['peak_memory_bytes'] / 2**30:.2f} GiB"]
    if best is None:
        return cells + ["none fits", "—", "—"]
    base = baselines[best] / 1e3
    return cells + [best, f"{base:,.1f} ms", f"{base / ilp:.3f}×"]


def main():
    print("| model | parameters | seq | ILP iteration (status, gap) | ILP peak | best baseline | its iteration | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in hf_families.REAL:
        with tempfile.TemporaryDirectory() as d:
            print("| " + " | ".join(row(name, d)) + " |", flush=True)


if __name__ == "__main__":
    main()
