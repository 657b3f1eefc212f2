"""What a rank writes and how the tool reads it, and the test-only fault injection.

One result protocol for every entry of the worker (the check suite and bench), read by the tool through
this module (mlstack_ds/launch/session.py imports it; it needs nothing beyond the standard library):
- every rank appends JSON lines to `DIR/rank<R>.jsonl` (`ResultLog`), each with an `event`; the checks
  write `hello` at start, `imported` once torch and DeepSpeed are, `{"event": "start", "check": ...}`
  before a check and `{"event": "result", ...}` after it, so a rank that hangs or dies still leaves the
  checks it finished and the one it was in, and the tool sees each step as progress; in between, a
  training check writes `engine` and one `step` per step (each after a collective, so a rank stuck on a
  lost peer writes none), and an import that computes writes `working` now and then (`import_beats`):
  on a node ten times slower than the others those are minutes without any other line;
  bench writes one `{"event": "bench", ...}` line with its measurements or why it stopped;
- at the end of the checks rank 0 gathers every rank's results (through torch.distributed, so remote
  nodes count too) into `DIR/summary.json`; bench's rank 0 appends its steps to `DIR/progress.jsonl`.
Nodes that do not share the head's file system are fetched `RESULTS_GLOB` back after a launch.

Fault injection for tests of the absent-failure paths (a real hang or crash cannot be provoked on a
healthy install): `MLSTACK_VERIFY_TEST_FAULT=hang:rank1` or `crash:rank1`, optionally `:<check>` to
fire at the start of that check instead of the first one; `slow:rank1[:<check>]` makes that rank take
`SLOW_FAULT_S` longer over every check (or the named one), like a machine busy with other work.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = 1
SLOW_FAULT_S = 60.0
RESULTS_GLOB = "rank*.jsonl"
SUMMARY_FILE = "summary.json"
PROGRESS_FILE = "progress.jsonl"
# `import_beats`: every BEAT_INTERVAL_S, a `working` line if the rank used at least this share of one CPU
# meanwhile. A rank at a tenth of a CPU (a throttled node) uses 10 %; one blocked on a file lock or a
# dead file system, next to nothing.
BEAT_INTERVAL_S = 5.0
BEAT_MIN_CPU_SHARE = 0.02


def rank_file(out_dir, rank):
    return Path(out_dir) / f"rank{rank}.jsonl"


def read_rank_file(out_dir, rank):
    """Every whole record one rank wrote, in order (none when it wrote nothing; a line cut off by its death
    is left out)."""
    path = rank_file(out_dir, rank)
    records = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
    return records


def read_summary(out_dir):
    """Rank 0's gathered results (`summary.json`), or None when it wrote none."""
    path = Path(out_dir) / SUMMARY_FILE
    with contextlib.suppress(ValueError, OSError):
        summary = json.loads(path.read_text(encoding="utf-8"))
        return summary if isinstance(summary, dict) else None
    return None


@dataclass(frozen=True)
class Check:
    """One row of the check table: the tool shows `summary`, plans launches by `launch`, selects by
    `default`; `run(ctx)` returns details for the report, or raises SkipCheck/CheckFailed."""

    name: str
    summary: str
    needs: tuple[str, ...]  # what it exercises: "torch", "deepspeed", "distributed", "op:<name>", "pkg:<name>"
    run: Callable[[Any], dict | None]
    default: bool = True
    launch: str = "shared"

    def row(self) -> dict:
        return {"name": self.name, "summary": self.summary, "needs": list(self.needs), "default": self.default,
                "launch": self.launch}


class SkipCheck(Exception):
    """The check does not apply here; the message is the reason."""


class CheckFailed(Exception):
    """The check ran and found a problem; `details` go into the report."""

    def __init__(self, reason, details=None):
        super().__init__(reason)
        self.details = details or {}


class JitBuildRefused(RuntimeError):
    """DeepSpeed tried to compile an op at run time; the suite treats that as a failure."""


class ResultLog:
    """Append-only JSON lines for one rank: survives a hang or crash of this process."""

    def __init__(self, out_dir, rank):
        self.path = rank_file(out_dir, rank)
        self.records = []
        self._lock = threading.Lock()  # import_beats writes from a thread of its own

    def write(self, record):
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if record.get("event") == "result":
            self.records.append(record)


@contextlib.contextmanager
def import_beats(log, rank, interval_s=BEAT_INTERVAL_S, min_cpu_share=BEAT_MIN_CPU_SHARE):
    """While the block runs, a `working` line every `interval_s` in which this process used CPU.

    For the imports only: torch and DeepSpeed take a few CPU seconds, minutes on a throttled or busy node,
    and nothing else can be written meanwhile, so the tool's stall rule would see a healthy slow rank as a
    stall. CPU, not the clock: an import blocked on a lock writes nothing and stays a stall. Never around
    collectives: a GPU rank waiting on a lost peer can spin a CPU, which is not progress."""
    stop = threading.Event()

    def beat():
        last = time.process_time()
        while not stop.wait(interval_s):
            now = time.process_time()
            if now - last >= interval_s * min_cpu_share:
                with contextlib.suppress(OSError):
                    log.write({"event": "working", "rank": rank, "cpu_s": round(now, 2)})
            last = now

    thread = threading.Thread(target=beat, name="mlstack-import-beats", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def die_with_parent():
    """Ask Linux to SIGKILL this rank when its launcher dies, so a killed launch leaves no orphans."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def parse_fault(spec, rank):
    """`hang:rank1[:check]` -> ("hang", check or None) for rank 1; None for other ranks."""
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] not in ("hang", "crash", "slow") or parts[1] != f"rank{rank}":
        return None
    return parts[0], (parts[2] if len(parts) > 2 else None)


def fire_fault(fault, check, first):
    if fault is not None and fault[0] == "slow" and fault[1] in (None, check):
        time.sleep(SLOW_FAULT_S)
        return
    if fault is None or (fault[1] is None and not first) or (fault[1] is not None and fault[1] != check):
        return
    if fault[0] == "crash":
        sys.stderr.write(f"verify worker: injected crash before {check}\n")
        sys.stderr.flush()
        os._exit(17)
    while True:  # hang: only the launch time-out ends this
        time.sleep(3600)
