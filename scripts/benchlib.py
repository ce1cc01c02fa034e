"""What the benchmark scripts share: the built binary, runs under mpirun, and rewriting a
generated section of a document between markers (through a temporary file)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A prebuilt binary (SHARDPLAN_BIN: the device machine's, from scripts/gpu-bundle) or the release build.
PREBUILT = os.environ.get("SHARDPLAN_BIN")
BIN = Path(PREBUILT).resolve() if PREBUILT else ROOT / "target" / "release" / "shardplan"


def prepare():
    """System dependencies and the release binary (unless SHARDPLAN_BIN names one), and mpirun
    allowed to run as root here."""
    if not PREBUILT:
        subprocess.run([ROOT / "scripts" / "ensure-system-deps"], check=True)
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    if os.geteuid() == 0:
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def call(args, world=1):
    """Runs the binary (under mpirun for more than one rank): the command and its completed
    process."""
    command = [str(BIN), *map(str, args)]
    if world > 1:
        command = ["mpirun", "--oversubscribe", "-np", str(world), *command]
    return command, subprocess.run(command, capture_output=True, text=True)


def shardplan(args, world=1):
    """Runs the binary (under mpirun for more than one rank); its stdout, or exits naming the
    command and its stderr."""
    command, done = call(args, world)
    if done.returncode != 0:
        sys.exit(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def training_text():
    """The text the GPT-2 runs train on: the README and every byte value."""
    return (ROOT / "README.md").read_bytes() + bytes(range(256))


def write_section(out, name, text):
    """Replaces the text between `<!-- name:begin -->` and `<!-- name:end -->` in `out` (or
    appends the section), through a temporary file."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{text}\n{end}"
    old = out.read_text() if out.exists() else ""
    if begin in old and end in old:
        new = old[: old.index(begin)] + section + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    temp = out.with_suffix(".tmp")
    temp.write_text(new)
    temp.replace(out)
