"""Where output goes: data to stdout (exactly one JSON document with `--json`), everything else to stderr.

Consoles are made per command invocation and passed down, so there is no module-level state.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from rich.console import Console


@dataclass(frozen=True)
class Output:
    """The pair of consoles a command writes to."""

    out: Console
    err: Console
    json_mode: bool = False

    def status(self, message: str) -> None:
        """Progress and notes: stderr, so that stdout stays machine-readable."""
        self.err.print(message)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/] {message}", highlight=False)

    def emit_json(self, document: Any) -> None:
        """Print one JSON document on stdout, unstyled."""
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()


def make_output(json_mode: bool = False) -> Output:
    return Output(
        out=Console(highlight=False, soft_wrap=False, emoji=False),
        err=Console(stderr=True, highlight=False, emoji=False),
        json_mode=json_mode,
    )
