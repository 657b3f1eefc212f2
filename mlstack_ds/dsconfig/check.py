"""`verify --config FILE`: the user's config, read as DeepSpeed reads it and judged by DeepSpeed's parser in
the target before anything is launched (a rejected key costs one interpreter start, not a 12 s launch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlstack_ds.dsconfig.read import read_ds_config
from mlstack_ds.dsconfig.target import Validation, validate_in_target
from mlstack_ds.errors import UsageError
from mlstack_ds.worker import training

OPTION = "--config"


def has_auto(value: Any) -> bool:
    if isinstance(value, dict):
        return any(has_auto(v) for v in value.values())
    return value == "auto"


def refuse_if_rejected(verdict: Validation, path: Path) -> None:
    """DeepSpeed's rejection of the user's config as one usage error naming the key (verify and bench)."""
    if not verdict.ok:
        raise UsageError(f"{OPTION} {path}: DeepSpeed rejects {verdict.key or 'it'}: {verdict.message}",
                         hint=f"fix {verdict.key or 'the config'}, or write one with `mlstack-ds config`")


def load_checked_config(path: Path, python: Path) -> dict[str, Any]:
    """The config DeepSpeed in `python` accepts; hjson syntax as DeepSpeed allows; a config with "auto"
    values (Hugging Face's) is checked after transformers filled them, when the target has it."""
    config = read_ds_config(path, python, option=OPTION)
    # "auto" values are filled as the Trainer would for the model the config check trains.
    verdict = validate_in_target(python, config, hf=has_auto(config), micro_batch=training.MICRO_BATCH,
                                 hidden=training.D_MODEL)
    refuse_if_rejected(verdict, path)
    return config
