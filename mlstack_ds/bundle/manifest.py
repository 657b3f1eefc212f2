"""The bundle's manifest (`DIR/bundle.json`): what the bundle is for, what it holds, why, and every file's sha256.

Why a manifest and not just the index pages: `install --offline` must say, before anything changes, what is
missing for *this* target (another Python, another pin, a file removed or altered), and the pages cannot say
what the bundle was made for. It is written last and atomically: a bundle that failed half-way has either no
manifest or the previous one, whose files are all still there (a bundle only ever adds files).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlstack_ds.errors import UsageError
from mlstack_ds.index.publish import write_text_atomically

SCHEMA = 1
MANIFEST_NAME = "bundle.json"
_PYTHON_VERSION = re.compile(r"^3\.(\d{1,2})$")
_PLATFORM = re.compile(r"^[a-z0-9_]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# What each group of files is for; `why` of a file says more.
KINDS = ("tool", "runtime", "build", "clients", "sdist", "patch", "prebuilt")


class ManifestError(UsageError):
    """DIR is not a bundle this tool can read (exit 2: the input is wrong, not the machine)."""


@dataclass(frozen=True)
class BundleTarget:
    """The machine a bundle is for: its Python (`3.12`), its platform tag (`manylinux_2_28_x86_64`), CPython."""

    python_version: str
    platform: str
    implementation: str = "cp"

    @property
    def python_tag(self) -> str:
        """`cp312`: the interpreter tag pip matches wheels against (and the ABI tag of CPython's own)."""
        return self.implementation + self.python_version.replace(".", "")

    def describe(self) -> str:
        return f"Python {self.python_version} ({self.python_tag}) on {self.platform}"


def check_target(python_version: str, platform: str) -> BundleTarget:
    """The target from `--python-version`/`--platform`, refused with the form it takes when it is junk."""
    if not _PYTHON_VERSION.match(python_version):
        raise UsageError(f"--python-version {python_version!r} is not a CPython 3 version like 3.12",
                         hint="give major.minor of the offline machine's Python: python3 -c 'import sys; "
                         "print(*sys.version_info[:2], sep=\".\")'")
    if not _PLATFORM.match(platform) or platform in ("any", "none"):
        raise UsageError(f"--platform {platform!r} is not a wheel platform tag like manylinux_2_28_x86_64",
                         hint="on the offline machine: python3 -m pip debug --verbose (its 'Compatible tags')")
    return BundleTarget(python_version, platform)


@dataclass(frozen=True)
class BundleFile:
    """One file of the bundle: where (relative to DIR, `/`-separated), its sha256 and size, what it is and why."""

    path: str
    sha256: str
    size: int
    kind: str  # one of KINDS
    project: str  # canonical distribution name ("pydantic-core"); the patch series' directory for patches
    version: str  # "" for patches
    why: str


@dataclass(frozen=True)
class Manifest:
    """What `bundle` wrote. `requested`: the requirements asked for, per kind (pip resolved the rest);
    `series`: (patch name, sha256) in order; `torch`: the torch the target brings (never bundled)."""

    target: BundleTarget
    recipe: str
    deepspeed_version: str
    sdist_sha256: str
    series: tuple[tuple[str, str], ...]
    torch: str
    requested: Mapping[str, tuple[str, ...]]
    files: tuple[BundleFile, ...]
    tool_version: str
    created_at: str
    command: str
    schema: int = SCHEMA
    notes: tuple[str, ...] = field(default=())

    @property
    def clients(self) -> bool:
        return bool(self.requested.get("clients"))

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["target"] = {**asdict(self.target), "python_tag": self.target.python_tag}
        document["series"] = [{"name": n, "sha256": s} for n, s in self.series]
        document["requested"] = {k: list(v) for k, v in self.requested.items()}
        document["files"] = [asdict(f) for f in self.files]
        document["notes"] = list(self.notes)
        return document


def manifest_path(directory: Path) -> Path:
    return directory / MANIFEST_NAME


def read_manifest(directory: Path) -> Manifest:
    """The manifest of the bundle in `directory`, read strictly: anything else is one `ManifestError`."""
    path = manifest_path(directory)
    hint = f"make it with `mlstack-ds bundle --to {directory}` on a machine with network access"
    if not directory.is_dir():
        raise ManifestError(f"{directory} is not a directory", hint=hint)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{directory} is not a bundle (no {MANIFEST_NAME})", hint=hint) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"{path} is unreadable ({exc})", hint=hint) from None
    try:
        return parse_manifest(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{path} is not a bundle manifest this mlstack-ds reads ({type(exc).__name__}: {exc})",
                            hint=hint) from None


def parse_manifest(data: Any) -> Manifest:
    """The manifest from its JSON document; KeyError/TypeError/ValueError name what is wrong."""
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {data.get('schema')!r}, this mlstack-ds reads schema {SCHEMA}")
    target = data["target"]
    files = []
    for entry in data["files"]:
        item = BundleFile(**{k: entry[k] for k in ("path", "sha256", "size", "kind", "project", "version", "why")})
        if not _SHA256.match(item.sha256) or item.kind not in KINDS or not isinstance(item.size, int):
            raise ValueError(f"file entry {item.path!r} is malformed")
        if item.path.startswith("/") or ".." in item.path.split("/"):
            raise ValueError(f"file entry {item.path!r} points outside the bundle")
        files.append(item)
    return Manifest(
        target=check_target(str(target["python_version"]), str(target["platform"])),
        recipe=str(data["recipe"]), deepspeed_version=str(data["deepspeed_version"]),
        sdist_sha256=str(data["sdist_sha256"]),
        series=tuple((str(p["name"]), str(p["sha256"])) for p in data["series"]),
        torch=str(data["torch"]),
        requested={str(k): tuple(str(r) for r in v) for k, v in dict(data["requested"]).items()},
        files=tuple(files), tool_version=str(data["tool_version"]), created_at=str(data["created_at"]),
        command=str(data["command"]), notes=tuple(str(n) for n in data.get("notes", ())))


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Write the manifest atomically (a temporary name, then a rename): readers see the old one or the new one."""
    path = manifest_path(directory)
    write_text_atomically(path, json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n")
    return path
