"""The worker's check table, as the staged copy reports it in another interpreter, is the tool's table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mlstack_ds.launch import launcher
from mlstack_ds.verify.checks import CHECKS


def test_staged_worker_lists_the_tools_table(tmp_path: Path) -> None:
    staged = launcher.stage_worker(tmp_path)
    env = launcher.worker_env({"PATH": "/usr/bin:/bin"}, staged)
    # -I would drop PYTHONPATH; -s keeps the user's site out; run from an unrelated directory so nothing of
    # the repository is importable except the staged copy.
    proc = subprocess.run([sys.executable, "-s", "-m", launcher.WORKER_MODULE, "--list"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert [row["name"] for row in listed] == [spec.name for spec in CHECKS]
    for row, spec in zip(listed, CHECKS, strict=True):
        assert (row["summary"], tuple(row["needs"]), row["default"], row["launch"]) == (
            spec.summary, spec.needs, spec.default, spec.launch)


def test_every_check_has_a_unique_name_a_summary_and_a_runner() -> None:
    from mlstack_ds.worker.registry import all_checks

    checks = all_checks()
    assert len({c.name for c in checks}) == len(checks)
    assert all(c.summary and callable(c.run) and c.needs for c in checks)


def test_worker_without_arguments_is_a_usage_error(tmp_path: Path) -> None:
    staged = launcher.stage_worker(tmp_path)
    proc = subprocess.run([sys.executable, "-s", "-m", launcher.WORKER_MODULE], capture_output=True, text=True,
                          env=launcher.worker_env({"PATH": "/usr/bin:/bin"}, staged), cwd=tmp_path, check=False,
                          timeout=60)
    assert proc.returncode == 2 and "--checks and --out are required" in proc.stderr
