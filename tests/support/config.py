"""Helpers shared by the tests that ask a real target's DeepSpeed about planned configs
(tests/integration/test_config_target.py on `no_ops_venv`, tests/e2e/test_config_e2e.py on `installed_target`)."""

from __future__ import annotations

from pathlib import Path

from mlstack_ds.config.hardware import Hardware
from mlstack_ds.config.model import PRESETS
from mlstack_ds.config.rules import ORDER, config_for
from mlstack_ds.dsconfig.target import TargetAnswer, ask_target

GiB = 2**30
RX_7900_XTX_X2 = Hardware("rocm", 2, 1, 24 * GiB, 256 * GiB, "gfx1100", "Radeon RX 7900 XTX", ())
MODEL = PRESETS["1.3b"]


def placement_configs(hf: bool) -> list[dict]:
    """The config of every placement (ORDER) for MODEL on RX_7900_XTX_X2, micro-batch 2."""
    return [config_for(MODEL, RX_7900_XTX_X2, p, micro_batch=2, hf=hf, amd_specific=False)[0] for p in ORDER]


def ask(python: Path, configs: list[dict], hf: bool = False) -> TargetAnswer:
    """One start of the target: its estimates for MODEL on 1 × 2 GPUs and its verdict on each config."""
    return ask_target(python, params=MODEL.params, largest_layer_params=MODEL.largest_layer_params, gpus_per_node=2,
                      nodes=1, configs=configs, hf=hf, micro_batch=2, hidden=MODEL.hidden)
