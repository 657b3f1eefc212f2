"""The hf_trainer check's pure parts, in the test venv (torch, no transformers, no DeepSpeed): the guide-style
"auto" configs, the parameter distance it judges by, the environment it restores, and its skip reason."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from mlstack_ds.worker import hf_checks, registry
from mlstack_ds.worker.protocol import SkipCheck

GUIDE_AUTO = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
              "fp16.enabled", "bf16.enabled", "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
              "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr",
              "scheduler.params.warmup_num_steps", "zero_optimization.reduce_bucket_size"}
STAGE3_AUTO = {"zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold"}


def test_configs_leave_to_the_trainer_what_the_guide_leaves() -> None:
    assert set(hf_checks.auto_left(hf_checks.hf_ds_config(2))) == GUIDE_AUTO
    assert set(hf_checks.auto_left(hf_checks.hf_ds_config(3))) == GUIDE_AUTO | STAGE3_AUTO
    assert hf_checks.hf_ds_config(3)["zero_optimization"]["stage"] == 3


def test_auto_left_finds_nothing_in_a_filled_config() -> None:
    assert hf_checks.auto_left({"a": 1, "b": {"c": [0.9, 0.99], "d": "cpu"}}) == []
    assert hf_checks.auto_left({"b": {"c": "auto"}}) == ["b.c"]


def test_rounding_noise_on_a_few_elements_is_far_inside_the_tolerance() -> None:
    initial = [torch.zeros(1000, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)]
    plain = [torch.full((1000,), 0.02, dtype=torch.float64), torch.full((64,), 0.02, dtype=torch.float64)]
    # Adam turns gradient noise into lr-sized steps on elements whose exact gradient is zero
    noisy = [plain[0].clone(), plain[1].clone()]
    noisy[1][:2] += 1e-5
    relative, largest = hf_checks.param_distance(noisy, plain, initial)
    assert relative < hf_checks.HF_PARAM_RTOL / 10 and largest == pytest.approx(1e-5)


def test_a_wrong_update_of_the_whole_model_is_caught() -> None:
    initial = [torch.zeros(1000, dtype=torch.float64)]
    plain = [torch.full((1000,), 0.02, dtype=torch.float64)]
    skipped_one_step = [torch.full((1000,), 0.015, dtype=torch.float64)]
    relative, _ = hf_checks.param_distance(skipped_one_step, plain, initial)
    assert relative == pytest.approx(0.25) and relative > hf_checks.HF_PARAM_RTOL


def test_environment_is_restored_after_a_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLSTACK_HF_TEST_KEPT", "before")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    with hf_checks.restored_environ():
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # what accelerate leaves behind
        os.environ["MLSTACK_HF_TEST_KEPT"] = "changed"
    assert "ACCELERATE_USE_DEEPSPEED" not in os.environ and os.environ["MLSTACK_HF_TEST_KEPT"] == "before"


def test_without_transformers_the_check_skips_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # what an absent package looks like to import
    with hf_checks.restored_environ(), pytest.raises(SkipCheck) as info:  # import_hf sets the offline variables
        hf_checks.import_hf(torch)
    reason = str(info.value)
    assert reason.startswith(hf_checks.MISSING)
    # the one command that adds it, with torch held at the version installed
    assert f"{sys.executable} -m pip install transformers accelerate torch=={torch.__version__} " in reason
    assert "--with-clients" in reason


def test_hf_trainer_runs_after_the_zero_checks_and_says_what_it_needs() -> None:
    names = [check.name for check in registry.all_checks()]
    assert names.index("hf_trainer") > names.index("checkpoint")
    assert registry.by_name()["hf_trainer"].needs == ("deepspeed", "distributed", "pkg:transformers")
