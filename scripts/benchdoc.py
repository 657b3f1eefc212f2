"""docs/benchmarks.md is shared by several benchmark scripts: each rewrites only its own `## ` section."""

from __future__ import annotations


def replace_section(document: str, heading: str, section: str) -> str:
    """`document` with the section starting at the line `heading` replaced by `section` (appended when
    there is none yet); the other benchmarks' sections stay as they are."""
    lines = document.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        prefix = document if document.endswith("\n") or not document else document + "\n"
        return prefix + ("\n" if prefix else "") + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")
