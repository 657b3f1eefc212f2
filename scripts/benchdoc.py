"""docs/benchmarks.md is shared by several benchmark scripts: each rewrites only its own `## ` section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def publish_result(result: dict[str, Any], section: str, heading: str, json_out: Path | None,
                   markdown_out: Path | None) -> None:
    """Print a benchmark's JSON and markdown section, and write them where asked (the section replacing
    its own `heading` in `markdown_out`)."""
    text = json.dumps(result, indent=2)
    print(text)
    if json_out:
        json_out.write_text(text + "\n")
    print(section)
    if markdown_out:
        current = markdown_out.read_text() if markdown_out.exists() else ""
        markdown_out.write_text(replace_section(current, heading, section))


def write_result(result: dict[str, Any], section: str, heading: str, json_out: Path | None,
                 markdown_out: Path | None) -> None:
    """Write a benchmark's JSON and markdown section where asked (the section replacing its own `heading` in
    `markdown_out`), and print the section."""
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    if markdown_out:
        current = markdown_out.read_text() if markdown_out.exists() else ""
        markdown_out.write_text(replace_section(current, heading, section))
    print(section, end="")
