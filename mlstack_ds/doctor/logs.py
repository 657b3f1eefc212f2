"""Match a build or run log (pip output, a traceback, ds_report) against the rules' known error texts."""

from __future__ import annotations

import re
from collections.abc import Iterable

from mlstack_ds.doctor.model import Finding, Hit, Rule

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_EVIDENCE_CHARS = 240


def match_log(text: str, rules: Iterable[Rule]) -> list[Finding]:
    """One finding per rule whose pattern occurs, quoting the first matching line."""
    lines = [_ANSI_RE.sub("", line).rstrip() for line in text.splitlines()]
    findings = []
    for rule in rules:
        if not rule.log_patterns:
            continue
        hits = [(n, line) for n, line in enumerate(lines, start=1)
                if any(p.search(line) for p in rule.log_patterns)]
        if not hits:
            continue
        number, line = hits[0]
        quoted = _shorten(line.strip())
        more = f" (and {len(hits) - 1} more line(s))" if len(hits) > 1 else ""
        findings.append(rule.finding(Hit(f"log line {number}: {quoted}{more}"), origin="log"))
    return findings


def _shorten(line: str) -> str:
    return line if len(line) <= MAX_EVIDENCE_CHARS else line[: MAX_EVIDENCE_CHARS - 1] + "…"
