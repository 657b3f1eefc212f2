"""`mlstack-ds recipes list|show`: the pinned releases this tool knows."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from mlstack_ds.buildspec import parse_platform
from mlstack_ds.cli.options import JsonOption, RecipeOption
from mlstack_ds.console import make_output
from mlstack_ds.errors import UsageError
from mlstack_ds.recipe import DEFAULT_RECIPE, Recipe, find_recipe, list_recipes


def recipe_document(recipe: Recipe) -> dict[str, Any]:
    return {
        "name": recipe.name,
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
        table = Table("recipe", "version", "git tag", "commit", "min ROCm")
        for r in found:
            table.add_row(r.name, r.version, r.git.tag, r.git.commit[:12], r.min_rocm)
        output.out.print(table)

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
        for key, value in document.items():
            if key == "platforms":
                continue
            if isinstance(value, dict):
                for sub, item in value.items():
                    output.out.print(f"{key}.{sub}: {item}")
            else:
                output.out.print(f"{key}: {value}")
        for build in builds:
            ops = Table("op", "build", "DS_BUILD flag", "why", title=f"{build.platform} (DS_ACCELERATOR="
                        f"{build.accelerator})", title_justify="left")
            for op in build.ops:
                needs = f" (needs {op.requires})" if op.requires else ""
                ops.add_row(op.name, "yes" if op.build else "no", op.flag, op.reason + needs)
            output.out.print(ops)
