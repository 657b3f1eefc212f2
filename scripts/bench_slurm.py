"""Benchmark `verify --slurm` on the two-node test cluster (tests/support/slurm_cluster.py) against one node.

- single: `mlstack-ds verify --world-size 2` on the login node (node a), outside any allocation: torchrun,
  both ranks on one node.
- slurm: `salloc -N2 -- mlstack-ds verify --slurm` on the login node: the per-node check step, then one srun
  task per rank, one rank on each node.
Alternated `--runs` times on the same target, with the same checks; medians and their ratio (issue 29's goal:
the 2-node run under 2x the single-node one). Both run on the same 2 cores, so the difference is what Slurm
adds: the allocation, the check step, srun's task launch and the cross-namespace rendezvous.

Needs root (namespaces) and the Slurm daemons (scripts/test.sh installs them). Writes JSON (`--json-out`)
and the `## Slurm` section of docs/benchmarks.md (`--markdown-out`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _repo
from benchdoc import publish_result
from support.cli import cli_argv
from support.slurm_cluster import SlurmCluster, slurm_cluster

GOAL_RATIO = 2.0


def timed(slurm: SlurmCluster, argv: list[str], allocate: bool) -> float:
    """Seconds for ARGV on the login node (inside `salloc -N2` when `allocate`); a failure stops the benchmark."""
    env = {**os.environ, "PYTHONPATH": str(_repo.REPO)}
    if not allocate:
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    started = time.monotonic()
    done = slurm.salloc(argv, env=env, timeout=1800) if allocate else slurm.run_in(slurm.login, argv, env=env,
                                                                                   timeout=1800)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed


def measure(python: Path, runs: int, only: str | None) -> dict[str, Any]:
    select = ["--only", only] if only else []
    single: list[float] = []
    multi: list[float] = []
    result: dict[str, Any] = {"python": str(python), "checks": only or "all", "runs": runs,
                              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                              "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="mlstack-bench-slurm-") as tmp, slurm_cluster(Path(tmp)) as slurm:
        for _ in range(runs):
            single.append(timed(slurm, cli_argv("verify", "--python", python, "--world-size", "2", *select),
                                allocate=False))
            multi.append(timed(slurm, cli_argv("verify", "--slurm", "--python", python, *select), allocate=True))
    result.update(single_s=single, slurm_s=multi, single_median_s=statistics.median(single),
                  slurm_median_s=statistics.median(multi), load_after=os.getloadavg())
    result["ratio"] = result["slurm_median_s"] / result["single_median_s"]
    return result


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "## Slurm",
        "",
        "Measured by `python scripts/bench.py slurm` on the two-node test cluster of one machine "
        f"({result['machine']}; munged, slurmctld and a slurmd in each of two network namespaces, shared file "
        f"system), checks: {result['checks']}, {result['runs']} alternated run(s) each, medians. The Slurm time "
        "includes `salloc` granting the allocation.",
        "",
        "| what | time | goal |",
        "|---|---|---|",
        f"| `verify`, 1 node x 2 ranks (torchrun) | {result['single_median_s']:.1f} s | |",
        f"| `salloc -N2 -- verify --slurm`, 2 nodes x 1 rank (srun task per rank) | {result['slurm_median_s']:.1f} s "
        f"({result['ratio']:.2f}x) | < {GOAL_RATIO:g}x |",
        "",
        "Every run: " + ", ".join(f"{s:.1f}/{m:.1f} s" for s, m in zip(result["single_s"], result["slurm_s"],
                                                                       strict=True))
        + " (single/Slurm). Load average before: " + ", ".join(f"{v:.2f}" for v in result["load_before"])
        + "; after: " + ", ".join(f"{v:.2f}" for v in result["load_after"]) + ".",
        "",
    ]
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py slurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", type=Path, required=True, help="target interpreter with DeepSpeed installed")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", help="checks to run (default: all)")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args(argv)
    result = measure(args.python, args.runs, args.only)
    publish_result(result, markdown(result), "## Slurm", args.json_out, args.markdown_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
