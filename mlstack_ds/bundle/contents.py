"""What a bundle holds, read without fetching, building or patching anything: DeepSpeed's runtime requirements from
the bundle's sdist, the build's requirements, where the index is, and the sha256 of each file the manifest lists.

Why apart from make.py: `install --offline`'s check (offline.py) and `doctor --offline` read a bundle; making one
fetches the sdist and loads the patch series. doctor must never reach the fetch, build or patch stages
(tests/unit/test_layers.py), so what reading needs lives here, with nothing of theirs imported.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Mapping
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from mlstack_ds.bundle.download import NEVER_BUNDLED
from mlstack_ds.bundle.manifest import Manifest
from mlstack_ds.errors import FetchError
from mlstack_ds.index.wheelfile import file_sha256

BUILD_REQUIREMENTS = ("setuptools>=70.1", "wheel", "ninja")
SIMPLE_DIR = "simple"


def requirement_name(text: str) -> str:
    """The canonical project name a requirement string names; "" when pip would not read it."""
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return ""


def sdist_requirements(archive: Path) -> tuple[str, ...]:
    """DeepSpeed's runtime requirements as its sdist spells them (`requirements/requirements.txt`, what its
    setup.py reads), torch left out: the target brings its own."""
    try:
        with tarfile.open(archive) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()
                           and re.fullmatch(r"[^/]+/requirements/requirements\.txt", m.name)), None)
            handle = tar.extractfile(member) if member is not None else None
            text = handle.read().decode("utf-8") if handle is not None else None
    except (OSError, tarfile.TarError) as exc:
        raise FetchError(f"cannot read {archive.name}: {exc}", hint="the cached archive may be damaged; remove it "
                         "from the cache and run again") from exc
    if text is None:
        raise FetchError(f"{archive.name} has no requirements/requirements.txt",
                         hint="this does not look like a DeepSpeed sdist")
    keep = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry and requirement_name(entry) not in NEVER_BUNDLED:
            keep.append(entry)
    return tuple(keep)


def file_digests(directory: Path, manifest: Manifest) -> Mapping[str, str]:
    """sha256 of each file of the manifest found in `directory` (the `present` of coverage.missing)."""
    found = {}
    for item in manifest.files:
        path = directory / item.path
        if path.is_file():
            found[item.path] = file_sha256(path)
    return found
