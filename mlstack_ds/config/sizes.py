"""Numbers as users write them: byte sizes (`24GiB`, `16GB`, `512MiB`, `1.5TiB`, or a plain number of bytes),
counts (`7e9`) and positive whole numbers."""

from __future__ import annotations

import re

from mlstack_ds.errors import UsageError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_RE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(option: str, text: str) -> int:
    """Bytes in `text`; zero, negative or malformed sizes are a UsageError naming `option`.

    GB is 10**9 and GiB 2**30, as on the cards' boxes and in rocminfo respectively: "24GB" is not 24 GiB.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(f"{option} {text!r}: not a size", hint=f"write it like 24GiB or 16GB, e.g. {option} 24GiB")
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1:
        raise UsageError(f"{option} {text}: must be greater than zero", hint=f"e.g. {option} 24GiB")
    return int(value)


def positive_int(option: str, value: int) -> int:
    if value <= 0:
        raise UsageError(f"{option} {value}: must be greater than zero", hint=f"e.g. {option} 1")
    return value


def parse_count(option: str, text: str | None) -> int | None:
    """`--params 7e9` or `--params 6738415616`: a positive whole number."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: not a number", hint=f"e.g. {option} 7e9") from None
    if not 0 < value < float("inf"):
        raise UsageError(f"{option} {text}: must be greater than zero", hint=f"e.g. {option} 7e9")
    return int(value)


def gib(size: float) -> str:
    """`25.3 GiB`: how sizes are shown (rocminfo and the guides' tables use binary gigabytes)."""
    return f"{size / 2**30:.1f} GiB"
