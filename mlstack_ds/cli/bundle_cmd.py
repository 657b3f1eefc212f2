"""`mlstack-ds bundle --to DIR`: everything an air-gapped machine needs to install, in one directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from mlstack_ds.bundle.make import BundleRequest, make_bundle
from mlstack_ds.cli.options import (
    DEFAULT_RECIPE,
    DEFAULT_SOURCE,
    BundleToOption,
    CacheDirOption,
    JsonOption,
    RecipeOption,
    Sha256Option,
    SourceOption,
)
from mlstack_ds.console import make_output, print_records
from mlstack_ds.index.publish import publishable
from mlstack_ds.install.publish import cache_entry
from mlstack_ds.source.cache import Cache

PythonVersionOption = Annotated[str | None, typer.Option(
    "--python-version", metavar="X.Y", help="The offline machine's Python (default: this one's).")]
PlatformOption = Annotated[str | None, typer.Option(
    "--platform", metavar="TAG", help="The offline machine's wheel platform tag, e.g. manylinux_2_28_x86_64 "
    "(default: this machine's newest manylinux tag; pip takes older manylinux wheels for it too).")]
TorchOption = Annotated[str | None, typer.Option(
    "--torch", metavar="VERSION", help="The torch the offline machine has (never bundled; the manifest records it). "
    "Default: the torch installed beside mlstack-ds.")]
WithClientsOption = Annotated[bool, typer.Option(
    "--with-clients", help="Also bundle transformers, accelerate, peft and Lightning (verify's client checks).")]
PrebuiltOption = Annotated[list[str] | None, typer.Option(
    "--prebuilt", metavar="WHEEL|KEY", help="Also a DeepSpeed wheel mlstack-ds built (a path or a cache key, as "
    "`publish` takes; repeatable), for the offline machine's Python: install --offline installs it when it fits "
    "there instead of building.")]
ToolWheelOption = Annotated[Path | None, typer.Option(
    "--tool-wheel", metavar="WHEEL", help="mlstack-ds's own wheel to bundle (default: built from this checkout).")]


def bundle_command(
    to: BundleToOption,
    recipe: RecipeOption = DEFAULT_RECIPE,
    source: SourceOption = DEFAULT_SOURCE,
    sha256: Sha256Option = None,
    python_version: PythonVersionOption = None,
    platform: PlatformOption = None,
    torch: TorchOption = None,
    with_clients: WithClientsOption = False,
    tool_wheel: ToolWheelOption = None,
    prebuilt: PrebuiltOption = None,
    cache_dir: CacheDirOption = None,
    json_output: JsonOption = False,
) -> None:
    """Write what an air-gapped machine needs to install DeepSpeed into one directory.

    Run on a machine with network access, for the offline one (`--python-version`, `--platform`). DIR gets
    mlstack-ds's wheel and its dependencies, the pinned sdist (sha256-checked) and its patch series, DeepSpeed's
    runtime and build requirements as wheels for that target (pip's own resolution), the clients with
    `--with-clients`, and `bundle.json` (what, why, sha256 of every file). torch is never bundled. Copy DIR over,
    then there: `pip install --no-index --find-links DIR/simple/mlstack-ds ...` (docs/air-gapped.md) and
    `mlstack-ds install --offline DIR`.
    """
    output = make_output(json_output)
    wheels = tuple(publishable(*cache_entry(Cache.open(cache_dir), item)) for item in prebuilt or ())
    manifest = make_bundle(BundleRequest(to=to, recipe=recipe, source=source, sha256=sha256,
                                         python_version=python_version, platform=platform, torch=torch,
                                         with_clients=with_clients, cache_dir=cache_dir, tool_wheel=tool_wheel,
                                         prebuilt=wheels), status=output.status)
    if json_output:
        output.emit_json({"bundle": str(to), "manifest": manifest.to_json()})
        return
    kinds: dict[str, list[int]] = {}
    for item in manifest.files:
        count = kinds.setdefault(item.kind, [0, 0])
        count[0] += 1
        count[1] += item.size
    print_records(output.out, ("kind", "files", "MB"),
                  [(kind, str(n), f"{size / 1e6:.1f}") for kind, (n, size) in sorted(kinds.items())], title="bundled")
    total = sum(f.size for f in manifest.files)
    output.out.print(f"bundle for {escape(manifest.target.describe())} (torch {escape(manifest.torch)}, not bundled): "
                     f"{len(manifest.files)} files, {total / 1e6:.1f} MB in {escape(str(to))}")
    output.out.print(f"on the offline machine: mlstack-ds install --offline {escape(str(to))}")


def register(app: typer.Typer) -> None:
    app.command("bundle")(bundle_command)


__all__ = ["register"]
