"""Benchmark the multi-node commands on two test hosts (tests/support/two_hosts.py: network namespaces, own sshd).

- verify: `mlstack-ds verify` on one node (torchrun, 2 ranks) and `verify --hostfile` on 2 nodes x 1 slot
  (DeepSpeed's launcher over pdsh/ssh, shared file system), alternated `--runs` times on the same target;
  medians and their ratio (goal: the 2-node run under 2x the single-node one). Both run the same checks on
  the same 2 cores, so the difference is the multi-node machinery: ssh checks, the launcher, pdsh.
- ssh: the round trip of one `ssh node true` (what every per-node step costs), for the 100-node estimate.
- install (`--install-python PY --cache-dir DIR`): `install --hostfile --no-verify` on 2 nodes from a warm
  wheel cache (goal: under 60 s).

Needs root (namespaces), sshd and pdsh (scripts/test.sh installs them). Writes JSON (`--json-out`) and the
`## multi-node` section of docs/benchmarks.md (`--markdown-out`).
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

import _repo  # noqa: F401  (the tests' support package: the two-host harness)
from benchdoc import publish_result
from support.two_hosts import TwoHosts, head_cli, two_hosts

GOAL_RATIO = 2.0
INSTALL_GOAL_S = 60.0


def timed(hosts: TwoHosts, *args: str | Path) -> float:
    started = time.monotonic()
    result = head_cli(hosts, *args, timeout=1800)
    if result.returncode != 0:
        command = " ".join(map(str, args))
        raise SystemExit(f"mlstack-ds {command} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return time.monotonic() - started


def ssh_round_trip(hosts: TwoHosts, count: int = 10) -> float:
    samples = []
    for _ in range(count):
        started = time.monotonic()
        hosts.ssh(hosts.hosts[1], "true")
        samples.append(time.monotonic() - started)
    return statistics.median(samples)


def measure(python: Path, runs: int, only: str | None, install_python: Path | None, cache_dir: Path | None
            ) -> dict[str, Any]:
    select = ["--only", only] if only else []
    single: list[float] = []
    multi: list[float] = []
    result: dict[str, Any] = {"python": str(python), "checks": only or "all", "runs": runs,
                              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                              "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="mlstack-bench-mn-") as tmp, two_hosts(Path(tmp)) as hosts:
        hostfile = hosts.hostfile(1)
        for _ in range(runs):
            single.append(timed(hosts, "verify", "--python", python, "--world-size", "2", *select))
            multi.append(timed(hosts, "verify", "--hostfile", hostfile, "--python", python, *select))
        result["ssh_round_trip_s"] = ssh_round_trip(hosts)
        if install_python is not None and cache_dir is not None:
            result["install_hostfile_s"] = timed(hosts, "install", "--hostfile", hostfile, "--python", install_python,
                                                 "--cache-dir", cache_dir, "--no-verify")
    result.update(single_s=single, multi_s=multi, single_median_s=statistics.median(single),
                  multi_median_s=statistics.median(multi))
    result["ratio"] = result["multi_median_s"] / result["single_median_s"]
    return result


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "## multi-node",
        "",
        f"Measured by `python scripts/bench.py multinode` on two test hosts of one machine ({result['machine']}; "
        "network namespaces with their own sshd, shared file system), checks: "
        f"{result['checks']}, {result['runs']} alternated run(s) each, medians.",
        "",
        "| what | time | goal |",
        "|---|---|---|",
        f"| `verify`, 1 node x 2 ranks (torchrun) | {result['single_median_s']:.1f} s | |",
        f"| `verify --hostfile`, 2 nodes x 1 slot (DeepSpeed's launcher, pdsh/ssh) | {result['multi_median_s']:.1f} s "
        f"({result['ratio']:.2f}x) | < {GOAL_RATIO:g}x |",
        f"| one `ssh node true` round trip | {result['ssh_round_trip_s'] * 1000:.0f} ms | |",
    ]
    if "install_hostfile_s" in result:
        rows.append("| `install --hostfile --no-verify`, 2 nodes, warm wheel cache | "
                    f"{result['install_hostfile_s']:.1f} s | < {INSTALL_GOAL_S:g} s |")
    rows += ["", "Every run: " + ", ".join(f"{s:.1f}/{m:.1f} s" for s, m in zip(result["single_s"], result["multi_s"],
                                                                                 strict=True))
             + " (single/multi). Load average before: " + ", ".join(f"{v:.2f}" for v in result["load_before"]) + ".",
             ""]
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.py multinode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", type=Path, required=True, help="target interpreter with DeepSpeed installed")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", help="checks to run (default: all)")
    parser.add_argument("--install-python", type=Path, help="a torch-only venv for the install --hostfile timing")
    parser.add_argument("--cache-dir", type=Path, help="a warm mlstack-ds cache for that install")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args(argv)
    result = measure(args.python, args.runs, args.only, args.install_python, args.cache_dir)
    publish_result(result, markdown(result), "## multi-node", args.json_out, args.markdown_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
