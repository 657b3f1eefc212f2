"""Lint for patch directories: every problem in every patch, not just the first (tests run it repo-wide).

Why a separate pass from `load_series`: loading stops at the first broken input; a reviewer wants the
whole list (missing header fields, unlisted files, numbering) in one go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import PatchError
from mlstack_ds.patches.series import (
    PATCH_NAME,
    REQUIRED_FIELDS,
    SERIES_FILE,
    parse_patch_file,
    read_series_names,
)

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
MIN_DESCRIPTION_CHARS = 40


@dataclass(frozen=True)
class LintProblem:
    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


def lint_patch_dir(directory: Path) -> list[LintProblem]:
    """All problems of the series in `directory` (empty list: clean)."""
    series_file = directory / SERIES_FILE
    if not series_file.is_file():
        return [LintProblem(str(directory), "no series file")]
    problems: list[LintProblem] = []
    try:
        names = read_series_names(series_file)
    except PatchError as exc:
        return [LintProblem(SERIES_FILE, exc.message)]
    on_disk = {p.name for p in directory.glob("*.patch")}
    for name in sorted(on_disk - set(names)):
        problems.append(LintProblem(name, "patch file is not listed in the series"))
    for note in sorted(p.name for p in directory.glob("*.rej")):
        # left by `patches refresh` (or `git apply --reject`): a conflict nobody has finished yet
        problems.append(LintProblem(note, "unresolved conflict note; finish the patch and delete it"))
    seen: set[str] = set()
    last_number = -1
    for name in names:
        if name in seen:
            problems.append(LintProblem(SERIES_FILE, f"{name} is listed twice"))
            continue
        seen.add(name)
        match = PATCH_NAME.match(name)
        if match is None:
            problems.append(LintProblem(SERIES_FILE, f"{name!r} is not named NNNN-short-name.patch"))
        else:
            number = int(match["number"])
            if number <= last_number:
                problems.append(LintProblem(SERIES_FILE, f"{name} is out of numeric order"))
            last_number = number
        if name not in on_disk:
            problems.append(LintProblem(SERIES_FILE, f"lists {name}, which does not exist"))
            continue
        problems.extend(lint_patch(directory / name))
    return problems


def lint_patch(path: Path) -> list[LintProblem]:
    """Problems of one patch file: parse, paths, binary hunks, header fields, description."""
    try:
        patch = parse_patch_file(path)
    except PatchError as exc:
        return [LintProblem(path.name, exc.message)]
    problems = []
    for field in REQUIRED_FIELDS:
        if not patch.fields.get(field):
            problems.append(LintProblem(path.name, f"header field {field}: is missing or empty"))
    last_update = patch.fields.get("Last-Update", "")
    if last_update and not _DATE.match(last_update):
        problems.append(LintProblem(path.name, f"Last-Update {last_update!r} is not YYYY-MM-DD"))
    if len(patch.description) < MIN_DESCRIPTION_CHARS:
        problems.append(LintProblem(
            path.name, "header lacks the paragraph saying what breaks without this patch (quote the error)"))
    return problems
