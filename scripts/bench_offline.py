#!/usr/bin/env python3
"""Benchmark the air-gapped path (`bundle`, then `install --offline`) beside an online install, in one run.

    python scripts/bench.py offline [--sdist FILE] [--warm-cache DIR] [--json-out FILE] [--markdown-out FILE]

In order, each install into a venv of its own with the same torch (it sees this interpreter's packages):
  bundle   `mlstack-ds bundle --to DIR` for this machine (what the machine with network access runs): its
           seconds, its size and file count;
  online   `mlstack-ds install --no-verify` from the package index (`--sdist`: the pinned sdist from a file);
  offline  `mlstack-ds install --offline DIR --no-verify` in a network namespace with only loopback up
           (`unshare -n`; without it, stated in the result, the install runs --offline with the network there);
  verify   `mlstack-ds verify --only environment,prebuilt_ops` on the offline install, in such a namespace.
Each install starts with an empty mlstack-ds cache (a cold build, minutes) or, with `--warm-cache DIR`, with a
copy of DIR (a cache that holds the plan's wheel: the installs without their build, seconds). The ratio
offline/online is what to read: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
from datetime import date
from pathlib import Path

import _repo  # noqa: F401  (the repository and the tests' support package on sys.path)
from bench_index import build_venv, tool
from benchdoc import write_result
from support.bundles import network_namespace
from support.pins import TORCH_VERSION

HEADING = "## Air-gapped: bundle and install --offline (issue 41)"


def cache(path: Path, warm: Path | None) -> str:
    if warm is not None:
        shutil.copytree(warm, path, symlinks=True)
    return str(path)


def run(tmp: Path, sdist: Path | None, warm: Path | None) -> dict[str, object]:
    source = ["--source", str(sdist)] if sdist else []
    bundle_dir = tmp / "bundle"
    bundle_s, bundled = tool("bundle", "--to", str(bundle_dir), "--torch", TORCH_VERSION, *source)
    files = [p for p in bundle_dir.rglob("*") if p.is_file()]
    online_python, offline_python = (str(build_venv(tmp / name) / "bin" / "python")
                                     for name in ("online-venv", "offline-venv"))
    online_s, online = tool("install", "--python", online_python, "--cache-dir", cache(tmp / "cache-a", warm),
                            "--no-verify", *source)
    namespace = network_namespace()
    offline_s, offline = tool("install", "--python", offline_python, "--cache-dir", cache(tmp / "cache-b", warm),
                              "--offline", str(bundle_dir), "--no-verify", prefix=namespace)
    verify_s, verified = tool("verify", "--python", offline_python, "--only", "environment,prebuilt_ops",
                              prefix=namespace)
    return {"bundle_s": bundle_s, "bundle_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1),
            "bundle_files": len(bundled["manifest"]["files"]), "online_s": online_s, "offline_s": offline_s,
            "verify_s": verify_s, "ratio": offline_s / online_s, "isolated": bool(namespace),
            "warm": warm is not None, "ops": offline["receipt"]["ops"], "verify_ok": verified["ok"],
            "same_wheel": online["receipt"]["wheel_sha256"] == offline["receipt"]["wheel_sha256"],
            "offline_source": offline["receipt"]["source"].split(":", 1)[0]}


def markdown(row: dict[str, object], load: tuple[float, float]) -> str:
    kind = ("each from a copy of one warm cache (the plan's wheel is there: the installs without their build)"
            if row["warm"] else "each with an empty mlstack-ds cache (a cold build)")
    where = ("in a network namespace with only loopback up (`unshare -n`)" if row["isolated"]
             else "with `--offline` but the network there (this machine could not make a network namespace)")
    return "\n".join([
        HEADING, "",
        f"`scripts/bench.py offline`, one run, {date.today()}, {platform.machine()}, {os.cpu_count()} cores, CPython "
        f"{platform.python_version()}, load average {load[0]:.1f} before / {load[1]:.1f} after. Both installs go into "
        f"venvs with the same torch, {kind}; the offline one and its verify ran {where}. Ops: "
        f"{', '.join(map(str, row['ops']))}.", "",
        "| step | seconds | |", "|---|---|---|",
        f"| `bundle` for this machine ({row['bundle_files']} files, {row['bundle_mb']} MB) | {row['bundle_s']:.1f} | |",
        f"| `install` from the package index | {row['online_s']:.1f} | 1.00 |",
        f"| `install --offline DIR` | {row['offline_s']:.1f} | {row['ratio']:.2f} |",
        f"| `verify --only environment,prebuilt_ops` after it | {row['verify_s']:.1f} | "
        f"{'pass' if row['verify_ok'] else 'FAIL'} |", "",
        f"The two installs produced {'the same wheel (sha256)' if row['same_wheel'] else 'DIFFERENT wheels'}; the "
        f"offline receipt's source is `{row['offline_source']}:DIR`.", ""])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py offline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="the pinned DeepSpeed sdist as a file (else from PyPI)")
    parser.add_argument("--warm-cache", type=Path, help="an mlstack-ds cache holding the plan's wheel: each "
                        "install starts from a copy of it (no build)")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-offline-") as scratch:
        row = run(Path(scratch), args.sdist, args.warm_cache)
    load = (load_before, os.getloadavg()[0])
    write_result({"load": load, **row}, markdown(row, load), HEADING, args.json_out, args.markdown_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
