"""hf_trainer for real: the HF Trainer on the target's DeepSpeed, 2 CPU ranks, against a plain Trainer.

It needs a target interpreter with torch, DeepSpeed (cpu_adam/fused_adam prebuilt), transformers and
accelerate, which no fixture builds (that would download transformers on every CI run): point
MLSTACK_TEST_HF_PYTHON at one to run these (e.g. a venv from `mlstack-ds install` plus `pip install
transformers accelerate -c <constraints holding torch>`). MLSTACK_TEST_NO_HF_PYTHON, a target with
DeepSpeed but no transformers, runs the skip test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlstack_ds.verify import launch
from mlstack_ds.verify.worker import hf_checks

pytestmark = pytest.mark.slow


def target_from_env(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"{variable} is not set (a target interpreter for this test)")
    return Path(value)


def verify_json(python: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mlstack_ds", "verify", "--python", str(python), "--json", *args],
                          capture_output=True, text=True, timeout=900, check=False)
    return json.loads(proc.stdout)


def test_trainer_with_zero2_and_zero3_matches_a_plain_trainer() -> None:
    report = verify_json(target_from_env("MLSTACK_TEST_HF_PYTHON"), "--only", "hf_trainer", "--timeout", "600")
    (check,) = report["checks"]
    assert check["status"] == "pass", check
    details = check["details"]
    assert "MULTI_" in details["plain"]["distributed_type"]  # the reference is DDP over the same ranks
    for stage in ("zero2", "zero3"):
        run = details[stage]
        assert run["filled"]["train_batch_size"] == hf_checks.MICRO_BATCH * report["world_size"]
        assert run["max_loss_deviation"] <= 1e-5 and run["param_relative_distance"] <= hf_checks.HF_PARAM_RTOL
    assert details["plain"]["losses"][-1] < details["plain"]["losses"][0] - 0.1  # it trains visibly


def test_trainers_leave_nothing_behind_for_later_checks(tmp_path: Path) -> None:
    """Twice in one process, then DeepSpeed engines of its own: everything still passes."""
    python = target_from_env("MLSTACK_TEST_HF_PYTHON")
    order = ["hf_trainer", "hf_trainer", "zero2", "zero3"]
    staged = launch.stage_worker(tmp_path / "code")
    run_id = launch.new_run_id()
    argv = launch.torchrun_argv(python, 2, launch.free_port(),
                                launch.worker_args(order, tmp_path / "out", 600, run_id))
    outcome = launch.run_launch(argv, timeout_s=900, run_id=run_id,
                                env=launch.worker_env({**os.environ, "DS_ACCELERATOR": "cpu"}, staged))
    assert outcome.returncode == 0, outcome.log_tail
    for rank in (0, 1):
        lines = (tmp_path / "out" / f"rank{rank}.jsonl").read_text(encoding="utf-8").splitlines()
        results = [json.loads(line) for line in lines if '"event": "result"' in line]
        assert [(r["check"], r["status"]) for r in results] == [(name, "pass") for name in order], results


def test_without_transformers_it_skips_saying_how_to_install_it() -> None:
    report = verify_json(target_from_env("MLSTACK_TEST_NO_HF_PYTHON"), "--only", "hf_trainer")
    (check,) = report["checks"]
    assert check["status"] == "skip" and check["reason"].startswith(hf_checks.MISSING), check
