"""The worker's pure parts: fault-injection parsing and the loss-curve judgement (issue 8)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time

import pytest

from mlstack_ds.worker import protocol, training


@pytest.mark.parametrize(("spec", "rank", "expected"), [
    ("", 1, None),
    ("hang:rank1", 1, ("hang", None)),
    ("hang:rank1", 0, None),
    ("crash:rank0:zero3", 0, ("crash", "zero3")),
    ("explode:rank0", 0, None),
    ("crash", 0, None),
])
def test_parse_fault(spec: str, rank: int, expected: tuple[str, str | None] | None) -> None:
    assert protocol.parse_fault(spec, rank) == expected


def test_matching_curves_pass() -> None:
    assert training.compare_curves([5.5, 5.1, 4.8], [5.5, 5.1000001, 4.8000002], training.LOSS_RTOL) is None


def test_nan_is_reported_with_its_step() -> None:
    message = training.compare_curves([5.5, 5.1, math.nan], [5.5, 5.1, 4.8], training.LOSS_RTOL)
    assert message is not None and message.startswith("step 3: loss is nan")


def test_quiet_deviation_is_reported_with_its_step() -> None:
    # the race's "quietly wrong" symptom from zero3-cpu-race.md: 1.1747 where 0.789 is right
    message = training.compare_curves([0.9, 1.1747], [0.9, 0.789], training.LOSS_RTOL, first_step=3)
    assert message is not None and message.startswith("step 4: loss 1.174700 deviates")


def test_spike_is_caught() -> None:
    assert training.compare_curves([20348826.0], [0.789], training.LOSS_RTOL) is not None


def test_the_worker_leaves_without_interpreter_finalization() -> None:
    """A rank's results are on disk before it ends; finalization would only give a gloo worker thread the
    chance to abort the rank (`terminate called without an active exception`, docs/abort-at-exit.md), which
    destroy_process_group() does not always prevent. So no atexit handler of the rank's runs."""
    script = ("import atexit, runpy, sys\n"
              "atexit.register(lambda: print('FINALIZED', flush=True))\n"
              "sys.argv = ['mlstack_verify_worker', '--list']\n"
              "runpy.run_module('mlstack_ds.worker', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0]) and "FINALIZED" not in done.stdout


def _events(path) -> list[str]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] if path.exists() else []


def test_an_import_that_computes_writes_working_lines(tmp_path) -> None:
    """A rank importing torch on a throttled node computes for minutes without any other line: the beats are
    the stall rule's only sign of it (the slow-node tests of tests/multinode failed without them)."""
    log = protocol.ResultLog(tmp_path, 1)
    with protocol.import_beats(log, 1, interval_s=0.05):
        until = time.process_time() + 0.6
        while time.process_time() < until:
            pass
    events = _events(log.path)
    assert len(events) >= 3 and set(events) == {"working"}, events


def test_an_import_that_waits_writes_nothing(tmp_path) -> None:
    """Blocked (on a lock, a dead file system) is not progress: no line, so it stays a stall."""
    log = protocol.ResultLog(tmp_path, 0)
    with protocol.import_beats(log, 0, interval_s=0.05):
        time.sleep(0.6)
    assert _events(log.path) == []


def test_progress_lines_go_to_the_ranks_file_where_there_is_one(tmp_path) -> None:
    from mlstack_ds.worker.context import Context

    args = argparse.Namespace(out=str(tmp_path), receipt=str(tmp_path / "none.json"))
    log = protocol.ResultLog(tmp_path, 1)
    Context(args, 1, 2, log=log).progress("step", step=3)
    Context(args, 1, 2).progress("step", step=4)  # bench's context has no log: nothing, no error
    assert [json.loads(line) for line in log.path.read_text().splitlines()] == [
        {"event": "step", "rank": 1, "step": 3}]
