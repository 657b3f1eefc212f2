"""`mlstack-ds patches list|check|apply|status|lint|refresh`: the patch series and what it does to a tree."""

from __future__ import annotations

import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from mlstack_ds.cli.options import (
    AnyTreeOption,
    CacheDirOption,
    DraftOutOption,
    JsonOption,
    NewTreeOption,
    RecipeOption,
    RefreshToOption,
    SeriesOption,
    TreeOption,
)
from mlstack_ds.console import make_output, print_records
from mlstack_ds.errors import PatchError, UsageError
from mlstack_ds.patches import (
    PatchState,
    SeriesCheck,
    apply_series,
    check_series,
    lint_patch_dir,
    series_for_recipe,
    tree_status,
)
from mlstack_ds.patches.refresh import (
    RefreshResult,
    Verdict,
    check_new_tree,
    check_out_dir,
    refresh_series,
    shipped_series_dirs,
)
from mlstack_ds.recipe import DEFAULT_RECIPE, find_recipe
from mlstack_ds.resources import data_dir
from mlstack_ds.source import fetch_source, parse_source_spec

_STYLE = {PatchState.APPLIES: "green", PatchState.ALREADY_APPLIED: "cyan", PatchState.CONFLICTS: "red"}


_VERDICT_STYLE = {Verdict.CLEAN: "green", Verdict.OFFSET: "yellow", Verdict.FUZZ: "yellow",
                  Verdict.UPSTREAM: "cyan", Verdict.CONFLICTS: "red"}


def check_document(check: SeriesCheck) -> dict[str, Any]:
    return {
        "tree": str(check.tree),
        "patches": [
            {"name": r.name, "subject": r.subject, "state": r.state.value,
             "conflicts": [asdict(c) for c in r.conflicts]}
            for r in check.results
        ],
    }


def _print_check(check: SeriesCheck, console: Console) -> None:
    rows = [(r.name, Text(r.state.value, style=_STYLE[r.state]),
             [c.describe() for c in r.conflicts] or [r.subject]) for r in check.results]
    print_records(console, ("patch", "state", "details"), rows)


def register(app: typer.Typer) -> None:
    patches = typer.Typer(help="Inspect and apply the patch series.", no_args_is_help=True)
    app.add_typer(patches, name="patches")
    register_refresh(patches)

    @patches.command("list")
    def list_(
        recipe: RecipeOption = DEFAULT_RECIPE, series: SeriesOption = None, json_output: JsonOption = False
    ) -> None:
        """The series in order, with subjects and the files each patch touches."""
        output = make_output(json_output)
        loaded = series_for_recipe(find_recipe(recipe), series)
        if json_output:
            output.emit_json({"series": str(loaded.series_file), "patches": [
                {"name": p.name, "subject": p.subject, "files": list(p.files), "sha256": p.sha256,
                 "origin": p.fields.get("Origin"), "forwarded": p.fields.get("Forwarded")}
                for p in loaded.patches]})
            return
        if not loaded.patches:
            output.out.print(f"{loaded.series_file}: the series is empty")
            return
        print_records(output.out, ("patch", "subject", "files"),
                      [(p.name, p.subject, list(p.files)) for p in loaded.patches])

    @patches.command("check")
    def check(
        tree: TreeOption = None, recipe: RecipeOption = DEFAULT_RECIPE, series: SeriesOption = None,
        json_output: JsonOption = False,
    ) -> None:
        """Check every patch against a tree: applies / already applied / conflicts (exit 5 on conflicts)."""
        output = make_output(json_output)
        result = check_series(tree or find_recipe(recipe).default_tree, series_for_recipe(find_recipe(recipe), series))
        failure = None
        if result.conflicting:
            names = ", ".join(r.name for r in result.conflicting)
            failure = PatchError(f"{len(result.conflicting)} of {len(result.results)} patches conflict: {names}",
                                 hint="the tree is not the pinned release, or a patch needs refreshing")
        if json_output:
            output.emit_json(check_document(result), error=failure)
        else:
            _print_check(result, output.out)
        if failure is not None:
            raise failure

    @patches.command("apply")
    def apply(
        tree: TreeOption = None, recipe: RecipeOption = DEFAULT_RECIPE, series: SeriesOption = None,
        json_output: JsonOption = False,
    ) -> None:
        """Apply the whole series (one commit per patch, reproducible) or nothing (exit 5)."""
        output = make_output(json_output)
        result = apply_series(tree or find_recipe(recipe).default_tree, series_for_recipe(find_recipe(recipe), series))
        if json_output:
            document = asdict(result)
            document["tree"] = str(result.tree)
            document["patches"] = [{"name": n, "sha256": s} for n, s in result.patches]
            output.emit_json(document)
            return
        verb = "already applied" if result.already_applied else f"applied {len(result.commits)} patches"
        output.out.print(f"{result.tree}: {verb}; HEAD {result.head}, tree {result.tree_hash}")

    @patches.command("status")
    def status(
        tree: AnyTreeOption,
        recipe: RecipeOption = DEFAULT_RECIPE, series: SeriesOption = None, json_output: JsonOption = False,
    ) -> None:
        """Report a tree's state against the series (read-only, exit 0)."""
        output = make_output(json_output)
        result = tree_status(tree, series_for_recipe(find_recipe(recipe), series))
        summary = {"tree": str(result.tree), "git": result.is_git, "head": result.head,
                   "pristine": result.pristine, "uncommitted_changes": result.dirty,
                   "version": result.version}
        if json_output:
            output.emit_json({**summary, **check_document(result.check)})
            return
        print_records(output.out, ("", ""), [(key, str(value)) for key, value in summary.items()], keyed=True)
        _print_check(result.check, output.out)

    @patches.command("lint")
    def lint(
        directories: Annotated[list[Path] | None, typer.Argument(
            help="Patch directories (default: all shipped).")] = None,
        json_output: JsonOption = False,
    ) -> None:
        """Lint patch directories: parse, paths, binary hunks, header fields, series completeness."""
        output = make_output(json_output)
        dirs = directories or sorted(p.parent for p in data_dir("patches").glob("*/series"))
        for directory in dirs:
            if not directory.is_dir():
                raise UsageError(f"{directory}: not a directory",
                                 hint="pass patch directories such as patches/deepspeed-0.19.5")
        problems = {str(d): [str(p) for p in lint_patch_dir(d)] for d in dirs}
        count = sum(len(v) for v in problems.values())
        failure = PatchError(f"{count} lint problem(s) in the patch series", hint="fix the listed patches") \
            if count else None
        if json_output:
            output.emit_json(problems, error=failure)
        else:
            for directory, found in problems.items():
                output.out.print(f"{directory}: {'ok' if not found else f'{len(found)} problem(s)'}")
                for line in found:
                    output.out.print(f"  {escape(line)}")
        if failure is not None:
            raise failure


def refresh_document(result: RefreshResult, from_name: str, to_name: str) -> dict[str, Any]:
    return {
        "from": from_name, "to": to_name, "tree": str(result.tree), "out": str(result.out),
        "draft_applies": result.draft_applies,
        "patches": [{"name": v.name, "subject": v.subject, "verdict": v.verdict.value, "how": v.how or None,
                     "hunks": [asdict(n) for n in v.notes], "conflicts": [asdict(c) for c in v.conflicts]}
                    for v in result.verdicts],
        "dropped": [v.name for v in result.dropped],
        "draft_check": check_document(result.final)["patches"],
    }


def register_refresh(patches: typer.Typer) -> None:
    @patches.command("refresh")
    def refresh(
        to: RefreshToOption,
        from_: Annotated[str, typer.Option("--from", metavar="NAME|VERSION",
                                           help="The recipe whose series is moved.")] = DEFAULT_RECIPE,
        out: DraftOutOption = None,
        tree: NewTreeOption = None,
        cache_dir: CacheDirOption = None,
        json_output: JsonOption = False,
    ) -> None:
        """Move the --from series to the --to release: a verdict per patch and a draft series (exit 5
        unless the whole draft applies)."""
        output = make_output(json_output)
        to_recipe, from_recipe = find_recipe(to), find_recipe(from_)
        series = series_for_recipe(from_recipe)
        series = replace(series, mirrors=to_recipe.patch_mirrors)  # the copies the new tree ships
        target = check_out_dir(out if out is not None else Path(f"{to_recipe.name}.patches-draft"),
                               shipped_series_dirs())
        with tempfile.TemporaryDirectory(prefix="mlstack-ds-refresh-") as tmp:
            if tree is not None:
                new_tree = check_new_tree(tree, to_recipe)
            else:
                output.status(f"fetching {to_recipe.package} {to_recipe.version} (pypi sdist) ...")
                new_tree = fetch_source(to_recipe, parse_source_spec("pypi"), cache_dir, Path(tmp) / "tree").path

            def progress(verdict: Any) -> None:
                output.status(f"{verdict.name}: {verdict.verdict.value}"
                              + "".join(f"\n  {line}" for line in verdict.details()))

            result = refresh_series(series, new_tree, target, progress=progress,
                                    title=f"Draft series for {to_recipe.name}, refreshed from {from_recipe.name}.")
        failure = None
        if not result.draft_applies:
            names = ", ".join(r.name for r in result.final.results if r.state is not PatchState.APPLIES)
            failure = PatchError(f"the draft in {result.out} does not apply yet: {names}",
                                 hint="rebase the patches with a .rej note by hand, then run "
                                      f"`mlstack-ds patches check --series {result.out}/series --tree ...`")
        if json_output:
            output.emit_json(refresh_document(result, from_recipe.name, to_recipe.name), error=failure)
        else:
            rows = [(v.name, Text(v.verdict.value, style=_VERDICT_STYLE[v.verdict]), v.details() or [v.subject])
                    for v in result.verdicts]
            print_records(output.out, ("patch", "verdict", "details"), rows)
            output.out.print(f"draft series: {result.out} "
                             f"({'applies' if result.draft_applies else 'does not apply yet'})")
        if failure is not None:
            raise failure
