"""Clean-up of tool output as users really paste or capture it (colour codes, CRLF, scroll markers)."""

from __future__ import annotations

import re

# CSI sequences (`ESC [ ... letter`), plus a leftover bare "[37m" whose ESC was lost in a paste.
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\[[0-9;]{1,8}m")
# tmux copy-mode scroll position appended to a line: "...   [391/1815]"
_SCROLL_MARKER_RE = re.compile(r"\s+\[\d+/\d+\]\s*$")


def clean_lines(text: str) -> list[str]:
    """Split into lines without colour codes, carriage returns, scroll markers or trailing padding."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _ANSI_RE.sub("", text)
    return [_SCROLL_MARKER_RE.sub("", line).rstrip() for line in text.split("\n")]


def leading_int(value: str) -> int | None:
    """`32(0x20)` -> 32, `96` -> 96, `15773188(0xf0ae04) KB` -> 15773188; None when not a number."""
    match = re.match(r"\s*(\d+)", value)
    return int(match.group(1)) if match else None
