"""`mlstack-ds config` and `verify --config` on the installed target (`installed_target`: DeepSpeed 0.19.5 from
`mlstack-ds install`, patched, CPU ops prebuilt, transformers and accelerate): a planned config proven on
2 CPU ranks, and `--hf`'s round trip through transformers' HfTrainerDeepSpeedConfig, which the integration
tests' target (no_ops_venv, no transformers) cannot do.

The plan is made on a replayed RX 7900 XTX (`rocminfo_gfx1100_rocm-issue-3949.txt`, as in
tests/integration/test_config_cli.py): gfx1100 computes bf16, which the CPU ranks run (an fp16 plan, what an
unknown GPU gets, would be skipped by the check on the CPU accelerator).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.cli import run_cli
from support.config import MODEL, ask, placement_configs
from support.e2e import Target
from support.fakemachine import FakeMachine

import mlstack_ds
from mlstack_ds.config.rules import ORDER

# Only reads the installed target: runs beside the tests that change it (tests/conftest.py: target_access).
pytestmark = [pytest.mark.slow, pytest.mark.reads_target]

CAPTURE = "rocminfo_gfx1100_rocm-issue-3949.txt"
PACKAGE_PARENT = str(Path(mlstack_ds.__file__).resolve().parents[1])
# 1.3B on 2 GPUs of 8 GiB: the activations (4.1 GiB at 2048 tokens) leave no room for ZeRO-2 or for ZeRO-3
# without offload; ZeRO-3 with the optimizer in host RAM fits (6.3 of 6.8 GiB usable).
PLAN_ARGS = ("1.3b", "--gpus", "2", "--vram", "8GiB", "--ram", "64GiB")


def test_a_planned_zero3_offload_config_passes_verify_on_two_ranks(installed_target: Target, tmp_path: Path) -> None:
    """`config --out FILE` writes a ZeRO-3 + CPU-offload bf16 plan; `verify --config FILE` trains the suite's
    model under it on 2 ranks (one launch) and matches the torch reference, listing what it replaced."""
    machine = FakeMachine(tmp_path / "rx7900xtx")
    machine.tool("rocminfo", CAPTURE)
    machine.extra_env["PYTHONPATH"] = PACKAGE_PARENT  # the mlstack_ds under test, whichever checkout
    out = tmp_path / "ds_config.json"
    planned = run_cli("config", *PLAN_ARGS, "--python", installed_target.python, "--out", out, "--json",
                      base_env=machine.environ(), timeout=300)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["validated"] is True and plan["hardware"]["arch"] == "gfx1100", plan["hardware"]
    config = json.loads(out.read_text())
    assert config == plan["config"]
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and "offload_param" not in zero
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    assert "amd_specific" in config  # the installed DeepSpeed carries patch 0014

    verified = run_cli("verify", "--python", installed_target.python, "--config", out, "--json", timeout=600,
                       columns=200)
    report = json.loads(verified.stdout)
    sys.stderr.write(f"\n[config e2e] verify --config {report['duration_s']:.1f} s\n")
    assert verified.returncode == 0, (verified.stderr[-3000:], report)
    assert report["ok"] is True and report["world_size"] == 2
    assert [launch["checks"] for launch in report["launches"]] == [["config"]]  # alone: only the config check
    [check] = report["checks"]
    # The installed target has the ZeRO-3 all-gather fix (patch 0001): a pass, not the race's failure.
    assert check["name"] == "config" and check["status"] == "pass", check
    assert check["ranks"] == {"0": "pass", "1": "pass"}
    details = check["details"]
    assert (details["stage"], details["offload"], details["precision"]) == (3, ["offload_optimizer"], "bf16")
    assert details["ranks_agree"] is True and details["steps"] == len(details["losses"])
    assert details["param_share"] == 0.5 and details["partitioned_params"] > 0  # ZeRO-3 really partitioned
    # Kept as planned: stage, offload, precision, buckets, gradient clipping (1.0, the suite's too) and the
    # accumulation steps (1); replaced for the comparison, and named: the batch and the optimizer.
    assert details["replaced_for_the_comparison"] == ["train_micro_batch_size_per_gpu", "optimizer",
                                                      "train_batch_size"]


def test_hf_auto_values_are_filled_the_way_the_trainer_does(installed_target: Target) -> None:
    """Every placement's `--hf` config goes through HfTrainerDeepSpeedConfig in the target, and what the
    Trainer filled is what the plan assumed."""
    answer = ask(Path(installed_target.python), placement_configs(hf=True), hf=True)
    assert all(v.ok for v in answer.validations), answer.validations
    assert all("HfTrainerDeepSpeedConfig" in v.hf for v in answer.validations), answer.validations
    # What the Trainer filled: the batch keys from its arguments (the planning host is one rank), the
    # buckets from the hidden size (trainer_config_finalize), the optimizer from its defaults.
    stage3 = answer.validations[ORDER.index((3, False, False))].filled
    assert stage3 is not None
    hidden = MODEL.hidden
    assert stage3["zero_optimization"]["reduce_bucket_size"] == hidden * hidden
    assert stage3["zero_optimization"]["stage3_prefetch_bucket_size"] == int(0.9 * hidden * hidden)
    assert stage3["zero_optimization"]["stage3_param_persistence_threshold"] == 10 * hidden
    assert (stage3["train_micro_batch_size_per_gpu"], stage3["gradient_accumulation_steps"]) == (2, 1)
    assert stage3["bf16"]["enabled"] is True and stage3["optimizer"]["params"]["lr"] == 5e-5
    assert "auto" not in json.dumps([v.filled for v in answer.validations])  # nothing left to the Trainer
