"""DeepSpeed's own answers in a real target (`no_ops_venv`): its estimators, its config parser's verdict
naming the key, and with `--hf` and no transformers in the target (no_ops_venv has none) the "auto" values
parsed as DeepSpeed's defaults, saying so. The round trip through transformers' HfTrainerDeepSpeedConfig
runs on the installed target, which has transformers (tests/e2e/test_config_e2e.py).

One start of the target per request (imports take seconds), so each test sends all its configs at once.
"""

from __future__ import annotations

from pathlib import Path

from support.cli import run_cli
from support.config import MODEL, ask, placement_configs
from support.target_env import TargetVenv

from mlstack_ds.config.rules import ORDER

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
# Configs DeepSpeed 0.19.5 refuses, and the key its error must be reported under.
REJECTED = [
    ({**BASE, "zero_optimization": {"stage": 2, "reduce_bucket_size": -1}}, "zero_optimization.reduce_bucket_size"),
    ({**BASE, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}},
     "zero_optimization.offload_optimizer.device"),
    ({**BASE, "bf16": {"enabled": "yes please"}}, "bf16.enabled"),
    ({**BASE, "zero_optimization": {"stage": 2, "overlap_com": True}}, "zero_optimization.overlap_com"),
]


def test_every_placement_parses_and_rejections_name_the_key(no_ops_venv: TargetVenv) -> None:
    answer = ask(no_ops_venv.python, placement_configs(hf=False) + [c for c, _ in REJECTED])
    assert answer.deepspeed == "0.19.5" and answer.amd_specific is False  # upstream: no patch 0014
    by_placement = {(e.stage, e.offload_optimizer, e.offload_param): e for e in answer.estimates}
    assert sorted(by_placement) == sorted(ORDER)
    # DeepSpeed's formula, stated: ZeRO-2 without offload holds 2 + 18/N bytes per parameter per GPU.
    assert by_placement[(2, False, False)].gpu == 2 * MODEL.params + int(18 * MODEL.params / 2)
    placements, rejected = answer.validations[:len(ORDER)], answer.validations[len(ORDER):]
    assert all(v.ok for v in placements), placements
    for validation, (_, key) in zip(rejected, REJECTED, strict=True):
        assert not validation.ok and validation.key == key, validation
        assert validation.message


def test_hf_auto_values_without_transformers_are_parsed_as_deepspeeds_defaults(no_ops_venv: TargetVenv) -> None:
    """No transformers in the target: every placement still parses, and each verdict says the "auto" values
    were DeepSpeed's defaults, not the Trainer's round trip."""
    answer = ask(no_ops_venv.python, placement_configs(hf=True), hf=True)
    assert all(v.ok for v in answer.validations), answer.validations
    assert all("transformers is not installed" in v.hf for v in answer.validations), answer.validations


def test_verify_refuses_a_config_deepspeed_rejects_before_launching(tmp_path: Path, no_ops_venv: TargetVenv) -> None:
    """hjson as DeepSpeed reads it (a comment), then DeepSpeed's verdict, named by key: no launch."""
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1,\n // ours\n'
                      ' "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}}\n')
    result = run_cli("verify", "--config", config, "--python", no_ops_venv.python, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == (f"error: --config {config}: DeepSpeed rejects zero_optimization.offload_optimizer.device: "
                        "Input should be 'none', 'cpu' or 'nvme'")
    assert lines[1].startswith("hint: fix zero_optimization.offload_optimizer.device") and len(lines) == 2
    assert "launching" not in result.stderr
