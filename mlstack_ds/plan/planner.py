"""The one way from a detected machine and the user's choices to a `BuildPlan`, shared by `install`,
`build` and the ROCm build rehearsal (which used to assemble the same inputs by hand)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mlstack_ds.detect.model import Environment
from mlstack_ds.detect.toolchain import Toolchain
from mlstack_ds.patches import series_for_recipe
from mlstack_ds.plan.buildplan import BuildPlan, PatchRef, PlanOptions, make_plan
from mlstack_ds.recipe import Recipe
from mlstack_ds.source.fetch import SourceSpec, pin_source


def plan_build(environment: Environment, recipe: Recipe, source: SourceSpec, toolchain: Toolchain, *,
               archs: Sequence[str] | None = None, jobs: int | None = None, patches: bool = True,
               source_label: str | None = None, mem_available: int | None = None,
               toolchain_optional: bool = False, offline_simple: Path | None = None) -> BuildPlan:
    """`make_plan` with the source pin the build will really use (and what to note about it, a dirty
    checkout say) and the series' own digests.
    `source_label`: how the plan names the source (the user's `--source`); default the spec's kind.
    `toolchain_optional`: a missing compiler is recorded in the plan, not refused (`install --index`).
    `offline_simple`: the bundle's wheels (`install --offline`), where a fix's pip takes a package from."""
    refs = [PatchRef(p.name, p.sha256) for p in series_for_recipe(recipe).patches] if patches else []
    pinned = pin_source(recipe, source)
    options = PlanOptions(source=source_label or source.kind, archs=tuple(archs) if archs is not None else None,
                          jobs=jobs, patches=patches, source_pin=pinned.pin, source_notes=pinned.notes,
                          toolchain_optional=toolchain_optional, offline_simple=offline_simple)
    return make_plan(environment, recipe, toolchain, refs, options, mem_available=mem_available)
