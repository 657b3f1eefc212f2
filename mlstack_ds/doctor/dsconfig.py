"""Read what the doctor needs from a DeepSpeed JSON config: does it offload to NVMe?

Why: missing libaio headers only break a run whose ZeRO config offloads to NVMe (ZeRO-Infinity);
for everyone else it is a note (catalogue F14).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlstack_ds.errors import UsageError

_OFFLOAD_KEYS = ("offload_optimizer", "offload_param")


def offloads_to_nvme(config: Any) -> bool:
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    if not isinstance(zero, dict):
        return False
    return any(isinstance(zero.get(k), dict) and zero[k].get("device") == "nvme" for k in _OFFLOAD_KEYS)


def read_nvme_offload(path: Path) -> bool:
    """Whether the DeepSpeed config file at `path` offloads to NVMe; bad files are usage errors."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--ds-config {path}: {exc.strerror or exc}", hint="pass a readable file") from exc
    except ValueError as exc:
        raise UsageError(f"--ds-config {path}: not JSON ({exc})", hint="pass a DeepSpeed config") from exc
    return offloads_to_nvme(config)
