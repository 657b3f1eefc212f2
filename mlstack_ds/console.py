"""Where output goes: data to stdout (exactly one JSON document with `--json`), everything else to stderr.

Consoles are made per command invocation and passed down, so there is no module-level state. A command
whose result is itself a failure (`verify` with a failed check, `patches check` with a conflict) prints
its document with the error inside and marks the error `reported`, so `cli/app.py` prints no second one
(`--json` output is exactly one document, also on failure).

Tabular data goes through `print_records`, the one place that decides between a table and plain lines:
users copy paths, patch names and fix commands out of this output and grep it, so a value is never cut
short with `…` nor folded inside a word, and nothing written to a pipe or file has trailing padding.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from mlstack_ds.errors import MlstackError

# One table cell: plain text (never markup), styled text, or several values (one per line in a table).
Cell = str | Text | Sequence[str]


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

    def emit_json(self, document: Any, error: MlstackError | None = None) -> None:
        """Print one JSON document on stdout, unstyled; with `error`, the document also carries the
        `"error"` entry of the failure about to be raised (which then prints no document of its own)."""
        if error is not None:
            document = {**document, **error.to_json()}
            error.reported = True
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()


def make_output(json_mode: bool = False) -> Output:
    # soft_wrap: a line longer than the terminal is the terminal's to wrap; rich must not break it (it
    # would break paths and commands mid-word and pad the pieces with spaces).
    return Output(
        out=Console(highlight=False, soft_wrap=True, emoji=False),
        err=Console(stderr=True, highlight=False, soft_wrap=True, emoji=False),
        json_mode=json_mode,
    )


def _values(cell: Cell) -> list[str]:
    if isinstance(cell, Text):
        return cell.plain.splitlines() or [""]
    if isinstance(cell, str):
        return cell.splitlines() or [""]
    return [str(v) for v in cell] or [""]


def _table_cell(cell: Cell) -> Text:
    if isinstance(cell, Text):
        return cell
    return Text("\n".join(_values(cell)))


def print_records(console: Console, columns: Sequence[str], rows: Sequence[Sequence[Cell]], *,
                  title: str | None = None, caption: str | None = None, keyed: bool = False) -> None:
    """Rows as a table when `console` is a terminal the table fits on whole, else as plain lines.

    `keyed`: the rows are `(key, value)` pairs (a summary): a borderless grid on a terminal, `key: value`
    lines otherwise (a value with several entries: one line per entry, the key repeated). Otherwise one
    line per record, `column: value` fields joined by `; `; when a field holds several values (a
    doctor finding's fix steps, a patch's files) each record becomes a block instead: its first field as
    a heading, then one indented `column: value` line per value, so each value stays whole on its line.
    Cells are plain text (brackets are not markup); pass `rich.text.Text` for colour.
    """
    if console.is_terminal:
        table = _table(columns, rows, title=title, caption=caption, keyed=keyed)
        # Measured without a width limit (rich's own measure is clamped to the console's width).
        natural = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
        if natural <= console.width:
            console.print(table, soft_wrap=False)
            return
    lines = _plain_lines(columns, rows, title=title, caption=caption, keyed=keyed)
    for line in lines:
        console.print(Text(line.rstrip()), soft_wrap=True, highlight=False)


def _table(columns: Sequence[str], rows: Sequence[Sequence[Cell]], *, title: str | None, caption: str | None,
           keyed: bool) -> Table:
    if keyed:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(no_wrap=True)
    else:
        table = Table(title=title, caption=caption, title_justify="left")
        for column in columns:
            table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(_table_cell(cell) for cell in row))
    return table


def _plain_lines(columns: Sequence[str], rows: Sequence[Sequence[Cell]], *, title: str | None,
                 caption: str | None, keyed: bool) -> list[str]:
    lines = [f"{title}:"] if title else []
    if keyed:
        for row in rows:
            key = _values(row[0])[0]
            lines += [f"{key}: {value}".rstrip() for value in _values(row[1])]
    elif any(len(_values(cell)) > 1 for row in rows for cell in row):
        for row in rows:
            lines.append(f"{columns[0]}: {' '.join(_values(row[0]))}")
            for column, cell in zip(columns[1:], row[1:], strict=True):
                lines += [f"  {column}: {value}" for value in _values(cell) if value]
    else:
        for row in rows:
            lines.append("; ".join(f"{column}: {_values(cell)[0]}" for column, cell in zip(columns, row, strict=True)))
    if caption:
        lines.append(caption)
    return lines
