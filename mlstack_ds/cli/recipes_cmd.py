"""`mlstack-ds recipes list|show`: the pinned releases this tool knows."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from mlstack_ds.cli.options import JsonOption, RecipeOption
from mlstack_ds.console import make_output, print_records
from mlstack_ds.errors import UsageError
from mlstack_ds.plan.buildspec import parse_platform
from mlstack_ds.recipe import DEFAULT_RECIPE, Recipe, find_recipe, list_recipes


def recipe_document(recipe: Recipe) -> dict[str, Any]:
    return {
        "name": recipe.name,
        "default": recipe.name == DEFAULT_RECIPE,
        "path": str(recipe.path),
        "package": recipe.package,
        "version": recipe.version,
        "min_rocm": recipe.min_rocm,
        "git": {"url": recipe.git.url, "tag": recipe.git.tag, "commit": recipe.git.commit},
        "sdist": {"filename": recipe.sdist.filename, "sha256": recipe.sdist.sha256},
        "series": str(recipe.series_path),
        "patch_mirrors": dict(recipe.patch_mirrors),
        "platforms": {name: dict(table) for name, table in recipe.platforms.items()},
    }


def register(app: typer.Typer) -> None:
    recipes = typer.Typer(help="Show the pinned releases (recipes).", no_args_is_help=True)
    app.add_typer(recipes, name="recipes")

    @recipes.command("list")
    def list_(json_output: JsonOption = False) -> None:
        """List the shipped recipes."""
        output = make_output(json_output)
        found = list_recipes()
        if json_output:
            output.emit_json([recipe_document(r) for r in found])
            return
        print_records(output.out, ("recipe", "version", "default", "git tag", "commit", "min ROCm"),
                      [(r.name, r.version, "yes" if r.name == DEFAULT_RECIPE else "no", r.git.tag,
                        r.git.commit or "not pinned (unverified)", r.min_rocm) for r in found])

    @recipes.command("show")
    def show(
        name: Annotated[str | None, typer.Argument(
            metavar="NAME|VERSION|PATH", help="The recipe (same as --recipe).", show_default=False)] = None,
        recipe_option: RecipeOption = DEFAULT_RECIPE,
        json_output: JsonOption = False,
    ) -> None:
        """Show one recipe: the pin and the patch series it uses."""
        if name is not None and recipe_option not in (DEFAULT_RECIPE, name):
            raise UsageError(f"two recipes given: {name} and --recipe {recipe_option}", hint="give one")
        output = make_output(json_output)
        recipe = find_recipe(name if name is not None else recipe_option)
        document = recipe_document(recipe)
        builds = [parse_platform(p, table, str(recipe.path)) for p, table in recipe.platforms.items()]
        if json_output:
            output.emit_json(document)
            return
        pin: list[tuple[str, str]] = []
        for key, value in document.items():
            if key == "platforms":
                continue
            if isinstance(value, dict):
                pin += [(f"{key}.{sub}", str(item)) for sub, item in value.items()]
            else:
                pin.append((key, str(value)))
        print_records(output.out, ("", ""), pin, keyed=True)
        for build in builds:
            rows = [(op.name, "yes" if op.build else "no", op.flag,
                     op.reason + (f" (needs {op.requires})" if op.requires else "")) for op in build.ops]
            print_records(output.out, ("op", "build", "DS_BUILD flag", "why"), rows,
                          title=f"{build.platform} (DS_ACCELERATOR={build.accelerator})")
