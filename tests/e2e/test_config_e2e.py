"""`mlstack-ds config` on the installed target (`installed_target`: DeepSpeed 0.19.5 from `mlstack-ds install`,
patched, CPU ops prebuilt, transformers and accelerate): `--hf`'s round trip through transformers'
HfTrainerDeepSpeedConfig, which the integration tests' target (no_ops_venv, no transformers) cannot do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_support import MODEL, ask, placement_configs
from e2e_support import Target

from mlstack_ds.config.rules import ORDER

pytestmark = pytest.mark.slow


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
