"""Split a DeepSpeed build's output by op: a log per op, the ops running now, and the op that failed.

Why: with several ops compiling at once (buildjobs, patch 0019) their output interleaves in one stream.
Every line that names an op is attributed to it: setuptools' `building '<ext>' extension`, each compile and
link command (patch 0019 gives every op its own directory `build/temp.*/<ext>/`), ninja's `FAILED:` line,
and 0019's `error: building '<ext>' extension failed`. Other lines (compiler diagnostics) belong to the op
of the command before them: ninja prints a command's output right after its `[k/n]` line.
"""

from __future__ import annotations

import re
from contextlib import suppress
from pathlib import Path
from typing import TextIO

_STARTED_RE = re.compile(r"building '([\w.]+)' extension$")
_FAILED_RE = re.compile(r"error: building '([\w.]+)' extension failed")
_OP_DIR_RE = re.compile(r"/build/temp\.[^/\s]+/([\w.]+_op)/")
_LINKED_RE = re.compile(r"-o \S*/deepspeed/ops/(?:\w+/)*(\w+_op)\.\S*\.so\b")
_NINJA_FAILED_RE = re.compile(r"^\s*FAILED: ")
_ERROR_RE = re.compile(r"\berror\b|\bError\b|ERROR|FAILED|fatal")


def op_name(extension: str) -> str:
    """`deepspeed.ops.adam.cpu_adam_op` -> `cpu_adam` (the name DeepSpeed's builders and we use)."""
    return extension.rsplit(".", 1)[-1].removesuffix("_op")


class OpLogs:
    """Feed it the build's lines; it keeps `<directory>/<op>.log` and knows what runs and what failed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.running: list[str] = []
        self.finished: list[str] = []
        self.failed: str | None = None
        self.last_op: str | None = None
        self._files: dict[str, TextIO] = {}
        self._first_error: dict[str, str] = {}

    def feed(self, line: str) -> str | None:
        """Attribute one line (without its newline); return the op it belongs to, if any."""
        linked = _LINKED_RE.search(line)
        if linked:  # before the others: a link command also names the op's object files
            op = op_name(linked.group(1))
            if op in self.running:
                self.running.remove(op)
                self.finished.append(op)
            self._write(op, line)
            # What follows a link belongs to an op still compiling, or to no op (packaging).
            self.last_op = self.running[-1] if self.running else None
            return op
        op = self._op_named_by(line)
        if op is None:
            op = self.last_op
        else:
            self.last_op = op
        if op is None:
            return None
        failed = _FAILED_RE.search(line)
        if failed and self.failed is None:
            self.failed = op
        if (failed or _NINJA_FAILED_RE.match(line) or _ERROR_RE.search(line)) and "warning" not in line.lower():
            self._first_error.setdefault(op, line.strip()[:300])
        self._write(op, line)
        return op

    def _op_named_by(self, line: str) -> str | None:
        for pattern in (_STARTED_RE, _FAILED_RE, _OP_DIR_RE):
            match = pattern.search(line)
            if match:
                op = op_name(match.group(1))
                if pattern is _STARTED_RE and op not in self.running:
                    self.running.append(op)
                return op
        return None

    def _write(self, op: str, line: str) -> None:
        self._file(op).write(line + "\n")

    def first_error(self, op: str) -> str:
        return self._first_error.get(op, "")

    def path(self, op: str) -> Path:
        return self.directory / f"{op}.log"

    def _file(self, op: str) -> TextIO:
        if op not in self._files:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._files[op] = self.path(op).open("w", encoding="utf-8")
        return self._files[op]

    def close(self) -> None:
        for handle in self._files.values():
            with suppress(OSError):
                handle.close()
        self._files.clear()
