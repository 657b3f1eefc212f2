#!/usr/bin/env python3
"""Benchmark a cold build's use of the cores: the hand build, ours, and our rebuild after a one-op patch.

    python scripts/bench.py build [--ops cpu_adam,fused_adam,deepspeed_shm_comm] [--json-out F] [--markdown-out F]

In one run, on a fresh venv with the pinned CPU torch, each step with its own empty ccache:
  hand     `pip wheel --no-build-isolation` of the 0.19.5 sdist with the plan's DS_BUILD_* flags and
           MAX_JOBS=<cores>, as a user types it (setup.py builds the ops one after another, without ninja);
  cold     `mlstack-ds install --no-verify` with an empty wheel cache and an empty ccache;
  rebuild  the same after adding one patch that changes one source of one op (deepspeed_shm_comm's shm.cpp):
           a new plan, so a new build, where ccache has every other compile.
For each: wall, user and system CPU of the whole process tree, and wall ÷ (CPU ÷ cores), the limit. The
hand and cold wheels must hold the same ops exporting the same symbols, or the run fails.
`--ops` limits the CPU recipe to those ops (a copy of the recipe; the issue's measurement used these three).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from bench_install import bench_venv

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.19.5"
ONE_OP_PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: mlstack-ds <patches@mlstack-ds.invalid>
Date: Tue, 24 Nov 2026 00:30:00 +0000
Subject: [PATCH] csrc/cpu/comm: a one-op change (rebuild benchmark)

Changes one source of deepspeed_shm_comm only, to measure what a rebuild recompiles.

Origin: mlstack-ds
Forwarded: not-needed
Last-Update: 2026-11-24
---
 csrc/cpu/comm/shm.cpp | 1 +
 1 file changed, 1 insertion(+)

""" + "\n".join([
    "diff --git a/csrc/cpu/comm/shm.cpp b/csrc/cpu/comm/shm.cpp", "--- a/csrc/cpu/comm/shm.cpp",
    "+++ b/csrc/cpu/comm/shm.cpp", "@@ -3,6 +3,7 @@", " ", " // DeepSpeed Team", " ",
    "+// rebuild benchmark: a one-op change", " #include <torch/extension.h>", " ", " #include <ATen/ATen.h>", ""])


def timed(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> dict[str, float]:
    """Wall, user and system seconds of `argv` and everything it started (children are waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(argv, check=True, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    cores = os.cpu_count() or 1
    return {"wall": round(wall, 1), "user": round(user, 1), "system": round(system, 1),
            "limit": round((user + system) / cores, 1), "wall_over_limit": round(wall * cores / (user + system), 2)}


def recipe_copy(data: Path, ops: list[str] | None, extra_patch: str | None) -> Path:
    """A data directory with the shipped recipe and series, the CPU op list cut to `ops`, and a patch added."""
    shutil.copytree(REPO / "patches", data / "patches")
    (data / "recipes").mkdir(parents=True)
    text = (REPO / "recipes" / f"deepspeed-{VERSION}.toml").read_text()
    if ops:
        lines, in_cpu = [], False
        for line in text.splitlines():
            if line.startswith("["):
                in_cpu = line.strip() == "[platforms.cpu.ops]"
            name = line.split("=", 1)[0].strip()
            off = in_cpu and "build = true" in line and name not in ops
            lines.append(line.replace("build = true", "build = false") if off else line)
        text = "\n".join(lines) + "\n"
    recipe = data / "recipes" / f"deepspeed-{VERSION}.toml"
    recipe.write_text(text)
    if extra_patch:
        series = data / "patches" / f"deepspeed-{VERSION}"
        (series / "0090-bench-one-op-change.patch").write_text(extra_patch)
        with (series / "series").open("a") as handle:
            handle.write("0090-bench-one-op-change.patch\n")
    return recipe


def ops_and_symbols(wheel: Path) -> dict[str, object]:
    """installed_ops from the build record, and each op library's exported symbols."""
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read("deepspeed/git_version_info_installed.py").decode()
        tree = ast.parse(record)
        ops = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", "") == "installed_ops")
        symbols: dict[str, list[str]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in archive.namelist():
                if name.startswith("deepspeed/ops/") and name.endswith(".so"):
                    path = Path(archive.extract(name, tmp))
                    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                                        check=True)
                    symbols[Path(name).name] = sorted(line.split()[-1] for line in nm.stdout.splitlines())
    return {"installed_ops": ops, "symbols": symbols}


def ccache_counts(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, env=env, check=False).stdout
    stats = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    hits = int(stats.get("direct_cache_hit", 0)) + int(stats.get("preprocessed_cache_hit", 0))
    return {"hits": hits, "misses": int(stats.get("cache_miss", 0))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated CPU ops to build (default: the recipe's)")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args(argv)
    if not shutil.which("ccache"):
        print("bench.py build: ccache is not installed (apt-get install ccache)", file=sys.stderr)
        return 2
    ops = args.ops.split(",") if args.ops else None
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp_name:
        tmp = Path(tmp_name)
        python = bench_venv(tmp / "venv")
        cold_recipe = recipe_copy(tmp / "data-cold", ops, None)
        rebuild_recipe = recipe_copy(tmp / "data-rebuild", ops, ONE_OP_PATCH)
        cli = [sys.executable, "-m", "mlstack_ds", "install", "--no-verify", "--python", python,
               "--cache-dir", str(tmp / "cache")]
        dry = subprocess.run([*cli, "--recipe", str(cold_recipe), "--dry-run", "--json"], capture_output=True,
                             text=True, check=True)
        plan = json.loads(dry.stdout)["plan"]
        flags = {k: v for k, v in plan["env"].items() if k.startswith("DS_")}
        flags.pop("DS_ENABLE_NINJA", None)  # the hand build is setup.py's default: no ninja
        sdist_dir = tmp / "sdist"
        subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"deepspeed=={VERSION}", "-d", str(sdist_dir)], check=True)
        (sdist,) = sdist_dir.glob("deepspeed-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp / "src", filter="data")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DS_", "CCACHE_", "MAX_JOBS"))}
        results: dict[str, dict[str, float]] = {}
        hand_env = {**base, **flags, "MAX_JOBS": str(os.cpu_count() or 1), "CCACHE_DISABLE": "1"}
        results["hand"] = timed([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                                 str(tmp / "hand"), "."], hand_env, cwd=tmp / "src" / f"deepspeed-{VERSION}")
        ours_env = {**base, "CCACHE_DIR": str(tmp / "ccache")}
        results["cold"] = timed([*cli, "--recipe", str(cold_recipe)], ours_env)
        subprocess.run(["ccache", "--zero-stats"], env=ours_env, check=True, stdout=subprocess.DEVNULL)
        results["rebuild"] = timed([*cli, "--recipe", str(rebuild_recipe)], ours_env)
        rebuild_ccache = ccache_counts(ours_env)
        (hand_wheel,) = (tmp / "hand").glob("*.whl")
        cold_wheel = next((tmp / "cache" / "wheels" / plan["cache_key"]).glob("*.whl"))
        hand, cold = ops_and_symbols(hand_wheel), ops_and_symbols(cold_wheel)
        same = hand == cold
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "deepspeed": VERSION,
        "ops": plan["built_ops"], "concurrency": plan.get("concurrency"), "seconds": results,
        "cold_over_hand": round(results["cold"]["wall"] / results["hand"]["wall"], 2),
        "rebuild_ccache": rebuild_ccache,
        "same_ops_and_symbols": same, "installed_ops": cold["installed_ops"],
        "symbols_per_op": {name: len(names) for name, names in cold["symbols"].items()},  # type: ignore[union-attr]
    }
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown_out:
        args.markdown_out.write_text(markdown(report))
    return 0 if same else 1


def markdown(report: dict) -> str:
    rows = "\n".join(f"| {name} | {r['wall']} | {r['user']} | {r['system']} | {r['limit']} | {r['wall_over_limit']} |"
                     for name, r in report["seconds"].items())
    return (f"| step | wall (s) | user (s) | system (s) | limit = CPU ÷ cores (s) | wall ÷ limit |\n"
            f"|---|---|---|---|---|---|\n{rows}\n\n"
            f"Measured {report['date']} on {report['machine']}; DeepSpeed {report['deepspeed']}, ops "
            f"{', '.join(report['ops'])}. Cold ÷ hand: {report['cold_over_hand']}. Rebuild after a one-op patch: "
            f"ccache {report['rebuild_ccache']['hits']} hits, {report['rebuild_ccache']['misses']} misses. "
            f"Same installed_ops and exported symbols as the hand build: {report['same_ops_and_symbols']}.\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
