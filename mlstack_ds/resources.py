"""Find the data that ships with the tool (recipes, patches, catalogs).

Why: in a wheel, `patches/` and `recipes/` are copied into `mlstack_ds/_data/` (pyproject
force-include); in a checkout or editable install they are at the repository root. Both must work.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the directory `name` ("patches" or "recipes"), wherever this install keeps it."""
    for candidate in (PACKAGE_DIR / "_data" / name, PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"mlstack-ds data directory {name!r} is missing from this installation")
