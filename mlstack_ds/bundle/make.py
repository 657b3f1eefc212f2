"""`mlstack-ds bundle --to DIR`: the tool's wheel and its dependencies, the pinned sdist (sha256-checked), its
patch series, DeepSpeed's runtime and build requirements (and the clients when asked) as wheels for the target,
and the manifest, all in one directory that is also a PEP 503 index (`DIR/simple`, `publish`'s format).

Why this order and these rules: every file is downloaded into a staging directory inside DIR and renamed into
place whole; pages are rewritten from what DIR holds; the manifest comes last. Run again over the same DIR, a
bundle keeps what is there (same name, same sha256) and adds what is missing, so a failed or partial run is
finished by running it again. Prebuilt DeepSpeed wheels (`--prebuilt`, or `publish --to DIR`) are published
into DIR/simple/deepspeed with their plans, as `publish` does, and listed in the manifest.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging import tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from mlstack_ds import __version__
from mlstack_ds.bundle.contents import BUILD_REQUIREMENTS, SIMPLE_DIR, requirement_name, sdist_requirements
from mlstack_ds.bundle.download import NEVER_BUNDLED, make_torch_stub, pip_download, pip_error, project_of
from mlstack_ds.bundle.manifest import (
    BundleFile,
    BundleTarget,
    Manifest,
    ManifestError,
    check_target,
    manifest_path,
    read_manifest,
    write_manifest,
)
from mlstack_ds.errors import BuildError, EnvironmentProblem, ToolError, UsageError
from mlstack_ds.index.publish import (
    Publishable,
    locked_directory,
    publish_locked,
    regenerate,
    write_text_atomically,
)
from mlstack_ds.index.simple import PLAN_SUFFIX, PROJECT, project_page, root_page
from mlstack_ds.patches import series_for_recipe
from mlstack_ds.patience import WAITS
from mlstack_ds.recipe import find_recipe
from mlstack_ds.resources import PACKAGE_DIR, data_dir
from mlstack_ds.runner import run
from mlstack_ds.source.cache import sha256_of
from mlstack_ds.source.fetch import fetch_archive, parse_source_spec

# What DeepSpeed's build needs in the target beyond torch (it builds without isolation, with the target's own
# setuptools): setuptools' bdist_wheel is there from 70.1; `wheel` adds it to older ones; ninja builds ops at once.
SOURCES_DIR = "sources"
PATCHES_DIR = "patches"


@dataclass(frozen=True)
class BundleRequest:
    """What `bundle` was asked for. None: this machine's value (`python_version`, `platform`, `torch`)."""

    to: Path
    recipe: str = "deepspeed-0.19.5"
    source: str = "pypi"
    sha256: str | None = None
    python_version: str | None = None
    platform: str | None = None
    torch: str | None = None
    with_clients: bool = False
    cache_dir: Path | None = None
    tool_wheel: Path | None = None
    prebuilt: tuple[Publishable, ...] = ()  # DeepSpeed wheels mlstack-ds built, found in its cache (`--prebuilt`)
    python: str = sys.executable  # whose pip resolves and downloads (the target's is on another machine)


def default_target(python_version: str | None, platform: str | None) -> BundleTarget:
    """The target as asked, this machine's Python and best manylinux tag (else its first tag) filling the gaps."""
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    if platform is None:
        here = list(tags.platform_tags())
        platform = next((t for t in here if t.startswith("manylinux_")), here[0] if here else "any")
    return check_target(version, platform)


def default_torch(torch: str | None) -> str:
    """The torch the target brings: `--torch`, else the one installed beside this tool (metadata only: never
    imported), else a usage error (the manifest must say which torch the bundle was made for)."""
    if torch:
        try:
            Version(torch)
        except InvalidVersion:
            raise UsageError(f"--torch {torch!r} is not a version", hint="e.g. --torch 2.7.1") from None
        return torch
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise UsageError("no torch here to take the version from", hint="name the torch the offline machine has: "
                         "--torch 2.7.1 (it is never bundled; the manifest records it)") from None


def make_bundle(request: BundleRequest, status: Callable[[str], None] = lambda _m: None) -> Manifest:
    """Write or complete the bundle in `request.to`; the manifest written (also returned)."""
    started = time.monotonic()
    target = default_target(request.python_version, request.platform)
    torch = default_torch(request.torch)
    recipe = find_recipe(request.recipe)
    series = series_for_recipe(recipe)
    spec = parse_source_spec(request.source, sha256=request.sha256)
    to = Path(os.path.abspath(request.to))
    # Into the fetch cache, before DIR is touched: a source that is no archive, or not the pin, leaves no trace.
    status(f"the pinned sdist of {recipe.name} (sha256 {recipe.sdist.sha256[:16]}...)")
    archive = fetch_archive(recipe, spec, request.cache_dir)
    runtime = sdist_requirements(archive)
    for item in request.prebuilt:
        check_prebuilt_python(item, target)
    with locked_directory(to, "bundle"):
        _refuse_other_target(to, target)
        staging = Path(tempfile.mkdtemp(prefix=".bundle-staging-", dir=to))
        try:
            entries: dict[str, BundleFile] = {}
            sdist_rel = f"{SOURCES_DIR}/{recipe.sdist.filename}"
            _place(archive, to / sdist_rel, copy=True)
            _add(entries, to, sdist_rel, "sdist", recipe.package, version=recipe.version,
                 why=f"the pinned source of {recipe.name}; its sha256 is the recipe's")
            series_dir = f"{PATCHES_DIR}/{series.directory.name}"
            _place(series.series_file, to / series_dir / "series", copy=True)
            _add(entries, to, f"{series_dir}/series", "patch", series.directory.name, version="",
                 why="the series' order")
            for patch in series.patches:
                _place(patch.path, to / series_dir / patch.name, copy=True)
                _add(entries, to, f"{series_dir}/{patch.name}", "patch", series.directory.name, version="",
                     why=f"patch of the series {series.directory.name}: {patch.subject}")
            tool = request.tool_wheel or build_tool_wheel(request.python, staging / "tool-build", status)
            clients = client_requirements() if request.with_clients else ()
            stub = make_torch_stub(staging / "torch-stub", torch)
            groups: list[tuple[str, tuple[str, ...], str]] = [
                ("runtime", runtime, f"DeepSpeed {recipe.version}'s runtime requirements"),
                ("build", BUILD_REQUIREMENTS, "what DeepSpeed's build needs in the target"),
                *([("clients", clients, "the client libraries verify checks (--with-clients)")] if clients else []),
                ("tool", (str(tool),), f"mlstack-ds {__version__} itself"),
            ]
            for kind, requirements, what in groups:
                status(f"pip download ({kind}) for {target.describe()}: {' '.join(requirements)}")
                saved = pip_download(request.python, requirements, staging / kind, target, stub)
                names = {requirement_name(r) for r in requirements}
                for path in saved:
                    name, version = project_of(path.name)
                    project = canonicalize_name(name)
                    rel = f"{SIMPLE_DIR}/{project}/{path.name}"
                    if rel in entries:
                        continue
                    _place(path, to / rel)
                    why = (f"requested: {what}" if project in names or (kind == "tool" and project == "mlstack-ds")
                           else f"a dependency pip resolved for {what}")
                    _add(entries, to, rel, kind, project, version=version, why=why)
            for item in request.prebuilt:
                status(f"adding the prebuilt {item.wheel.name}")
                publish_locked(item, to)
            _add_prebuilt(entries, to)
            write_pages(to / SIMPLE_DIR)
            bundled = {canonicalize_name(f.project) for f in entries.values()}
            assert not bundled & NEVER_BUNDLED, bundled & NEVER_BUNDLED
            manifest = Manifest(
                target=target, recipe=recipe.name, deepspeed_version=recipe.version,
                sdist_sha256=recipe.sdist.sha256, series=tuple((p.name, p.sha256) for p in series.patches),
                torch=torch, requested={"runtime": runtime, "build": BUILD_REQUIREMENTS, "clients": clients,
                                        "tool": (f"mlstack-ds=={__version__}",)},
                files=tuple(sorted(entries.values(), key=lambda f: f.path)), tool_version=__version__,
                created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                command=command_line(to, target, recipe.name, torch, request),
                notes=(f"torch {torch} is not in the bundle: the target brings its own",
                       f"made in {time.monotonic() - started:.0f} s"))
            write_manifest(to, manifest)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot write the bundle in {to}: {exc.strerror or exc}",
                                     hint="choose a writable --to directory with free space; run again to "
                                     "complete it") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return manifest


def command_line(to: Path, target: BundleTarget, recipe: str, torch: str, request: BundleRequest) -> str:
    """The bundle command as it would be typed again (recorded in the manifest)."""
    parts = ["mlstack-ds", "bundle", "--to", str(to), "--python-version", target.python_version, "--platform",
             target.platform, "--recipe", recipe, "--torch", torch]
    if request.with_clients:
        parts.append("--with-clients")
    if request.source != "pypi":
        parts += ["--source", request.source]
    return " ".join(parts)


def check_prebuilt_python(item: Publishable, target: BundleTarget) -> None:
    """A prebuilt wheel for another Python than the bundle's would never be chosen there: said now, before DIR
    is touched, not found out on the offline machine."""
    wheel_tags = parse_wheel_filename(item.wheel.name)[3]
    python_tag = "cp" + target.python_version.replace(".", "")
    if not any(t.interpreter in (python_tag, "py3") for t in wheel_tags):
        made_for = ", ".join(sorted({t.interpreter for t in wheel_tags}))
        raise UsageError(f"--prebuilt {item.wheel.name} is for {made_for}, "
                         f"and the bundle is for {target.describe()}; nothing was written",
                         hint="build the wheel with the offline machine's Python (mlstack-ds build there, or a "
                         "machine like it), or leave --prebuilt out: install --offline builds from the sdist")


def _add_prebuilt(entries: dict[str, BundleFile], to: Path) -> None:
    """DeepSpeed wheels in DIR (`--prebuilt`, or `publish --to DIR` before this run) and their plan files join
    the manifest, so the offline machine checks them like every other file; install --offline takes one that
    fits its plan (the index rules of `install --index`)."""
    project = to / SIMPLE_DIR / PROJECT
    for path in sorted(project.glob("*.whl")) if project.is_dir() else []:
        version = project_of(path.name)[1]
        _add(entries, to, f"{SIMPLE_DIR}/{PROJECT}/{path.name}", "prebuilt", PROJECT, version=version,
             why="a DeepSpeed wheel mlstack-ds built, with its plan: install --offline takes it when it fits")
        plan = path.with_name(path.name + PLAN_SUFFIX)
        if plan.is_file():
            _add(entries, to, f"{SIMPLE_DIR}/{PROJECT}/{plan.name}", "prebuilt", PROJECT, version=version,
                 why=f"the plan {path.name} was built from")


def _refuse_other_target(to: Path, target: BundleTarget) -> None:
    """One target per bundle: files for two Pythons in one DIR would make `install --offline`'s answer unclear."""
    if not manifest_path(to).exists():
        return
    try:
        old = read_manifest(to)
    except ManifestError:
        return  # replaced by this run's manifest
    if old.target != target:
        raise UsageError(f"{to} holds a bundle for {old.target.describe()}, not {target.describe()}",
                         hint="bundle each target into its own directory")


def _place(source: Path, final: Path, *, copy: bool = False) -> None:
    """`source` at `final`, whole: kept when the same content is there, refused when other content is."""
    if final.exists():
        if sha256_of(final) == sha256_of(source):
            return
        raise UsageError(f"{final} is already in the bundle with other content",
                         hint="files in a bundle never change; bundle into a new directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.partial")
    if copy:
        shutil.copyfile(source, partial)
    else:
        shutil.move(str(source), partial)
    os.chmod(partial, 0o644)
    os.replace(partial, final)


def _add(entries: dict[str, BundleFile], to: Path, rel: str, kind: str, project: str, *,
         version: str, why: str) -> None:
    path = to / rel
    entries[rel] = BundleFile(rel, sha256_of(path), path.stat().st_size, kind, project, version, why)


def client_requirements() -> tuple[str, ...]:
    """The client libraries verify's client checks run (requirements/clients.txt, shipped with the tool)."""
    text = (data_dir("requirements") / "clients.txt").read_text(encoding="utf-8")
    return tuple(e for e in (ln.split("#", 1)[0].strip() for ln in text.splitlines()) if e)


def build_tool_wheel(python: str, into: Path, status: Callable[[str], None]) -> Path:
    """mlstack-ds's own wheel, built from the checkout this tool runs from (`pip wheel`, its build backend
    fetched as pip does for any build). An installed wheel has no sources to build from: `--tool-wheel` then."""
    root = PACKAGE_DIR.parent
    if not (root / "pyproject.toml").is_file():
        raise UsageError("this mlstack-ds was installed from a wheel, and its own wheel cannot be rebuilt here",
                         hint="pass that wheel: --tool-wheel mlstack_ds-VERSION-py3-none-any.whl")
    into.mkdir(parents=True, exist_ok=True)
    status(f"building the mlstack-ds wheel from {root}")
    try:
        result = run([python, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--progress-bar",
                      "off", "-w", str(into), str(root)], patience=WAITS["pip wheel"])
    except ToolError as exc:
        raise BuildError(f"pip could not run: {exc.message}", hint="install pip into this Python") from exc
    wheels = sorted(into.glob("mlstack_ds-*.whl"))
    if not result.ok or not wheels:
        raise BuildError(f"building the mlstack-ds wheel failed: {pip_error(result.stderr + result.stdout)}",
                         hint="pass a built one with --tool-wheel")
    return wheels[0]


def write_pages(simple: Path) -> None:
    """Every project directory's page from the files it holds (with their sha256), and the root page.
    DeepSpeed's page is `publish`'s (it carries each wheel's plan): regenerated its way."""
    simple.mkdir(parents=True, exist_ok=True)
    for project in sorted(d for d in simple.iterdir() if d.is_dir() and d.name != PROJECT):
        files = [(p.name, sha256_of(p), None) for p in sorted(project.iterdir())
                 if p.is_file() and p.name != "index.html" and not p.name.startswith(".")]
        write_text_atomically(project / "index.html", project_page(project.name, files))
    if (simple / PROJECT).is_dir():
        regenerate(simple)
        return
    projects = [d.name for d in simple.iterdir() if d.is_dir() and (d / "index.html").is_file()]
    write_text_atomically(simple / "index.html", root_page(projects))
