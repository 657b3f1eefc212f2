"""Patch series: the `series` file, the patch files it names, and their headers and diffs.

Why parse everything up front: a series that names a missing file, a patch that does not parse, or
a path that leaves the tree is a broken *input*, refused before any tree is touched.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from mlstack_ds.errors import PatchError
from mlstack_ds.textfile import read_text

SERIES_FILE = "series"
PATCH_NAME = re.compile(r"^(?P<number>\d{4})-[A-Za-z0-9][A-Za-z0-9._+-]*\.patch$")
REQUIRED_FIELDS = ("Subject", "Origin", "Forwarded", "Last-Update")
_FIELD = re.compile(r"^(?P<key>[A-Za-z][A-Za-z-]*):[ \t]*(?P<value>.*)$")
_DIFF_START = re.compile(r"^(diff --git |--- |Index: )", re.MULTILINE)
_SUBJECT_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")


@dataclass(frozen=True)
class PatchFile:
    """One patch of a series, parsed: header fields, description, files touched, content hash."""

    name: str
    path: Path
    sha256: str
    subject: str
    fields: dict[str, str]
    description: str
    files: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Series:
    """A loaded series. `mirrors` maps a top-level directory to a copy of it that some trees hold as
    real files (e.g. the sdist's `deepspeed/ops/csrc`); hunks for the former also go to the latter."""

    directory: Path
    series_file: Path
    patches: tuple[PatchFile, ...]
    mirrors: Mapping[str, str] = field(default_factory=dict)


def read_series_names(series_file: Path) -> list[str]:
    """The patch names listed in `series_file`, in order (comments and blank lines dropped)."""
    lines = read_text(series_file, error=PatchError, what="patch series",
                      hint="check the recipe's [patches] series path or --series").splitlines()
    names = []
    for line in lines:
        entry = line.split("#", 1)[0].strip()
        if entry:
            names.append(entry)
    return names


def load_series(series_file: Path, mirrors: Mapping[str, str] | None = None) -> Series:
    """Read the series file and every patch it names; refuse missing, unsafe or unparsable patches."""
    series_file = Path(os.path.abspath(series_file))  # git later runs inside the tree, not here
    directory = series_file.parent
    patches = []
    seen: set[str] = set()
    for name in read_series_names(series_file):
        if "/" in name or "\\" in name or name in (".", ".."):
            raise PatchError(f"{series_file}: entry {name!r} is not a file name in the series directory",
                             hint="list bare file names (NNNN-name.patch) that live next to the series file")
        if name in seen:
            raise PatchError(f"{series_file}: {name} is listed twice", hint="list each patch once")
        seen.add(name)
        path = directory / name
        if not path.is_file():
            raise PatchError(f"{series_file} names {name}, which does not exist in {directory}",
                             hint="add the patch file or remove it from the series")
        patches.append(parse_patch_file(path))
    return Series(directory=directory, series_file=series_file, patches=tuple(patches),
                  mirrors=dict(mirrors or {}))


def parse_patch_file(path: Path) -> PatchFile:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(f"patch {path.name} is not UTF-8 text",
                         hint="re-create it with git format-patch") from exc
    match = _DIFF_START.search(text)
    if match is None:
        raise PatchError(f"patch {path.name} contains no diff", hint="re-create it with git format-patch")
    header = text[: match.start()]
    try:
        patch_set = PatchSet(text)
    except UnidiffParseError as exc:
        raise PatchError(f"patch {path.name} does not parse as a unified diff: {exc}",
                         hint="re-create it with git format-patch; do not edit hunks by hand") from exc
    if len(patch_set) == 0:
        raise PatchError(f"patch {path.name} changes no file", hint="re-create it with git format-patch")
    files = []
    for patched in patch_set:
        for raw in (patched.source_file, patched.target_file):
            if raw == "/dev/null":
                continue
            rel = _strip_prefix(raw)
            problem = unsafe_path_problem(rel)
            if problem:
                raise PatchError(f"patch {path.name} touches {rel!r}: {problem}",
                                 hint="patches may only change files inside the DeepSpeed tree")
            if rel not in files:
                files.append(rel)
        if patched.is_binary_file or "GIT binary patch" in str(patched):
            raise PatchError(f"patch {path.name} has a binary change to {patched.path}",
                             hint="binary hunks cannot be reviewed; ship such files another way")
    fields, description = parse_header(header)
    subject = _SUBJECT_PREFIX.sub("", fields.get("Subject", "")).strip()
    return PatchFile(name=path.name, path=path, sha256=hashlib.sha256(data).hexdigest(), subject=subject,
                     fields=fields, description=description, files=tuple(files), text=text)


def parse_header(header: str) -> tuple[dict[str, str], str]:
    """Fields (`Subject:` with RFC 822 continuation lines, `Origin:`, ...) and the free-text description."""
    fields: dict[str, str] = {}
    description: list[str] = []
    last_key = None
    for line in header.splitlines():
        if line.startswith("From ") and not fields:
            continue  # the mbox separator line of git format-patch
        if line.strip() == "---":
            break  # diffstat follows
        match = _FIELD.match(line)
        if match and match["key"] in (*REQUIRED_FIELDS, "From", "Date", "Author", "Bug", "Applied-Upstream"):
            last_key = match["key"]
            fields[last_key] = match["value"].strip()
            continue
        if line[:1] in (" ", "\t") and last_key is not None and line.strip():
            fields[last_key] = f"{fields[last_key]} {line.strip()}"
            continue
        last_key = None
        description.append(line)
    return fields, "\n".join(description).strip()


def unsafe_path_problem(rel: str) -> str | None:
    """Why `rel` (a path from a diff) would escape or damage the tree, or None when it is fine."""
    if not rel or rel.startswith("/") or (len(rel) > 1 and rel[1] == ":"):
        return "absolute path"
    parts = PurePosixPath(rel).parts
    if ".." in parts:
        return "path leaves the tree"
    if parts and parts[0] == ".git":
        return "path inside .git"
    return None


def _strip_prefix(raw: str) -> str:
    raw = raw.split("\t", 1)[0]
    if raw.startswith(("a/", "b/")):
        return raw[2:]
    return raw
