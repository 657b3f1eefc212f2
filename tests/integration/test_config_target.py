"""DeepSpeed's own answers in a real target (`no_ops_venv`): its estimators, its config parser's verdict
naming the key, and with `--hf` transformers' handling of "auto" (HfTrainerDeepSpeedConfig).

One start of the target per request (imports take seconds), so each test sends all its configs at once.
The Hugging Face round trip needs transformers in the target: no_ops_venv has none, so that test is
skipped there unless MLSTACK_TEST_HF_PYTHON names a target that has DeepSpeed and transformers
(transformers==5.23.0, accelerate==1.15.0, as tests/target_env.py CLIENT_PACKAGES).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from target_env import TargetVenv

from mlstack_ds.config.hardware import Hardware
from mlstack_ds.config.model import PRESETS
from mlstack_ds.config.rules import AMD_SPECIFIC_SECTION, ORDER, config_for
from mlstack_ds.config.target import ask_target

GiB = 2**30
RX_7900_XTX_X2 = Hardware("rocm", 2, 1, 24 * GiB, 256 * GiB, "gfx1100", "Radeon RX 7900 XTX", ())
MODEL = PRESETS["1.3b"]
BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
# Configs DeepSpeed 0.19.5 refuses, and the key its error must be reported under.
REJECTED = [
    ({**BASE, "zero_optimization": {"stage": 2, "reduce_bucket_size": -1}}, "zero_optimization.reduce_bucket_size"),
    ({**BASE, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}},
     "zero_optimization.offload_optimizer.device"),
    ({**BASE, "bf16": {"enabled": "yes please"}}, "bf16.enabled"),
    ({**BASE, "zero_optimization": {"stage": 2, "overlap_com": True}}, "zero_optimization.overlap_com"),
]


def placement_configs(hf: bool) -> list[dict]:
    return [config_for(MODEL, RX_7900_XTX_X2, p, micro_batch=2, hf=hf, amd_specific=False)[0] for p in ORDER]


def ask(python: Path, configs: list[dict], hf: bool = False):
    return ask_target(python, params=MODEL.params, largest_layer_params=MODEL.largest_layer_params, gpus_per_node=2,
                      nodes=1, configs=configs, amd_specific_section=AMD_SPECIFIC_SECTION, hf=hf, micro_batch=2,
                      hidden=MODEL.hidden)


def test_every_placement_parses_and_rejections_name_the_key(no_ops_venv: TargetVenv) -> None:
    answer = ask(no_ops_venv.python, placement_configs(hf=False) + [c for c, _ in REJECTED])
    assert answer.deepspeed == "0.19.5" and answer.amd_specific is False  # upstream: no patch 0014
    by_placement = {(e.stage, e.offload_optimizer, e.offload_param): e for e in answer.estimates}
    assert sorted(by_placement) == sorted(ORDER)
    # DeepSpeed's formula, stated: ZeRO-2 without offload holds 2 + 18/N bytes per parameter per GPU.
    assert by_placement[(2, False, False)].gpu == 2 * MODEL.params + int(18 * MODEL.params / 2)
    placements, rejected = answer.validations[:len(ORDER)], answer.validations[len(ORDER):]
    assert all(v.ok for v in placements), placements
    # Unpatched: the amd_specific section is not added to what is parsed (DeepSpeed would ignore it).
    assert all("amd_specific" not in (v.config or {}) for v in placements)
    for validation, (_, key) in zip(rejected, REJECTED, strict=True):
        assert not validation.ok and validation.key == key, validation
        assert validation.message


def test_hf_auto_values_are_filled_the_way_the_trainer_does(no_ops_venv: TargetVenv) -> None:
    hf_python = Path(os.environ.get("MLSTACK_TEST_HF_PYTHON", no_ops_venv.python))
    has_transformers = subprocess.run([str(hf_python), "-c", "import transformers"], capture_output=True,
                                      check=False).returncode == 0
    answer = ask(hf_python, placement_configs(hf=True), hf=True)
    assert all(v.ok for v in answer.validations), answer.validations
    if not has_transformers:
        assert all("transformers is not installed" in v.hf for v in answer.validations)
        pytest.skip("transformers is not installed in the target (no_ops_venv): the \"auto\" values were parsed "
                    "as DeepSpeed's defaults, not round-tripped; set MLSTACK_TEST_HF_PYTHON to a target with it")
    assert all("HfTrainerDeepSpeedConfig" in v.hf for v in answer.validations)
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


def test_verify_refuses_a_config_deepspeed_rejects_before_launching(tmp_path: Path, no_ops_venv: TargetVenv) -> None:
    """hjson as DeepSpeed reads it (a comment), then DeepSpeed's verdict, named by key: no launch."""
    import sys

    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1,\n // ours\n'
                      ' "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}}\n')
    result = subprocess.run([sys.executable, "-m", "mlstack_ds", "verify", "--config", str(config), "--python",
                             str(no_ops_venv.python)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == (f"error: --config {config}: DeepSpeed rejects zero_optimization.offload_optimizer.device: "
                        "Input should be 'none', 'cpu' or 'nvme'")
    assert lines[1].startswith("hint: fix zero_optimization.offload_optimizer.device") and len(lines) == 2
    assert "launching" not in result.stderr
