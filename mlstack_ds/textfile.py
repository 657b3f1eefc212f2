"""Reading the small text files users hand us (recipes, patch series, hostfiles) with one kind of error.

Why one place: a missing, unreadable or binary file is bad input, and must get the caller's error
class (usage, patch) with the file named, never a UnicodeDecodeError traceback.
"""

from __future__ import annotations

from pathlib import Path

from mlstack_ds.errors import MlstackError


def read_text(path: Path, *, error: type[MlstackError], what: str, hint: str) -> str:
    """The file's text (UTF-8), or `error` saying why it cannot be had."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}", hint=hint) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not a UTF-8 text file (byte {exc.start} is 0x{data[exc.start]:02x})",
                    hint=hint) from exc
