"""docs/architecture.md's module table is the one scripts/architecture.py makes from the code's docstrings."""

from __future__ import annotations

from types import ModuleType


def test_the_module_table_is_current(architecture: ModuleType) -> None:
    page = architecture.DOC.read_text(encoding="utf-8")
    assert architecture.rendered(page) == page, "regenerate it: python scripts/architecture.py --write"


def test_the_table_names_every_module_once(architecture: ModuleType) -> None:
    table = architecture.table()
    modules = sorted(p.relative_to(architecture.PACKAGE).as_posix() for p in architecture.PACKAGE.rglob("*.py"))
    assert [m for m in modules if table.count(f"`{m}`") != 1] == []
