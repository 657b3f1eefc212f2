#!/usr/bin/env python3
"""Benchmark `install --index` against the cold build it replaces, side by side in one run (issue 30).

    python scripts/bench.py index [--sdist FILE] [--json-out FILE] [--markdown-out FILE]

In order, each into a venv of its own with the same torch (it sees this interpreter's packages) and an
empty mlstack-ds cache:
  cold     `mlstack-ds install --no-verify`: fetch, patch, compile the CPU ops, install (`--sdist`: the pinned
           sdist from a file instead of PyPI; the same pin, the same plan);
  publish  `mlstack-ds publish KEY --to DIR` of that wheel;
  index    `mlstack-ds install --index http://127.0.0.1:PORT/simple --index-only --no-verify` into the second
           venv, served by `python -m http.server`, with a PATH that has no compiler at all;
  verify   `mlstack-ds verify --only environment,prebuilt_ops` there (the ops load without a compile).
The ratio index/cold is what to read: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import _repo  # noqa: F401  (the repository and the tests' support package on sys.path)
from benchdoc import write_result
from support.e2e import no_compiler_path, served
from support.target_env import overlay_venv

HEADING = "## install --index: prebuilt ops from a team index"


def tool(*args: str, path: str | None = None, prefix: tuple[str, ...] = ()) -> tuple[float, dict]:
    """`mlstack-ds ARGS --json` (under `prefix`): its seconds and document (fails loudly, with stderr)."""
    env = {**os.environ, **({"PATH": path} if path else {})}
    started = time.monotonic()
    done = subprocess.run([*prefix, sys.executable, "-m", "mlstack_ds", *args, "--json"], capture_output=True,
                          text=True, env=env, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"mlstack-ds {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)


def build_venv(path: Path) -> Path:
    """A venv that sees this interpreter's torch and can build DeepSpeed: its own setuptools (65, without
    bdist_wheel) would shadow this interpreter's for the build, so it goes."""
    overlay_venv(path)
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools"],
                   check=True, capture_output=True)
    return path


def run(tmp: Path, sdist: Path | None) -> dict[str, object]:
    cold_venv, index_venv = build_venv(tmp / "cold-venv"), overlay_venv(tmp / "index-venv")
    source = ["--source", str(sdist)] if sdist else []
    cold_s, cold = tool("install", "--python", str(cold_venv / "bin" / "python"), "--cache-dir", str(tmp / "cache-a"),
                        "--no-verify", *source)
    key = cold["plan"]["cache_key"]
    publish_s, published = tool("publish", key, "--to", str(tmp / "index"), "--cache-dir", str(tmp / "cache-a"))
    bare = no_compiler_path(tmp / "no-compiler-bin")
    with served(tmp / "index") as base:
        index_s, from_index = tool("install", "--python", str(index_venv / "bin" / "python"), "--cache-dir",
                                   str(tmp / "cache-b"), "--index", f"{base}/simple", "--index-only", "--no-verify",
                                   path=bare)
    verify_s, verified = tool("verify", "--python", str(index_venv / "bin" / "python"), "--only",
                              "environment,prebuilt_ops", path=bare)
    assert not (tmp / "cache-b" / "logs").exists(), "the index install built something"
    return {"cold_s": cold_s, "publish_s": publish_s, "index_s": index_s, "verify_s": verify_s,
            "ratio": index_s / cold_s, "ops": cold["receipt"]["ops"],
            "wheel": Path(from_index["receipt"]["wheel"]).name, "wheel_mb": round(
                Path(published["wheels"][0]["wheel"]).stat().st_size / 2**20, 1),
            "verify_ok": verified["ok"], "same_ops": sorted(from_index["receipt"]["ops"]) == sorted(
                cold["receipt"]["ops"])}


def markdown(row: dict[str, object], load: tuple[float, float]) -> str:
    return "\n".join([
        HEADING, "",
        f"`scripts/bench_index.py`, one run, {date.today()}, {platform.machine()}, {os.cpu_count()} cores, CPython "
        f"{platform.python_version()}, load average {load[0]:.1f} before / {load[1]:.1f} after (other test suites "
        "were running). Both venvs have the same torch; each install starts with an empty mlstack-ds cache. The "
        f"ops ({', '.join(map(str, row['ops']))}) are the CPU platform's; on ROCm the cold build is longer "
        "(hipcc, one compile per target), the index install the same.", "",
        "| step | seconds | |", "|---|---|---|",
        f"| cold `install` (fetch, patch, compile, install) | {row['cold_s']:.0f} | 1.00 |",
        f"| `publish` of that wheel ({row['wheel_mb']} MB) | {row['publish_s']:.1f} | |",
        f"| `install --index` over HTTP, no compiler on PATH | {row['index_s']:.1f} | {row['ratio']:.3f} |",
        f"| `verify --only environment,prebuilt_ops` after it | {row['verify_s']:.1f} | "
        f"{'pass' if row['verify_ok'] else 'FAIL'} |", "",
        f"The index install took {100 * float(row['ratio']):.1f}% of the cold build's time (the goal: under 10%), "
        f"installed the same prebuilt ops ({'yes' if row['same_ops'] else 'NO'}), and compiled nothing (its cache "
        "has no build log).", ""])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py index", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="the pinned DeepSpeed sdist as a file (else from PyPI)")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-index-") as scratch:
        row = run(Path(scratch), args.sdist)
    load = (load_before, os.getloadavg()[0])
    write_result({"load": load, **row}, markdown(row, load), HEADING, args.json_out, args.markdown_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
