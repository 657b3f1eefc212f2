"""The run's timeline: when each test phase ran, on which worker, and the CPU its process and children used.

Why: CI's budget is wall time on two cores, and pytest's `--durations` tells neither which worker was the
critical path, nor whether a long test computed or waited. With MLSTACK_TEST_TIMELINE set to a file,
each phase's report becomes one JSON line there as it happens (so a killed run keeps what it did);
`summarise` turns the lines into the few numbers that say where the time went (scripts/test_timeline.py).

The CPU of a phase is the growth of this process's own CPU time and its reaped children's (getrusage): a
child reaped later (a background install's) counts towards the phase that reaped it, and what a daemon
starts for a test (sshd's or slurmd's processes on the two-host harness) counts nowhere.
"""

from __future__ import annotations

import json
import resource
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pytest

TIMELINE_ENV = "MLSTACK_TEST_TIMELINE"
CPU_PROPERTY = "mlstack-cpu-s"


def cpu_seconds() -> float:
    """User and system time of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class PhaseCpu:
    """In the process that runs the tests: each phase's report carries the CPU used since the previous one
    (as a user property, which xdist passes to the controller with the report)."""

    def __init__(self) -> None:
        self.last = cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
        outcome = yield
        now = cpu_seconds()
        outcome.get_result().user_properties.append((CPU_PROPERTY, round(now - self.last, 2)))
        self.last = now


class TimelineLog:
    """In the process that sees every report (pytest's own, or xdist's controller): one line per phase."""

    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # xdist's controller: the worker that ran it
        worker = node.gateway.id if node is not None else "main"
        cpu = dict(report.user_properties).get(CPU_PROPERTY)
        line = {"nodeid": report.nodeid, "when": report.when, "worker": worker, "start": round(report.start, 2),
                "stop": round(report.stop, 2), "cpu_s": cpu, "outcome": report.outcome}
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


@dataclass
class Worker:
    first: float = float("inf")
    last: float = 0.0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    tests: set[str] = field(default_factory=set)


def summarise(lines: Iterable[str], top: int = 12) -> list[str]:
    """Per worker: span, time in tests, CPU; then the phases that took longest and those that used most CPU."""
    phases = [json.loads(line) for line in lines if line.strip()]
    if not phases:
        return ["timeline: no test ran"]
    workers: dict[str, Worker] = defaultdict(Worker)
    for phase in phases:
        worker = workers[phase["worker"]]
        worker.first, worker.last = min(worker.first, phase["start"]), max(worker.last, phase["stop"])
        worker.busy_s += phase["stop"] - phase["start"]
        worker.cpu_s += phase["cpu_s"] or 0.0
        worker.tests.add(phase["nodeid"])
    begin = min(w.first for w in workers.values())
    out = ["timeline (s from the first test): worker, tests, ends at, in tests, CPU of its processes"]
    out += [f"  {name}: {len(w.tests)} tests, ends {w.last - begin:.0f}, in tests {w.busy_s:.0f}, cpu {w.cpu_s:.0f}"
            for name, w in sorted(workers.items())]

    def row(phase: dict) -> str:
        return (f"  {phase['stop'] - phase['start']:7.1f} s  cpu {phase['cpu_s'] or 0:7.1f}  {phase['worker']}  "
                f"at {phase['start'] - begin:5.0f}  {phase['when']:8} {phase['nodeid']}")

    out.append(f"longest {top} phases (wall, cpu, worker, start):")
    out += [row(p) for p in sorted(phases, key=lambda p: p["start"] - p["stop"])[:top]]
    out.append(f"most CPU {top} phases:")
    out += [row(p) for p in sorted(phases, key=lambda p: -(p["cpu_s"] or 0))[:top]]
    return out


def main(argv: list[str]) -> int:
    """`python tests/support/run_timeline.py FILE`: print the summary of a timeline (scripts/test.sh does)."""
    if len(argv) != 1:
        print("usage: run_timeline.py TIMELINE.jsonl")
        return 2
    with open(argv[0], encoding="utf-8") as lines:
        print("\n".join(summarise(lines)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
