"""The patch stage: series files, lint, and the check/apply/status engine.

Public interface (used by `install` later): `load_series`, `series_for_recipe`, `check_series`,
`apply_series`, `tree_status`, `lint_patch_dir`, and their result types.
"""

from pathlib import Path

from mlstack_ds.patches.engine import (
    AppliedSeries,
    Conflict,
    PatchCheck,
    PatchState,
    SeriesCheck,
    TreeStatus,
    apply_series,
    check_series,
    tree_status,
)
from mlstack_ds.patches.lint import LintProblem, lint_patch, lint_patch_dir
from mlstack_ds.patches.series import PatchFile, Series, load_series
from mlstack_ds.recipe import Recipe


def series_for_recipe(recipe: Recipe, series_file: Path | None = None) -> Series:
    """The recipe's series, or the one at `series_file` when given (--series)."""
    return load_series(series_file if series_file is not None else recipe.series_path,
                       mirrors=recipe.patch_mirrors)


__all__ = [
    "AppliedSeries", "Conflict", "LintProblem", "PatchCheck", "PatchFile", "PatchState", "Series",
    "SeriesCheck", "TreeStatus", "apply_series", "check_series", "lint_patch", "lint_patch_dir",
    "load_series", "series_for_recipe", "tree_status",
]
