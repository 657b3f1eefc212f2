"""scripts/test.sh runs the suite on two pytest-xdist workers with `--dist loadgroup`; tests/conftest.py puts the
tests that must share one process (the cold installs' and the multi-node harness's) in one xdist group. This
checks that the installed pytest and pytest-xdist honour such a group (pytest 9.2 with xdist 3.8 does not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SAMPLE = '''
import json, os, time
import pytest

def record(name):
    with open(os.environ["WORKERS_LOG"], "a") as out:
        out.write(json.dumps([name, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
    time.sleep(0.3)  # long enough for the other worker to ask for work meanwhile

@pytest.mark.parametrize("n", range(4))
@pytest.mark.xdist_group("serial")
def test_grouped(n):
    record(f"grouped-{n}")

@pytest.mark.parametrize("n", range(8))
def test_free(n):
    record(f"free-{n}")
'''


def test_an_xdist_group_runs_on_one_worker_and_the_rest_on_both(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    log = tmp_path / "workers.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                           "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "WORKERS_LOG": str(log)},
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    grouped = {worker for name, worker in ran if name.startswith("grouped-")}
    assert len([name for name, _ in ran]) == 12
    assert len(grouped) == 1, f"the group was split over workers {sorted(grouped)}: {ran}"
    assert {worker for _, worker in ran} == {"gw0", "gw1"}, ran
