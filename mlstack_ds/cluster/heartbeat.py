"""`python -m mlstack_ds.cluster.heartbeat -- ARGV...` on a node: ARGV, and a line on stderr every few seconds
while it runs, so that the head can tell a node that still answers from one that went away.

Why: srun forwards a task's output as it comes, but says nothing when the task's node stops answering (its
link or its power gone): it waits for the task until slurmctld marks the node down, SlurmdTimeout later
(measured: `install --slurm` still waiting 700 s after node b's link went down, sinfo `mixed*` from 5 min on).
ssh has ServerAlive for this (cluster/remote.py); srun has nothing a task can use, so the task brings its own.
The head takes these lines as the node's sign of life (runner.run's `stall_on_stderr`, patience.WAITS["silent
node"]) and drops them from what the node said (`without_beats`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mlstack_ds import runner

BEAT = "mlstack-ds: node alive"
BEAT_EVERY_S = 5.0  # far under WAITS["silent node"]: a node is taken for lost only after many missed beats


def without_beats(text: str) -> str:
    """`text` (a node's stderr as srun forwarded it) without the heartbeat's lines."""
    return "".join(line for line in text.splitlines(keepends=True) if line.rstrip("\n") != BEAT)


def main(argv: Sequence[str]) -> int:
    """`[--every SECONDS] -- COMMAND...`: COMMAND with this process's stdin, stdout and stderr, a beat at once
    (the node answered) and every SECONDS after; COMMAND's exit code."""
    every_s, rest = BEAT_EVERY_S, list(argv)
    if rest[:1] == ["--every"] and len(rest) > 1:
        every_s, rest = float(rest[1]), rest[2:]
    command = rest[1:] if rest[:1] == ["--"] else rest
    if not command or not every_s > 0:
        sys.stderr.write("usage: python -m mlstack_ds.cluster.heartbeat [--every SECONDS] -- COMMAND [ARG...]\n")
        return 2

    def beat() -> None:
        sys.stderr.write(BEAT + "\n")
        sys.stderr.flush()

    beat()
    return runner.run_beating(command, every_s=every_s, beat=beat)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
