"""The options every command shares, declared once so that they mean the same everywhere.

Why one module: `--python` used to be a `Path` in one command, a `str` in another and resolved in
three places; `--source` defaulted to `pypi` for `install` and to `git` for `fetch`; the recipe was
`--recipe` for some commands and `--deepspeed-version` for others. Commands now take these types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlstack_ds.detect.environment import resolve_python
from mlstack_ds.recipe import DEFAULT_RECIPE

# `--source` default for `fetch`, `install` and `build`: the PyPI sdist. The package index is what pip
# already reaches on machines where github.com is not (air-gapped sites run an index mirror or a
# find-links directory; proxies and certificates are pip's own configuration), and the sdist is pinned by
# sha256 in the recipe, so it is as exact as the git tag plus commit. `--source git` is one option away.
DEFAULT_SOURCE = "pypi"


def _resolve_python(value: Path | None) -> Path:
    """The one resolution of `--python` (an interpreter or a venv directory; default: this interpreter),
    done while parsing so that every command gets the same absolute path and the same refusals."""
    return resolve_python(value)


JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print one JSON document on stdout (also on failure); progress goes to stderr.")]

PythonOption = Annotated[Path | None, typer.Option(
    "--python", callback=_resolve_python, metavar="PATH",
    help="Target interpreter or venv directory (the one that has or gets DeepSpeed). Default: the one "
    "running mlstack-ds.")]

RecipeOption = Annotated[str, typer.Option(
    "--recipe", "--deepspeed-version", metavar="NAME|VERSION|PATH",
    help="The pinned release: a shipped recipe (deepspeed-0.19.5), its version (0.19.5) or a recipe .toml "
    "file. --deepspeed-version is an alias.")]

SourceOption = Annotated[str, typer.Option(
    "--source", metavar="pypi|git|URL|PATH",
    help="Where DeepSpeed's source comes from: pypi (the pinned sdist, via pip's index configuration; "
    "default), git (the pinned tag and commit), an http(s) URL of an archive, or a local checkout, "
    "sdist directory or archive.")]

# The build's own options, shared by `install` and `build` (the same plan, one stops at the wheel).
GitUrlOption = Annotated[str | None, typer.Option(
    "--git-url", help="Mirror of the DeepSpeed repo (with --source git).")]
GitCommitOption = Annotated[str | None, typer.Option("--git-commit", help="Commit the mirror's tag must be.")]
Sha256Option = Annotated[str | None, typer.Option("--sha256", help="Expected sha256 of a URL/path archive.")]
ArchOption = Annotated[str | None, typer.Option(
    "--arch", help="GPU targets, e.g. gfx1100 or gfx90a,gfx942. Default: $PYTORCH_ROCM_ARCH, else the detected "
    "discrete GPUs.")]
JobsOption = Annotated[int | None, typer.Option(
    "--jobs", help="The compile budget, split over ops, files and ROCm archs (up to twice as many compilers, "
    "so an op left alone keeps every core); clamped to what memory allows (2 GiB per "
    "compile, per arch for hipcc). 1: one compile at a time. Default: the CPUs.")]
CacheDirOption = Annotated[Path | None, typer.Option(
    "--cache-dir", help="Downloads, sources and wheels (default $XDG_CACHE_HOME/mlstack-ds).")]
NoPatchesOption = Annotated[bool, typer.Option("--no-patches", help="Build upstream as released, unpatched.")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the build plan and stop; change nothing.")]

__all__ = ["DEFAULT_RECIPE", "DEFAULT_SOURCE", "ArchOption", "CacheDirOption", "DryRunOption", "GitCommitOption",
           "GitUrlOption", "JobsOption", "JsonOption", "NoPatchesOption", "PythonOption", "RecipeOption",
           "Sha256Option", "SourceOption"]
