"""Run a bench command and keep its figures as ``bench/results/<name>.json``, with where they came from.

Every bench prints exactly one JSON object on stdout. This runs one (its stderr passes through),
parses that object and writes it under ``result`` beside the date (UTC), the short commit the
bench ran at (``-dirty`` appended when the work tree has uncommitted changes), the hardware
(detected: cores, architecture, memory and GPU, or given with ``--hardware``) and the exact
command, which is the provenance docs/benchmarks.md quotes for each figure:

    python -m bench.record rollout_bench -- python -m bench.rollout_bench --quick
    python -m bench.record ledger_load --hardware "8-core x86-64 CPU, 32 GiB, no GPU" -- python -m bench.ledger_load

A bench that exits non-zero or prints anything but one JSON object is reported and nothing is written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def short_commit(root: Path = ROOT) -> str:
    """The short sha of HEAD, with ``-dirty`` when tracked files differ from it."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root, check=False).returncode != 0
    return f"{sha}-dirty" if dirty else sha


def memory_gib() -> int | None:
    """Total memory in GiB from /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2)
    except OSError:
        return None
    return None


def gpus() -> list[str]:
    """The names of the CUDA GPUs nvidia-smi lists (none when it is absent or fails)."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=False
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def describe_hardware() -> str:
    """E.g. ``2-core x86-64 CPU, 24 GiB, no GPU`` or ``16-core x86-64 CPU, 128 GiB, 1x NVIDIA H200``."""
    arch = platform.machine().replace("_", "-") or "unknown"
    parts = [f"{os.cpu_count() or 1}-core {arch} CPU"]
    mem = memory_gib()
    if mem is not None:
        parts.append(f"{mem} GiB")
    names = gpus()
    if names:
        parts.append(", ".join(f"{names.count(n)}x {n}" for n in dict.fromkeys(names)))
    else:
        parts.append("no GPU")
    return ", ".join(parts)


def parse_result(stdout: str) -> dict[str, Any]:
    """The one JSON object a bench printed; ValueError naming what was wrong otherwise."""
    text = stdout.strip()
    if not text:
        raise ValueError("the bench printed nothing on stdout (it must print one JSON object)")
    try:
        result = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"stdout is not one JSON object ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(result, dict):
        raise ValueError(f"stdout is JSON but a {type(result).__name__}, not an object")
    return result


def record(name: str, command: list[str], hardware: str | None = None, root: Path = ROOT) -> Path:
    """Run ``command`` in ``root``, write ``bench/results/<name>.json`` and return its path."""
    if not NAME_PATTERN.match(name):
        raise ValueError(f"bad result name {name!r}: use lower-case letters, digits, '_', '-' or '.'")
    commit = short_commit(root)
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    done = subprocess.run(command, cwd=root, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise ValueError(f"{shlex.join(command)} exited {done.returncode}; nothing recorded")
    document = {
        "date": date,
        "commit": commit,
        "hardware": hardware or describe_hardware(),
        "command": shlex.join(command),
        "result": parse_result(done.stdout),
    }
    path = root / "bench" / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="result file name: bench/results/<name>.json")
    parser.add_argument("--hardware", help="hardware description (default: detected)")
    parser.add_argument("command", nargs="*", help="-- then the bench command line")
    argv = sys.argv[1:] if argv is None else argv
    # Everything after the first "--" is the bench's own command line; options may stand on
    # either side of NAME before it.
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = [*args.command, *argv[split + 1 :]]
    if not command:
        parser.error("give the bench command after --, e.g. -- python -m bench.rollout_bench --quick")
    try:
        path = record(args.name, command, args.hardware)
    except (ValueError, OSError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
