#!/usr/bin/env python3
"""The package's layers, and docs/architecture.md's module table made from the code.

Why generated: a hand-kept table of modules went stale with every move (it still named gitpython and
`multinode/install.py` after both had gone). The layers are declared here once; tests/unit/test_layers.py
checks the imports against them, and tests/unit/test_architecture_doc.py checks that the page holds what
`python scripts/architecture.py --write` would put there (this table and the allowed same-layer imports).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mlstack_ds"
DOC = REPO / "docs" / "architecture.md"

# Low to high; a unit (a top-level package, or a module at the root) imports its own modules and those of
# lower layers only, never another unit of its own layer unless SAME_LAYER lists the pair.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("__init__", "errors", "patience", "resources", "tomlcompat")),
    ("on the foundations", ("console", "gfx", "runner", "textfile")),
    ("recipes", ("recipe",)),
    ("scripts for the target or a node", ("target_side",)),
    ("the worker staged into the target", ("worker",)),
    ("detect", ("detect",)),
    ("installed state", ("installed",)),
    ("hosts", ("cluster",)),
    ("starting workers", ("launch",)),
    ("source", ("source",)),
    ("patches", ("patches",)),
    ("plan, ds_configs", ("plan", "dsconfig")),
    ("index", ("index",)),
    ("bundle", ("bundle",)),
    ("build", ("build",)),
    ("verify", ("verify",)),
    ("install", ("install",)),
    ("commands", ("bench", "config", "doctor", "rehearsal")),
    ("cli", ("cli",)),
    ("entry point", ("__main__",)),
]

# Units whose modules each run alone where mlstack_ds is not importable (the target interpreter, a node):
# by path, or as text on a `python -` stdin. They import nothing of mlstack_ds, not even each other, and
# only the standard library at their top level (the target's torch or DeepSpeed only inside a function).
# The worker is not one: it is staged as a package, so its modules import each other (tests/unit/test_layers.py
# holds it to its own unit).
STANDALONE_UNITS: dict[str, str] = {
    "target_side": "run by path in the target interpreter or sent as text to a node's `python -`",
}

# The imports allowed between two units of one layer: (importing unit, imported module below mlstack_ds) ->
# why. Importing a module also runs its packages' __init__.py, so those come with the entry. Why a list: a
# unit of a layer is meant to stand beside the others (commands never import each other's internals), so
# each exception is named and argued here, not found later in the code.
SAME_LAYER: dict[tuple[str, str], str] = {
    ("bench", "config.model"): "bench runs and judges the models config plans for: one ModelShape, one preset table",
    ("bench", "config.hardware"): "bench --reference finds the GPUs the way config does (detect_gpus)",
    ("bench", "config.rules"): "bench --reference sets the guide's ROCm settings beside the values config writes",
}


def summary(path: Path) -> str:
    """The docstring's first paragraph on one line, `|` escaped for a Markdown table."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    return first.replace("|", "\\|") or "(no docstring)"


def unit_modules(unit: str) -> list[Path]:
    package = PACKAGE / unit
    if package.is_dir():
        return sorted(package.rglob("*.py"), key=lambda p: (p.parent != package, str(p)))
    return [PACKAGE / f"{unit}.py"]


def table() -> str:
    """One row per module, units grouped by layer from the top down (the order a reader looks for a room)."""
    rows = ["| layer | module | what it is for |", "|---|---|---|"]
    for layer, units in reversed(LAYERS):
        for unit in units:
            for path in unit_modules(unit):
                name = path.relative_to(PACKAGE).as_posix()
                rows.append(f"| {layer} | `{name}` | {summary(path)} |")
    return "\n".join(rows)


def same_layer_table() -> str:
    """The allowed same-layer imports, so the page's "never imports each other" names its exceptions."""
    rows = ["| unit | may import | why |", "|---|---|---|"]
    rows += [f"| `{unit}` | `{target}` | {why} |" for (unit, target), why in SAME_LAYER.items()]
    return "\n".join(rows)


def patience_table() -> str:
    """patience.WAITS as a table, each wait with the comment above its entry (the reason for its numbers):
    read from the source, so the page says what the code does and why, with no second copy to keep."""
    rows = ["| wait | stall rule | ceiling | why |", "|---|---|---|---|"]
    why: list[str] = []
    shared = ""  # entries in a row under one comment share it (http connect, http read)
    for line in (PACKAGE / "patience.py").read_text(encoding="utf-8").splitlines():
        text = line.strip()
        entry = re.match(r'"([^"]+)": Patience\(ceiling_s=([\d.]+)(?:, stall_s=([\d.]+))?\),', text)
        if text.startswith("# --"):
            why, shared = [], ""
        elif text.startswith("#"):
            why.append(text[1:].strip())
        elif entry:
            name, ceiling, stall = entry.groups()
            shared = " ".join(why) or shared
            why = []
            rows.append(f"| {name} | {f'{float(stall):g} s' if stall else 'none (fixed)'} | {float(ceiling):g} s "
                        f"| {shared.replace('|', chr(92) + '|')} |")
        else:
            why, shared = [], ""
    return "\n".join(rows)


def blocks() -> dict[str, str]:
    """Each generated part of the page, by the name in its markers."""
    return {"same-layer": same_layer_table(), "modules": table(), "patience": patience_table()}


def rendered(page: str) -> str:
    for name, text in blocks().items():
        begin, end = f"<!-- {name}: generated by scripts/architecture.py, do not edit -->", f"<!-- {name}: end -->"
        head, found, rest = page.partition(begin)
        if not found or end not in rest:
            raise SystemExit(f"{DOC}: the markers {begin!r} and {end!r} are missing")
        page = f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}"
    return page


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the generated tables in {DOC.relative_to(REPO)}")
    args = parser.parse_args(argv)
    page = DOC.read_text(encoding="utf-8")
    if args.write:
        DOC.write_text(rendered(page), encoding="utf-8")
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
