"""Read a DeepSpeed config file the way DeepSpeed reads it, and say whether it offloads to NVMe.

Why NVMe: missing libaio headers only break a run whose ZeRO config offloads to NVMe (ZeRO-Infinity);
for everyone else it is a note (catalogue F14).

Why the target interpreter parses it: DeepSpeed 0.19.5 (`runtime/config.py`, `DeepSpeedConfig`) reads a
config path with `hjson.load(open(config, "r"), object_pairs_hook=dict_raise_error_on_duplicate_keys)`.
Hjson accepts far more than JSON (`#`, `//` and `/* */` comments, trailing and omitted commas,
quoteless keys and strings, `'''` multi-line strings, a root object without braces), and the hook
refuses duplicate keys. Re-implementing that grammar here would drift from hjson's; hjson is a
DeepSpeed dependency, not ours (our runtime dependencies stay typer, rich, unidiff, requests,
packaging). So the file is parsed by hjson itself, in the target interpreter, the one DeepSpeed runs
in, with a copy of DeepSpeed's duplicate-key hook (importing DeepSpeed for it would import torch): the
script is target_side/mlstack_dsconfig_parse.py, run by path, and the strict-JSON fallback here uses its hook.
Without hjson there (DeepSpeed not installed yet), the file is read as strict JSON, which hjson
accepts with the same meaning; anything else is refused with a hint to install DeepSpeed first.
A config that is not an object (a JSON array, a bare number) is refused: DeepSpeed's
`DeepSpeedConfig` needs a mapping and fails on anything else.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from mlstack_ds.detect.environment import resolve_python
from mlstack_ds.detect.marked import UnreadableLine, marked_object
from mlstack_ds.errors import ToolError, UsageError
from mlstack_ds.patience import WAITS
from mlstack_ds.runner import run
from mlstack_ds.target_side import mlstack_dsconfig_parse as parse_module
from mlstack_ds.target_side import script
from mlstack_ds.target_side.mlstack_dsconfig_parse import MARKER, dict_raise_error_on_duplicate_keys

_OFFLOAD_KEYS = ("offload_optimizer", "offload_param")


def offloads_to_nvme(config: Any) -> bool:
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    if not isinstance(zero, dict):
        return False
    return any(isinstance(zero.get(k), dict) and zero[k].get("device") == "nvme" for k in _OFFLOAD_KEYS)


def read_ds_config(path: Path, python: str | Path | None = None, option: str = "--ds-config") -> dict[str, Any]:
    """The config at `path` as DeepSpeed would load it in `python`; every bad file is a UsageError naming
    `option` (doctor's --ds-config, verify's --config)."""
    # Checked without reading, so a FIFO is read once, by the parser (DeepSpeed reads one too).
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        path.stat()
        if not os.access(path, os.R_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}", hint="pass a readable file") from exc
    target = resolve_python(python)
    answer = _parse_in_target(target, path)
    if answer is None or not answer.get("hjson"):
        config = _parse_strict_json(path, target, option)
    elif "error" in answer:
        raise UsageError(f"{option} {path}: DeepSpeed cannot read it ({answer['error']})",
                         hint="fix the file; DeepSpeed reads configs with hjson (comments and trailing commas "
                         "are fine, duplicate keys are not)")
    else:
        config = answer.get("config")
    if not isinstance(config, dict):
        kind = "a list" if isinstance(config, list) else type(config).__name__
        raise UsageError(f"{option} {path}: the top level is {kind}, DeepSpeed needs an object",
                         hint='a DeepSpeed config is one object: {"train_batch_size": 8, ...}')
    return config


def read_nvme_offload(path: Path, python: str | Path | None = None) -> bool:
    """Whether the DeepSpeed config file at `path` offloads to NVMe; bad files are usage errors."""
    return offloads_to_nvme(read_ds_config(path, python))


def _parse_in_target(python: Path, path: Path) -> dict[str, Any] | None:
    """hjson's answer from the target interpreter; None when it could not be asked."""
    try:
        result = run([python, script(parse_module), str(path.resolve())],
                     patience=WAITS["target probe"])  # it imports DeepSpeed: as patient as the probe
    except ToolError:
        return None
    if not result.ok:
        return None
    try:
        return marked_object(result.stdout, MARKER)
    except UnreadableLine:
        return None


def _parse_strict_json(path: Path, python: Path, option: str = "--ds-config") -> Any:
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise UsageError(
            f"{option} {path}: not strict JSON ({exc}), and {python} has no hjson to read it as DeepSpeed does",
            hint="install DeepSpeed in the target first (it brings hjson), or pass a strict JSON file",
        ) from exc
    except ValueError as exc:  # the duplicate-key hook
        raise UsageError(f"{option} {path}: DeepSpeed cannot read it (ValueError: {exc})",
                         hint="remove the duplicate keys") from exc
