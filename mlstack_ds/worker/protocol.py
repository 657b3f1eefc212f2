"""What a rank writes and how the tool reads it, and the test-only fault injection.

Protocol (read by mlstack_ds/launch/launcher.py):
- every rank appends JSON lines to `DIR/rank<R>.jsonl` as it goes: `{"event": "start", "check": ...}`
  before a check and `{"event": "result", ...}` after it, so a rank that hangs or dies still leaves
  the checks it finished and the one it was in;
- at the end rank 0 gathers every rank's results (through torch.distributed, so remote nodes count
  too) into `DIR/summary.json`.

Fault injection for tests of the absent-failure paths (a real hang or crash cannot be provoked on a
healthy install): `MLSTACK_VERIFY_TEST_FAULT=hang:rank1` or `crash:rank1`, optionally `:<check>` to
fire at the start of that check instead of the first one.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = 1


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
        self.path = Path(out_dir) / f"rank{rank}.jsonl"
        self.records = []

    def write(self, record):
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if record.get("event") == "result":
            self.records.append(record)


def die_with_parent():
    """Ask Linux to SIGKILL this rank when its launcher dies, so a killed launch leaves no orphans."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def parse_fault(spec, rank):
    """`hang:rank1[:check]` -> ("hang", check or None) for rank 1; None for other ranks."""
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] not in ("hang", "crash") or parts[1] != f"rank{rank}":
        return None
    return parts[0], (parts[2] if len(parts) > 2 else None)


def fire_fault(fault, check, first):
    if fault is None or (fault[1] is None and not first) or (fault[1] is not None and fault[1] != check):
        return
    if fault[0] == "crash":
        sys.stderr.write(f"verify worker: injected crash before {check}\n")
        sys.stderr.flush()
        os._exit(17)
    while True:  # hang: only the launch time-out ends this
        time.sleep(3600)
