"""MLSTACK_TEST_TIMELINE (tests/support/run_timeline.py): every phase of every test, with its worker, span and
CPU, reaches the file through xdist's controller, and the summary names the worker and the costly phase."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.run_timeline import summarise

TESTS = Path(__file__).resolve().parents[1]

SAMPLE = '''
import time
def test_computes():
    deadline = time.process_time() + 0.6
    while time.process_time() < deadline:
        pass
def test_waits():
    time.sleep(0.6)
'''


def test_each_phase_is_logged_with_its_worker_and_cpu(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    timeline = tmp_path / "timeline.jsonl"
    # its own base temp directory: pytest would otherwise clean up old runs of this machine (gigabytes) first
    env = {**os.environ, "MLSTACK_TEST_TIMELINE": str(timeline), "PYTHONPATH": str(TESTS)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                           "-n", "2", "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "basetemp"),
                           str(tmp_path / "test_sample.py")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    phases = [json.loads(line) for line in timeline.read_text().splitlines()]
    calls = {p["nodeid"].split("::")[1]: p for p in phases if p["when"] == "call"}
    assert sorted(calls) == ["test_computes", "test_waits"]
    assert {p["when"] for p in phases} == {"setup", "call", "teardown"}
    assert all(p["worker"] in ("gw0", "gw1") for p in phases), phases
    assert calls["test_computes"]["cpu_s"] >= 0.5
    assert calls["test_waits"]["cpu_s"] < 0.3
    assert all(p["stop"] - p["start"] >= 0.55 for p in calls.values())
    summary = "\n".join(summarise(timeline.read_text().splitlines(), top=1))
    assert "most CPU 1 phases:" in summary
    assert summary.splitlines()[-1].endswith("call     test_sample.py::test_computes")


def test_an_empty_timeline_says_no_test_ran() -> None:
    assert summarise([]) == ["timeline: no test ran"]
