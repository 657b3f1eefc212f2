#!/usr/bin/env python3
"""Benchmark what `install` users wait for, against doing it by hand, in one run on one machine.

    python scripts/bench.py install [--json-out FILE] [--markdown-out FILE]

Measures, in order, on a fresh venv with the pinned CPU torch:
  baseline  the hand-written way: `pip download` the sdist, extract, `pip wheel --no-build-isolation`
            with the same DS_BUILD_* flags mlstack-ds plans (compile only, no patches, no install);
  cold      `mlstack-ds install` with an empty cache (download, patch, build, install, check);
  warm      `mlstack-ds install --force` again: the wheel comes from the cache;
  no-op     `mlstack-ds install` once more: the plan is installed and intact, nothing to do.
Ratios against the baseline are what to read: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the tests' support package, for the pins)
from support.pins import DEEPSPEED_RUNTIME_DEPS, TORCH_PIN

REPO = Path(__file__).resolve().parents[1]
CPU_FLAGS = {"DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", "DS_BUILD_CPU_ADAM": "1", "DS_BUILD_FUSED_ADAM": "1",
             "DS_BUILD_SHM_COMM": "1"}


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, env={**os.environ, **(env or {})}, cwd=cwd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def bench_venv(venv: Path) -> str:
    """A fresh venv with the pinned CPU torch and DeepSpeed's build requirements; its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", TORCH_PIN, "setuptools", "wheel",
                    *DEEPSPEED_RUNTIME_DEPS], check=True)
    return python


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py install", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-out", type=Path, help="write the results as JSON here")
    parser.add_argument("--markdown-out", type=Path, help="write a Markdown section here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp_name:
        tmp = Path(tmp_name)
        python = bench_venv(tmp / "venv")
        results: dict[str, float] = {}
        sdist_dir = tmp / "sdist"
        started = time.monotonic()
        subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "deepspeed==0.19.5", "-d", str(sdist_dir)], check=True)
        (sdist,) = sdist_dir.glob("deepspeed-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp / "src", filter="data")
        results["baseline"] = (time.monotonic() - started) + timed(
            [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp / "wheel"), "."],
            env={**CPU_FLAGS, "MAX_JOBS": str(os.cpu_count() or 1)}, cwd=tmp / "src" / "deepspeed-0.19.5")
        cli = [sys.executable, "-m", "mlstack_ds", "install", "--python", python, "--cache-dir", str(tmp / "cache")]
        results["cold"] = timed(cli)
        results["warm"] = timed([*cli, "--force"])
        results["no-op"] = timed(cli)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "seconds": {k: round(v, 1) for k, v in results.items()},
              "ratio_to_baseline": {k: round(v / results["baseline"], 3) for k, v in results.items()}}
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown_out:
        args.markdown_out.write_text(markdown(report))
    return 0


def markdown(report: dict) -> str:
    rows = "\n".join(f"| {name} | {secs} | {report['ratio_to_baseline'][name]} |"
                     for name, secs in report["seconds"].items())
    return (f"| step | seconds | ÷ baseline |\n|---|---|---|\n{rows}\n\n"
            f"Measured {report['date']} on {report['machine']} (CPU platform: cpu_adam, fused_adam, shm_comm).\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
