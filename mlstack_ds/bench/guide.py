"""The AMD guide's performance tables as data (guide.toml): every cell as printed, where it sits, and what
it is read as.

Why cells and not numbers: the guide's cells are claims in its own words ("OOM", "∞", "1.19x", "92%"),
and a user checking a verdict must find the cell it is about; the value is kept as printed and parsed
here, once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from mlstack_ds.tomlcompat import tomllib

OOM = "OOM"
INFINITE = "∞"
_NUMBER = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(x|%|GB|samples/sec|B)?$")


@dataclass(frozen=True)
class Cell:
    """One cell: where it is (`table`, `row`, `column`), its `value` as printed, and how it is read."""

    table: str
    row: str
    column: str
    value: str
    kind: str  # rate | memory | speedup | reduction | efficiency | largest_model | improvement
    model: str | None = None  # a config preset (350m, 1.3b, 6.7b, 13b)
    stage: str | None = None  # ddp | 2 | 3
    world_size: int | None = None
    batch_size: str | None = None  # as the throughput table prints it
    of: str | None = None  # for a computed cell: the column it is computed from ...
    over: str | None = None  # ... and the one it is relative to
    direction: str | None = None  # for an improvement: increase | decrease | ratio

    @property
    def id(self) -> str:
        return f"{self.table}/{self.row}/{self.column}"

    @property
    def is_oom(self) -> bool:
        return self.value == OOM

    @property
    def is_infinite(self) -> bool:
        return self.value == INFINITE

    def number(self) -> float | None:
        """The printed number without its unit (`1.19x` → 1.19, `92%` → 92.0, `6.7B` → 6.7); None for OOM, ∞."""
        match = _NUMBER.match(self.value)
        return float(match.group(1)) if match else None

    def decimals(self) -> int:
        """Decimal places as printed: how exactly the guide's arithmetic can be checked."""
        match = _NUMBER.match(self.value)
        return len(match.group(1).partition(".")[2]) if match else 0

    def conditions(self) -> dict[str, Any]:
        found = {"model": self.model, "stage": self.stage, "world_size": self.world_size,
                 "batch_size": self.batch_size, "of": self.of, "over": self.over}
        return {key: value for key, value in found.items() if value is not None}


@dataclass(frozen=True)
class Guide:
    source: dict[str, Any]
    tables: dict[str, dict[str, str]]
    cells: tuple[Cell, ...]
    config_values: tuple[dict[str, str], ...]

    def cell(self, table: str, row: str, column: str) -> Cell:
        for cell in self.cells:
            if (cell.table, cell.row, cell.column) == (table, row, column):
                return cell
        raise KeyError(f"{table}/{row}/{column}")


_CELL_KEYS = ("kind", "model", "stage", "world_size", "batch_size", "of", "over", "direction")


@cache
def load_guide() -> Guide:
    text = resources.files("mlstack_ds.bench").joinpath("guide.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    cells = tuple(Cell(str(c["table"]), str(c["row"]), str(c["column"]), str(c["value"]),
                       **{key: c[key] for key in _CELL_KEYS if key in c}) for c in data["cells"])
    return Guide(dict(data["source"]), {name: dict(t) for name, t in data["tables"].items()}, cells,
                 tuple(dict(v) for v in data.get("config_values", [])))
