"""Match a build or run log (pip output, a traceback, ds_report) against the rules' known error texts.

Why streaming: build logs of a whole `DS_BUILD_OPS` compile or a long training run reach hundreds of
megabytes, and reading one whole (`read_text` + `splitlines`) cost 1.8 GB of memory for a 714 MB log.
Here the log is read in fixed-size blocks and only two things are kept per rule: its first matching
line and a count. Memory is bounded by the block size plus the longest line kept (`MAX_LINE_CHARS`),
whatever the log's size; stdin and FIFOs work the same way because nothing seeks.

Patterns are per line (as before): a block is first searched with one alternation of every pattern,
and only the lines where it matched are checked rule by rule. That keeps the common case (a line no
rule knows) to one regex pass in C instead of one per rule per line. Bytes are decoded as UTF-8 with
errors replaced, so a binary or mis-encoded log cannot crash the match.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from mlstack_ds.doctor.model import Finding, Hit, Rule

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_EVIDENCE_CHARS = 240
BLOCK_BYTES = 1 << 20
# A "line" longer than this (a binary file, a progress bar without newlines) is matched in pieces of
# this size, each overlapping the previous one, so memory stays bounded; hits keep the line's number.
MAX_LINE_CHARS = 1 << 20
_OVERLAP_CHARS = 4096


@dataclass
class _RuleHits:
    """Per rule: the first matching line (number, text) and how many lines matched."""

    rule: Rule
    first: tuple[int, str] | None = None
    count: int = 0
    last_line: int = 0  # a line matched in several pieces counts once


def match_log(text: str, rules: Iterable[Rule]) -> list[Finding]:
    """One finding per rule whose pattern occurs in `text`, quoting the first matching line."""
    return _LogMatcher(rules).feed_all([text]).findings()


def match_log_stream(stream: BinaryIO, rules: Iterable[Rule], block_bytes: int = BLOCK_BYTES) -> list[Finding]:
    """`match_log` for a binary stream (file, FIFO, stdin), read block by block in bounded memory."""
    return _LogMatcher(rules).feed_all(_decoded_blocks(stream, block_bytes)).findings()


def _decoded_blocks(stream: BinaryIO, block_bytes: int) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        block = stream.read(block_bytes)
        if not block:
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
            return
        yield decoder.decode(block)


class _LogMatcher:
    def __init__(self, rules: Iterable[Rule]) -> None:
        self.hits = [_RuleHits(rule) for rule in rules if rule.log_patterns]
        patterns = [p.pattern for h in self.hits for p in h.rule.log_patterns]
        # MULTILINE: a block holds many lines and `^`/`$` in a pattern mean a line's start/end.
        # `(?!)` never matches (no rule has a pattern).
        self.any_pattern = re.compile("|".join(f"(?:{p})" for p in patterns) or r"(?!)", re.MULTILINE)
        self.line_number = 1  # number of the line the pending text starts on
        self.pending = ""  # an incomplete last line carried to the next block

    def feed_all(self, blocks: Iterable[str]) -> _LogMatcher:
        for block in blocks:
            self._feed(block)
        if self.pending:
            self._search(self.pending, self.line_number)
        return self

    def _feed(self, block: str) -> None:
        text = self.pending + block
        end = text.rfind("\n")
        if end < 0:
            self.pending = text
            if len(text) > MAX_LINE_CHARS:  # one huge line: match what we have, keep an overlap
                self._search(text, self.line_number)
                self.pending = text[-_OVERLAP_CHARS:]
            return
        self.pending = text[end + 1:]
        complete = text[: end + 1]
        self._search(complete, self.line_number)
        self.line_number += complete.count("\n")

    def _search(self, text: str, first_line: int) -> None:
        """Find candidate lines in `text` (complete lines, starting at line `first_line`)."""
        if "\x1b" in text:
            text = _ANSI_RE.sub("", text)
        position, line, counted_to = 0, first_line, 0
        while True:
            match = self.any_pattern.search(text, position)
            if match is None:
                return
            start = text.rfind("\n", 0, match.start()) + 1
            stop = text.find("\n", match.start())
            stop = len(text) if stop < 0 else stop
            line += text.count("\n", counted_to, start)
            counted_to = start
            self._check_line(text[start:stop].rstrip(), line)
            position = stop + 1

    def _check_line(self, text: str, number: int) -> None:
        for hits in self.hits:
            if hits.last_line == number or not any(p.search(text) for p in hits.rule.log_patterns):
                continue
            hits.last_line = number
            hits.count += 1
            if hits.first is None:
                hits.first = (number, _shorten(text.strip()))

    def findings(self) -> list[Finding]:
        found = []
        for hits in self.hits:
            if hits.first is None:
                continue
            number, quoted = hits.first
            more = f" (and {hits.count - 1} more line(s))" if hits.count > 1 else ""
            found.append(hits.rule.finding(Hit(f"log line {number}: {quoted}{more}"), origin="log"))
        return found


def _shorten(line: str) -> str:
    return line if len(line) <= MAX_EVIDENCE_CHARS else line[: MAX_EVIDENCE_CHARS - 1] + "…"
