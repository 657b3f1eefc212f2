"""`mlstack-ds fetch`: get upstream DeepSpeed at exactly the pinned release into a clean git tree."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from mlstack_ds.cli.options import (
    DEFAULT_SOURCE,
    CacheDirOption,
    GitCommitOption,
    GitUrlOption,
    JsonOption,
    RecipeOption,
    Sha256Option,
    SourceOption,
)
from mlstack_ds.console import Output, make_output
from mlstack_ds.recipe import DEFAULT_RECIPE, find_recipe
from mlstack_ds.source import fetch_source, parse_source_spec


def register(app: typer.Typer) -> None:
    @app.command()
    def fetch(
        *,
        source: SourceOption = DEFAULT_SOURCE,
        dest: Annotated[Path | None, typer.Option(
            "--dest", help="Where the tree goes (default ./deepspeed-VERSION); must not exist or be empty."
        )] = None,
        cache_dir: CacheDirOption = None,
        git_url: GitUrlOption = None,
        git_commit: GitCommitOption = None,
        sha256: Sha256Option = None,
        recipe_name: RecipeOption = DEFAULT_RECIPE,
        json_output: JsonOption = False,
    ) -> None:
        """Fetch the pinned DeepSpeed source (PyPI sdist by default; git tag, tarball URL or local path)."""
        output = make_output(json_output)
        recipe = find_recipe(recipe_name)
        spec = parse_source_spec(source, git_url=git_url, git_commit=git_commit, sha256=sha256)
        if spec.git_commit and spec.git_commit != recipe.git.commit:
            pinned = f"the pinned {recipe.git.commit}" if recipe.git.commit else "no pinned commit"
            output.warn(f"expecting commit {spec.git_commit} for {recipe.git.tag}, {pinned} (--git-commit)")
        target = dest if dest is not None else recipe.default_tree
        output.status(f"fetching {recipe.package} {recipe.version} from {source} ...")
        with _progress(output) as progress:
            tree = fetch_source(recipe, spec, cache_dir, target, progress=progress)
        if json_output:
            output.emit_json({**asdict(tree), "path": str(tree.path)})
        else:
            note = ", from the cache" if tree.from_cache else ""
            if tree.pin:
                note += f", its uncommitted changes committed on the pinned commit: pin {tree.pin}"
            output.out.print(f"{tree.path}  {recipe.package} {recipe.version} at {tree.commit} "
                             f"(source {tree.kind}: {tree.origin}{note})")


class _progress:
    """A download bar on stderr, drawn only once bytes arrive (git/pypi/cached fetches show none)."""

    def __init__(self, output: Output) -> None:
        self._output = output
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> _progress:
        return self

    def __call__(self, received: int, total: int | None) -> None:
        if self._bar is None:
            self._bar = Progress("download", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                 console=self._output.err, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("download", total=total)
        assert self._task is not None
        self._bar.update(self._task, completed=received, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
