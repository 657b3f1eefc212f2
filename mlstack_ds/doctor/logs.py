"""Match a build or run log (pip output, a traceback, ds_report) against the rules' known error texts.

Why streaming: build logs of a whole `DS_BUILD_OPS` compile or a long training run reach hundreds of
megabytes, and reading one whole (`read_text` + `splitlines`) cost 1.8 GB of memory for a 714 MB log.
Here the log is read in fixed-size blocks and only two things are kept per rule: its first matching
line and a count. Memory is bounded by the block size plus the longest line kept (`MAX_LINE_CHARS`),
whatever the log's size; stdin and FIFOs work the same way because nothing seeks.

Patterns are per line (as before), but each pattern scans a whole block at once and only the lines
it hits are looked at in Python: a line no rule knows costs no Python code at all. Patterns should
start with a literal, which lets the regex engine skip ahead to it (an alternation or a character
class first is several times slower on a big log). Bytes are decoded as UTF-8 with
errors replaced, so a binary or mis-encoded log cannot crash the match.
"""

from __future__ import annotations

import codecs
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from mlstack_ds.doctor.model import Finding, Rule
from mlstack_ds.errors import EnvironmentProblem, UsageError

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_EVIDENCE_CHARS = 240
MAX_MORE_LINES = 3  # line numbers quoted after the first matching line
BLOCK_BYTES = 1 << 20
# A "line" longer than this (a binary file, a progress bar without newlines) is matched in pieces of
# this size, each overlapping the previous one, so memory stays bounded; hits keep the line's number.
MAX_LINE_CHARS = 1 << 20
_OVERLAP_CHARS = 4096


@dataclass
class _RuleHits:
    """Per rule: the first matching line (number, text), the numbers of the next few, and how many
    lines matched in all (all that is kept, whatever the log's size)."""

    rule: Rule
    first: tuple[int, str] | None = None
    next_lines: list[int] = field(default_factory=list)  # at most MAX_MORE_LINES
    count: int = 0
    last_line: int = 0  # a line matched in several pieces counts once


def match_log(text: str, rules: Iterable[Rule]) -> list[Finding]:
    """One finding per rule whose pattern occurs in `text`, quoting the first matching line."""
    return _LogMatcher(rules).feed_all([text]).findings()


def match_log_stream(stream: BinaryIO, rules: Iterable[Rule], block_bytes: int = BLOCK_BYTES) -> list[Finding]:
    """`match_log` for a binary stream (file, FIFO, stdin), read block by block in bounded memory."""
    return _LogMatcher(rules).feed_all(_decoded_blocks(stream, block_bytes)).findings()


def match_log_file(path: Path, rules: Iterable[Rule]) -> list[Finding]:
    """`doctor --log PATH`: the log at `path` (`-`: stdin; a FIFO works too), line by line in bounded memory."""
    if str(path) == "-":
        return match_log_stream(sys.stdin.buffer, rules)
    try:
        with path.open("rb") as stream:
            return match_log_stream(stream, rules)
    except OSError as exc:
        raise UsageError(f"--log {path}: {exc.strerror or exc}",
                         hint="pass a readable log file, or - for stdin") from exc
    except MemoryError as exc:  # bounded by design; a machine this short of memory cannot run doctor
        raise EnvironmentProblem(f"--log {path}: out of memory while reading the log",
                                 hint="free some memory, or pass the part of the log around the error") from exc


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
        # MULTILINE: a block holds many lines and `^`/`$` in a pattern mean a line's start/end.
        self.block_patterns = [[(re.compile(p.pattern, p.flags | re.MULTILINE), literal_prefix(p))
                                for p in h.rule.log_patterns] for h in self.hits]
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
        """Each pattern scans the whole block (in C, with its literal prefix); a hit is then checked
        on its own line, so a match may never span lines."""
        if "\x1b" in text:
            text = _ANSI_RE.sub("", text)
        for hits, patterns in zip(self.hits, self.block_patterns, strict=True):
            starts: set[int] = set()
            for pattern, prefix in patterns:
                position = 0
                while (at := _next_candidate(text, pattern, prefix, position)) >= 0:
                    if not prefix or pattern.match(text, at):
                        start = text.rfind("\n", 0, at) + 1
                        stop = text.find("\n", at)
                        stop = len(text) if stop < 0 else stop
                        if start not in starts and pattern.search(text[start:stop]):
                            starts.add(start)
                        position = stop + 1
                    else:
                        position = at + 1
            line, counted_to = first_line, 0
            for start in sorted(starts):
                line += text.count("\n", counted_to, start)
                counted_to = start
                stop = text.find("\n", start)
                self._record(hits, text[start: len(text) if stop < 0 else stop].rstrip(), line)

    @staticmethod
    def _record(hits: _RuleHits, text: str, number: int) -> None:
        if hits.last_line == number:
            return
        hits.last_line = number
        hits.count += 1
        if hits.first is None:
            hits.first = (number, _shorten(text.strip()))
        elif len(hits.next_lines) < MAX_MORE_LINES:
            hits.next_lines.append(number)

    def findings(self) -> list[Finding]:
        found = []
        for hits in self.hits:
            if hits.first is None:
                continue
            number, quoted = hits.first
            more = ""
            if hits.count > 1:
                where = ", ".join(str(n) for n in hits.next_lines)
                where += ", …" if hits.count - 1 > len(hits.next_lines) else ""
                more = f" (and {hits.count - 1} more line(s): {where})"
            found.append(hits.rule.log_finding(f"log line {number}: {quoted}{more}", quoted))
        return found


def _next_candidate(text: str, pattern: re.Pattern[str], prefix: str, position: int) -> int:
    """Where the next match may start: the next occurrence of the pattern's literal prefix
    (`str.find`, several times faster than the regex engine's own scan), else a regex search."""
    if prefix:
        return text.find(prefix, position)
    match = pattern.search(text, position)
    return -1 if match is None else match.start()


_META = set(".^$*+?{}[]|()")
_QUANTIFIERS = set("*+?{")


def literal_prefix(pattern: re.Pattern[str]) -> str:
    """The literal text every match of `pattern` starts with ("" when it does not start with one, or
    ignores case). `\\.`-style escaped punctuation counts as literal; a literal followed by a
    quantifier does not (it may be absent)."""
    if pattern.flags & re.IGNORECASE:
        return ""
    source, chars, i = pattern.pattern, [], 0
    while i < len(source):
        char = source[i]
        if char == "\\":
            if i + 1 >= len(source) or source[i + 1].isalnum():
                break  # \b, \d, \S ...: not a literal
            chars.append(source[i + 1])
            i += 2
        elif char in _META:
            break
        else:
            chars.append(char)
            i += 1
        if i < len(source) and source[i] in _QUANTIFIERS:
            chars.pop()
            break
    return "".join(chars)


def _shorten(line: str) -> str:
    return line if len(line) <= MAX_EVIDENCE_CHARS else line[: MAX_EVIDENCE_CHARS - 1] + "…"
