"""Recipes: the pinned upstream release (git tag + commit, sdist + sha256) and its patch series, as data.

Why validate strictly on load: a typo in a recipe (`comit = ...`) would otherwise silently drop the
pin and fetch whatever the tag points at today. Unknown keys, missing fields and malformed hashes are
errors naming the file and the dotted key. `[platforms.<name>]` tables are accepted as opaque data
so another stage can define their schema without breaking this one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from packaging.version import InvalidVersion, Version

from mlstack_ds import tomlcompat
from mlstack_ds.errors import UsageError
from mlstack_ds.resources import data_dir
from mlstack_ds.textfile import read_text

SCHEMA_VERSION = 1
DEFAULT_RECIPE = "deepspeed-0.19.5"
KNOWN_PLATFORMS = frozenset({"rocm", "cuda", "cpu"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ROCM_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


class RecipeError(UsageError):
    """A recipe file that cannot be used (exit 2: the input is wrong, not the machine)."""


@dataclass(frozen=True)
class GitPin:
    url: str
    tag: str
    commit: str | None  # None: no commit could be verified when the release was pinned (sdist only)


@dataclass(frozen=True)
class SdistPin:
    filename: str
    sha256: str


@dataclass(frozen=True)
class Recipe:
    """One pinned release. `name` is the file stem (`deepspeed-0.19.5`)."""

    name: str
    path: Path
    package: str
    version: str
    min_rocm: str
    git: GitPin
    sdist: SdistPin
    series_path: Path
    # Top-level dir -> copy of it that some sources ship as real files (see [patches] mirrors).
    patch_mirrors: Mapping[str, str]
    platforms: Mapping[str, Mapping[str, Any]]

    @property
    def requirement(self) -> str:
        """What pip is asked for when the source is the package index."""
        return f"{self.package}=={self.version}"

    @property
    def default_tree(self) -> Path:
        """Where `fetch` puts the tree, and where the `patches` commands look for it: ./deepspeed-VERSION."""
        return Path(f"{self.package}-{self.version}")


def recipes_dir() -> Path:
    return data_dir("recipes")


def load_recipe(path: Path) -> Recipe:
    """Read and validate one recipe file."""
    text = read_text(path, error=RecipeError, what="recipe",
                     hint="check the path, or run `mlstack-ds recipes list`")
    try:
        data = tomlcompat.loads(text)
    except tomlcompat.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML ({exc})", hint="fix the syntax error shown") from exc
    return parse_recipe(data, path)


def find_recipe(name_or_path: str | Path = DEFAULT_RECIPE) -> Recipe:
    """A shipped recipe by name (`deepspeed-0.19.5`) or by version (`0.19.5`, what `--deepspeed-version`
    always took), or a recipe file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.is_file():
        return load_recipe(candidate)
    shipped = recipes_dir() / f"{name_or_path}.toml"
    if not shipped.is_file() and "/" not in str(name_or_path):
        shipped = recipes_dir() / f"deepspeed-{name_or_path}.toml"
    if not shipped.is_file():
        names = ", ".join(p.stem for p in sorted(recipes_dir().glob("*.toml"))) or "none"
        raise RecipeError(f"no recipe named {name_or_path!r}", hint=f"available recipes: {names}")
    return load_recipe(shipped)


def list_recipes() -> list[Recipe]:
    return [load_recipe(p) for p in sorted(recipes_dir().glob("*.toml"))]


def parse_recipe(data: Mapping[str, Any], path: Path) -> Recipe:
    """Validate the TOML document `data` read from `path` and build the frozen `Recipe`."""
    top = _Table(data, path, "")
    top.only({"schema", "package", "version", "min_rocm", "source", "patches", "platforms"})
    schema = top.get("schema", int)
    if schema != SCHEMA_VERSION:
        raise top.error("schema", f"is {schema}, this mlstack-ds reads schema {SCHEMA_VERSION}")
    package = top.get("package", str)
    version = top.get("version", str)
    try:
        Version(version)
    except InvalidVersion:
        raise top.error("version", f"{version!r} is not a version number") from None
    min_rocm = top.get("min_rocm", str)
    if not _ROCM_VERSION.match(min_rocm):
        raise top.error("min_rocm", f"{min_rocm!r} is not a ROCm version like \"5.7\"")

    source = top.table("source")
    source.only({"git", "sdist"})
    git = source.table("git")
    git.only({"url", "tag", "commit"})
    # `commit` may be left out when it cannot be verified (no access to the repository when pinning);
    # `--source git` then needs --git-commit, and the sdist's sha256 stays the pin.
    commit = git.get("commit", str) if "commit" in git.data else None
    if commit is not None and not _COMMIT.match(commit):
        raise git.error("commit", f"{commit!r} is not a full 40-character lowercase hex commit id")
    sdist = source.table("sdist")
    sdist.only({"filename", "sha256"})
    sha256 = sdist.get("sha256", str)
    if not _SHA256.match(sha256):
        raise sdist.error("sha256", f"{sha256!r} is not 64 lowercase hex characters")

    patches = top.table("patches")
    patches.only({"series", "mirrors"})
    series = patches.get("series", str)
    series_rel = Path(series)
    if series_rel.is_absolute() or ".." in series_rel.parts:
        raise patches.error("series", f"{series!r} must be a relative path inside the data directory")
    mirrors: dict[str, str] = {}
    if "mirrors" in patches.data:
        table = patches.table("mirrors")
        for source_dir in table.data:
            target = table.get(source_dir, str)
            for rel in (source_dir, target):
                parts = Path(rel).parts
                if Path(rel).is_absolute() or ".." in parts or not parts:
                    raise table.error(source_dir, f"{rel!r} must be a relative path inside the tree")
            mirrors[source_dir] = target

    platforms: dict[str, Mapping[str, Any]] = {}
    if "platforms" in data:
        table = top.table("platforms")
        table.only(KNOWN_PLATFORMS)
        for name in table.data:
            platforms[name] = MappingProxyType(dict(table.table(name).data))

    return Recipe(
        name=path.stem,
        path=path,
        package=package,
        version=version,
        min_rocm=min_rocm,
        git=GitPin(url=git.get("url", str), tag=git.get("tag", str), commit=commit),
        sdist=SdistPin(filename=sdist.get("filename", str), sha256=sha256),
        # recipes/ and patches/ are siblings both in a checkout and in the wheel's _data/.
        series_path=path.resolve().parent.parent / series_rel,
        patch_mirrors=MappingProxyType(mirrors),
        platforms=MappingProxyType(platforms),
    )


@dataclass(frozen=True)
class _Table:
    """A TOML table being validated; knows its dotted name for error messages."""

    data: Mapping[str, Any]
    path: Path
    prefix: str

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def error(self, name: str, problem: str) -> RecipeError:
        return RecipeError(f"{self.path}: key {self.key(name)!r} {problem}",
                           hint="fix the recipe file; see recipes/deepspeed-0.19.5.toml for the format")

    def only(self, allowed: set[str] | frozenset[str]) -> None:
        for name in self.data:
            if name not in allowed:
                raise self.error(name, f"is not known here (expected one of: {', '.join(sorted(allowed))})")

    def get(self, name: str, kind: type) -> Any:
        if name not in self.data:
            raise self.error(name, "is missing")
        value = self.data[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(name, f"must be a {kind.__name__}, not {type(value).__name__}")
        if kind is str and not value.strip():
            raise self.error(name, "must not be empty")
        return value

    def table(self, name: str) -> _Table:
        value = self.get(name, dict)
        return _Table(value, self.path, f"{self.key(name)}.")
