"""`bench --config FILE`: the user's DeepSpeed config as the base of the ZeRO runs, checked before any launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlstack_ds.bench.spec import TINY, parse_stages, positive
from mlstack_ds.dsconfig.check import has_auto, refuse_if_rejected
from mlstack_ds.dsconfig.read import read_ds_config
from mlstack_ds.dsconfig.target import validate_in_target
from mlstack_ds.errors import UsageError


def checked_base_config(path: Path, python: Path, micro_batch: int, stages: str) -> dict[str, Any]:
    """The user's config as DeepSpeed reads it, with what bench sets itself (the micro-batch; the batch
    size follows from it), judged by DeepSpeed's parser in the target at the first ZeRO stage asked for."""
    config = read_ds_config(path, python, option="--config")
    if has_auto(config):
        raise UsageError(f"--config {path}: has \"auto\" values, which only the Hugging Face Trainer fills",
                         hint="bench runs DeepSpeed without the Trainer: write the values (`mlstack-ds config` "
                         "without --hf)")
    config.pop("train_batch_size", None)
    config["train_micro_batch_size_per_gpu"] = positive("--micro-batch", micro_batch)
    zero_stages = [s for s in parse_stages(stages) if s != "ddp"]
    judged = {**config, "zero_optimization": {**config.get("zero_optimization", {}),
                                              "stage": int(zero_stages[0]) if zero_stages else 0}}
    refuse_if_rejected(validate_in_target(python, judged, hidden=TINY.hidden), path)
    return config
