"""The install receipt: what mlstack-ds put into an environment, kept inside that environment.

Why in `<sys.prefix>/share/mlstack-ds/receipt.json`: it travels with the venv it describes, several
venvs each have their own, and deleting the venv deletes it. It also records what was installed
before, so `rollback` can restore it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlstack_ds.errors import InstallError

RECEIPT_SCHEMA = 1


def receipt_path(prefix: str | Path) -> Path:
    return Path(prefix) / "share" / "mlstack-ds" / "receipt.json"


@dataclass(frozen=True)
class PreviousInstall:
    """What the environment had before: a DeepSpeed version (or none), and our wheel of it if cached."""

    deepspeed_version: str | None
    wheel: str | None = None
    receipt: dict[str, Any] | None = None


@dataclass(frozen=True)
class Receipt:
    deepspeed_version: str
    recipe: str
    source: str
    source_commit: str
    source_pin: str
    patches: list[dict[str, str]]
    tree_hash: str
    platform: str
    accelerator: str
    archs: list[str]
    ops: list[str]
    flags: dict[str, str]
    wheel: str
    wheel_sha256: str
    torch_version: str
    python: str
    cache_key: str
    installed_at: str
    previous: PreviousInstall = field(default_factory=lambda: PreviousInstall(None))
    schema: int = RECEIPT_SCHEMA
    tool_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Receipt:
        data = dict(data)
        previous = data.pop("previous", None) or {}
        known = set(cls.__dataclass_fields__) - {"previous"}
        return cls(**{k: v for k, v in data.items() if k in known},
                   previous=PreviousInstall(**{k: previous.get(k) for k in ("deepspeed_version", "wheel", "receipt")}))


def read_receipt(prefix: str | Path) -> Receipt | None:
    path = receipt_path(prefix)
    try:
        return Receipt.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise InstallError(f"receipt {path} is unreadable ({exc})",
                           hint=f"remove it (rm {path}) and reinstall with --force") from exc


def write_receipt(prefix: str | Path, receipt: Receipt) -> Path:
    """Write atomically (temp file + rename): a crash never leaves half a receipt."""
    path = receipt_path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".receipt-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(receipt.to_dict(), handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)
    return path


def remove_receipt(prefix: str | Path) -> None:
    receipt_path(prefix).unlink(missing_ok=True)
