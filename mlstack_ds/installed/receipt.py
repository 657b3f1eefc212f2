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


def kept_dir(prefix: str | Path) -> Path:
    """Where a DeepSpeed we replaced but did not install is kept (as a wheel) for `rollback`: next to the
    receipt that refers to it, so it lives and dies with the environment."""
    return receipt_path(prefix).parent / "previous"


class ReceiptError(InstallError):
    """The receipt exists but is not a receipt this version can trust (exit 7, like other install
    failures): rollback/uninstall/status must not act on a half-understood description."""


@dataclass(frozen=True)
class PreviousInstall:
    """What the environment had before: a DeepSpeed version (or none) and a wheel that restores it: our
    cached build (with its receipt), or a copy of a DeepSpeed someone else installed (with its sha256)."""

    deepspeed_version: str | None
    wheel: str | None = None
    receipt: dict[str, Any] | None = None
    wheel_sha256: str | None = None


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
    # Where the wheel came from when it was not built here: the URL of an index's wheel (`install --index`).
    origin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["origin"] is None:  # receipts of local builds stay readable by earlier versions
            del data["origin"]
        return data

    @classmethod
    def from_dict(cls, data: object) -> Receipt:
        """A receipt from its JSON form, checked field by field; `ValueError` says what is wrong."""
        fields = _checked_fields(data, "receipt")
        previous = fields.pop("previous", None)
        return cls(**fields, previous=_previous_from(previous))


# The JSON type every field must have (the dataclass annotations are strings under `annotations`).
_STR, _OPT_STR = (str,), (str, type(None))
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    **{name: _STR for name in ("deepspeed_version", "recipe", "source", "source_commit", "source_pin",
                               "tree_hash", "platform", "accelerator", "wheel", "wheel_sha256",
                               "torch_version", "python", "cache_key", "installed_at", "tool_version")},
    "patches": (list,), "archs": (list,), "ops": (list,), "flags": (dict,), "schema": (int,),
    "previous": (dict, type(None)), "origin": _OPT_STR,
}
_OPTIONAL = frozenset({"previous", "schema", "tool_version", "origin"})
_PREVIOUS_TYPES: dict[str, tuple[type, ...]] = {
    "deepspeed_version": _OPT_STR, "wheel": _OPT_STR, "receipt": (dict, type(None)), "wheel_sha256": _OPT_STR,
}


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _checked_fields(data: object, what: str) -> dict[str, Any]:
    """Every required field present, none unknown, each of its JSON type (lists of strings, string maps)."""
    if not isinstance(data, dict):
        raise ValueError(f"the {what} is {_json_type(data)}, not an object")
    unknown = sorted(set(data) - set(_FIELD_TYPES))
    missing = sorted(set(_FIELD_TYPES) - _OPTIONAL - set(data))
    if "schema" in data and data["schema"] != RECEIPT_SCHEMA:  # a newer layout: say so, not "missing x, y"
        raise ValueError(f"schema {data['schema']!r} is not one this mlstack-ds knows ({RECEIPT_SCHEMA})")
    if missing or unknown:
        raise ValueError(f"the {what} " + "; ".join(
            part for part in (f"lacks {', '.join(missing)}" if missing else "",
                              f"has unknown fields {', '.join(unknown)}" if unknown else "") if part))
    for name, value in data.items():
        if not isinstance(value, _FIELD_TYPES[name]) or isinstance(value, bool):
            raise ValueError(f"{what} field {name!r} is {_json_type(value)}, not "
                             + " or ".join(_json_type(t()) for t in _FIELD_TYPES[name]))
    for name in ("archs", "ops"):
        if not all(isinstance(item, str) for item in data[name]):
            raise ValueError(f"{what} field {name!r} must be a list of strings")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in data["flags"].items()):
        raise ValueError(f"{what} field 'flags' must map strings to strings")
    if not all(isinstance(p, dict) and all(isinstance(v, str) for v in p.values()) and {"name", "sha256"} <= set(p)
               for p in data["patches"]):
        raise ValueError(f"{what} field 'patches' must be a list of {{name, sha256}} objects")
    return dict(data)


def _previous_from(data: dict[str, Any] | None) -> PreviousInstall:
    if data is None:
        return PreviousInstall(None)
    unknown = sorted(set(data) - set(_PREVIOUS_TYPES))
    if unknown:
        raise ValueError(f"receipt field 'previous' has unknown fields {', '.join(unknown)}")
    for name, value in data.items():
        if not isinstance(value, _PREVIOUS_TYPES[name]):
            raise ValueError(f"receipt field 'previous.{name}' is {_json_type(value)}, not "
                             + " or ".join(_json_type(t()) for t in _PREVIOUS_TYPES[name]))
    nested = data.get("receipt")
    if nested is not None:  # the receipt rollback will write back: it must be one too
        _checked_fields({**nested, "previous": None}, "previous receipt")
    return PreviousInstall(**{name: data.get(name) for name in _PREVIOUS_TYPES})


def read_receipt(prefix: str | Path) -> Receipt | None:
    """The environment's receipt, None when there is none; anything that is not a valid receipt of a known
    schema (truncated, not JSON, binary, another layout) is a `ReceiptError` naming the file and the fix."""
    path = receipt_path(prefix)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReceiptError(f"receipt {path} cannot be read: {exc.strerror or exc}",
                           hint="check its permissions (it belongs to the environment's owner)") from exc
    try:
        return Receipt.from_dict(json.loads(raw.decode("utf-8")))
    except UnicodeDecodeError as exc:
        problem: str = "it is not text (binary or damaged)"
        cause: Exception = exc
    except json.JSONDecodeError as exc:
        problem = f"it is not valid JSON (truncated or damaged: {exc.msg} at line {exc.lineno})"
        cause = exc
    except (ValueError, TypeError) as exc:
        problem = f"it is not a receipt this mlstack-ds can read: {exc}"
        cause = exc
    raise ReceiptError(
        f"receipt {path} is unusable: {problem}",
        hint=f"`mlstack-ds install --force` reinstalls DeepSpeed and writes a new one; or remove it (rm {path})",
    ) from cause


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
