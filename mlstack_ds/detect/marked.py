"""The one reader of the marked JSON lines that scripts run in a target interpreter (or on a node) print.

Why marked lines: such a script shares stdout with whatever the interpreter's start-up, torch or a
`sitecustomize` prints, so its answer is one line starting with a marker, and the last such line wins
(an earlier one may come from a nested start). Every caller used to slice and `json.loads` by hand.
"""

from __future__ import annotations

import json
from typing import Any


class UnreadableLine(ValueError):
    """The marked line is there but its JSON is not (a truncated or damaged answer)."""


def marked_json(stdout: str, marker: str) -> Any | None:
    """The JSON value after the last line of `stdout` starting with `marker`; None when there is no such line.
    Raises `UnreadableLine` when the line holds no valid JSON."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(marker)), None)
    if line is None:
        return None
    try:
        return json.loads(line[len(marker):])
    except ValueError as exc:
        raise UnreadableLine(f"{marker} {exc}") from exc


def marked_object(stdout: str, marker: str) -> dict[str, Any] | None:
    """`marked_json` for answers that must be a JSON object; anything else is an `UnreadableLine`."""
    value = marked_json(stdout, marker)
    if value is not None and not isinstance(value, dict):
        raise UnreadableLine(f"{marker} not a JSON object: {type(value).__name__}")
    return value

