"""Benchmark `mlstack-ds verify` against the naive way, in the same run (this machine is noisy).

- suite: `mlstack-ds verify --python <prebuilt-ops venv>`: every check, one launch, 2 CPU ranks.
- isolated: the same with `--isolate` (one launch per check): what the single launch saves.
- naive: what people do by hand: one `deepspeed --num_gpus 2` launch per ZeRO stage, with DeepSpeed
  installed without prebuilt ops so cpu_adam/fused_adam are JIT-compiled at first use (fresh
  TORCH_EXTENSIONS_DIR, so the first launch pays the compile as a new user would). Each launch runs the
  same worker with just that stage (`--allow-jit`), so the work per stage is identical.

Writes JSON (`--json-out`) and prints a markdown table for docs/benchmarks.md's `## verify` section.

`--added a,b --runs N --python PY`: instead, what checks a, b add to the suite's time: the whole suite and
the suite with `--skip a,b`, alternated N times each on the same target (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _repo import REPO

from mlstack_ds.launch import launcher

NAIVE_STAGES = ("zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "checkpoint")
GOAL_S = 60.0


def target_venvs(prebuilt: str | None, jit: str | None) -> tuple[Path, Path]:
    """The two target interpreters; built (and cached) by the e2e tests' builder when not given."""
    if prebuilt and jit:
        return Path(prebuilt), Path(jit)
    from support.target_env import (  # noqa: PLC0415
        CPU_OPS_FLAGS,
        DS_SDIST_SHA256,
        DS_VERSION,
        NO_OPS_FLAGS,
        build_target_venv,
        cached_deepspeed_sdist,
        test_cache_dir,
    )

    sdist = cached_deepspeed_sdist(DS_VERSION, DS_SDIST_SHA256)
    cache = test_cache_dir()
    made_prebuilt = Path(prebuilt) if prebuilt else build_target_venv(sdist, CPU_OPS_FLAGS, cache).python
    made_jit = Path(jit) if jit else build_target_venv(sdist, NO_OPS_FLAGS, cache).python
    return made_prebuilt, made_jit


def run_suite(python: Path, *extra: str) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mlstack_ds", "verify", "--python", str(python), "--json",
                           "--timeout", "900", *extra], capture_output=True, text=True, check=False, cwd=REPO)
    wall = time.monotonic() - started
    report = json.loads(proc.stdout)
    return {"wall_s": round(wall, 2), "exit_code": proc.returncode, "launches": len(report["launches"]),
            "counts": report["counts"],
            "checks": {c["name"]: {"status": c["status"], "duration_s": c["duration_s"],
                                   "reason": c["reason"]} for c in report["checks"]}}


def run_naive(python: Path) -> dict[str, Any]:
    ds_launcher = python.parent / "deepspeed"
    stages: dict[str, Any] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-naive-") as tmp:
        staged = launcher.stage_worker(Path(tmp) / "code")
        env = launcher.worker_env({**os.environ, "TORCH_EXTENSIONS_DIR": str(Path(tmp) / "torch_extensions"),
                                   "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}, staged)
        for port, stage in enumerate(NAIVE_STAGES, start=29611):
            out = Path(tmp) / stage
            stage_started = time.monotonic()
            proc = subprocess.run([str(ds_launcher), "--num_gpus", "2", "--master_port", str(port), "--module",
                                   launcher.WORKER_MODULE, "--checks", stage, "--out", str(out), "--allow-jit",
                                   "--timeout", "900"],
                                  capture_output=True, text=True, check=False, env=env, timeout=1800)
            statuses = []
            for rank_file in sorted(out.glob("rank*.jsonl")):
                for line in rank_file.read_text().splitlines():
                    record = json.loads(line)
                    if record.get("event") == "result":
                        statuses.append(record["status"])
            stages[stage] = {"wall_s": round(time.monotonic() - stage_started, 2),
                             "exit_code": proc.returncode, "rank_statuses": statuses}
    return {"wall_s": round(time.monotonic() - started, 2), "stages": stages}


def markdown(result: dict[str, Any]) -> str:
    suite, isolated, naive = result["suite"], result["isolated"], result["naive"]
    lines = [
        f"Measured {result['date']} on {result['machine']}; DeepSpeed 0.19.5, torch 2.13.0 CPU, "
        "2 ranks (gloo).",
        "",
        "| what | wall time (s) | launches | notes |",
        "|---|---:|---:|---|",
        f"| `mlstack-ds verify` (all {len(suite['checks'])} checks, prebuilt ops) | {suite['wall_s']:.1f} | "
        f"{suite['launches']} | {suite['counts']['pass']} pass, {suite['counts']['fail']} fail, "
        f"{suite['counts']['skip']} skip |",
        f"| `mlstack-ds verify --isolate` (one launch per check, prebuilt ops) | {isolated['wall_s']:.1f} | "
        f"{isolated['launches']} | {isolated['counts']['pass']} pass, {isolated['counts']['fail']} fail, "
        f"{isolated['counts']['skip']} skip |",
        f"| naive: one `deepspeed` launch per stage, JIT ops ({', '.join(NAIVE_STAGES)}) | "
        f"{naive['wall_s']:.1f} | {len(naive['stages'])} | first launch compiles cpu_adam/fused_adam |",
        "",
        f"Ratio naive / suite: **{naive['wall_s'] / suite['wall_s']:.1f}x**; goal for the suite: under "
        f"{GOAL_S:.0f} s ({'met' if suite['wall_s'] < GOAL_S else 'NOT met'}).",
        "",
        "| check | status | time (s) |",
        "|---|---|---:|",
    ]
    lines += [f"| {name} | {c['status']} | {c['duration_s']:.1f} |" for name, c in suite["checks"].items()]
    lines += ["", "| naive stage | wall time (s) |", "|---|---:|"]
    lines += [f"| {name} | {s['wall_s']:.1f} |" for name, s in naive["stages"].items()]
    return "\n".join(lines)


def measure_added(python: Path, added: str, runs: int) -> dict[str, Any]:
    """The whole suite and the suite without `added`, alternated `runs` times (the machine drifts)."""
    whole, without = [], []
    for _ in range(runs):
        whole.append(run_suite(python))
        without.append(run_suite(python, "--skip", added))
    whole_s = statistics.median(r["wall_s"] for r in whole)
    without_s = statistics.median(r["wall_s"] for r in without)
    per_check = {name: statistics.median(r["checks"][name]["duration_s"] for r in whole)
                 for name in whole[0]["checks"]}
    return {"added": added.split(","), "runs": runs, "whole_s": [r["wall_s"] for r in whole],
            "without_s": [r["wall_s"] for r in without], "median_whole_s": whole_s,
            "median_without_s": without_s, "median_added_s": round(whole_s - without_s, 2),
            "median_check_s": per_check, "statuses": {n: c["status"] for n, c in whole[-1]["checks"].items()}}


def markdown_added(result: dict[str, Any]) -> str:
    lines = [f"Measured {result['date']} on {result['machine']}; {result['runs']} runs of each, alternated.", "",
             "| what | median wall (s) | runs (s) |", "|---|---:|---|",
             f"| whole suite | {result['median_whole_s']:.1f} | {', '.join(f'{v:.1f}' for v in result['whole_s'])} |",
             f"| without {', '.join(result['added'])} | {result['median_without_s']:.1f} | "
             f"{', '.join(f'{v:.1f}' for v in result['without_s'])} |", "",
             f"Added by those checks: **{result['median_added_s']:.1f} s** (median difference); goal for the whole "
             f"suite: under 40 s ({'met' if result['median_whole_s'] < 40 else 'NOT met'}).", "",
             "| check | status | median time (s) |", "|---|---|---:|"]
    lines += [f"| {name} | {result['statuses'][name]} | {seconds:.1f} |"
              for name, seconds in result["median_check_s"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="target venv python with prebuilt ops (default: build/cached)")
    parser.add_argument("--jit-python", help="target venv python with DeepSpeed built without ops")
    parser.add_argument("--json-out", type=Path, help="write the results here as JSON")
    parser.add_argument("--added", help="comma-separated checks: measure what they add to the suite instead")
    parser.add_argument("--runs", type=int, default=3, help="with --added: runs of each variant")
    args = parser.parse_args(argv)
    if args.added:
        if not args.python or args.runs < 1:
            parser.error("--added needs --python and --runs >= 1")
        result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
                  **measure_added(Path(args.python), args.added, args.runs)}
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
        print(markdown_added(result))
        return 0
    prebuilt, jit = target_venvs(args.python, args.jit_python)
    if shutil.which("deepspeed", path=str(jit.parent)) is None:
        parser.error(f"{jit.parent}/deepspeed not found")
    suite = run_suite(prebuilt)
    isolated = run_suite(prebuilt, "--isolate")
    naive = run_naive(jit)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
              "suite": suite, "isolated": isolated, "naive": naive,
              "ratio_naive_over_suite": round(naive["wall_s"] / suite["wall_s"], 2)}
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
