"""Mirrored directories: apply a patch's hunks to a copy of a directory that some trees ship as real files.

Why: DeepSpeed's git tag has `deepspeed/ops/csrc` and `deepspeed/ops/op_builder` as symlinks to the
top-level `csrc/` and `op_builder/`, but its sdist ships them as real copies. Patches name the top-level
paths (as upstream does). On a tree where the copy is a real directory, each file diff under a mirrored
directory is duplicated with the copy's path, so both change together, in the same atomic `git apply`.
On a tree with symlinks nothing is duplicated. The mapping comes from the recipe (`[patches] mirrors`).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from unidiff import PatchSet
from unidiff.patch import PatchedFile

from mlstack_ds.patches.series import PatchFile, Series


@dataclass(frozen=True)
class Applicable:
    """A patch as it is applied to one particular tree: the file git reads and the paths it touches."""

    patch: PatchFile
    path: Path
    text: str
    files: tuple[str, ...]


def active_mirrors(tree: Path, mirrors: Mapping[str, str]) -> dict[str, str]:
    """The mirrors that are real directories in `tree` (a symlinked copy already follows the original)."""
    return {source: copy for source, copy in mirrors.items()
            if (tree / copy).is_dir() and not (tree / copy).is_symlink()}


@contextlib.contextmanager
def applicable_series(tree: Path, series: Series) -> Iterator[tuple[Applicable, ...]]:
    """The series' patches as they apply to `tree` (rewritten copies live in a temporary directory)."""
    active = active_mirrors(tree, series.mirrors)
    with tempfile.TemporaryDirectory(prefix="mlstack-ds-mirror-") as tmp:
        items = []
        for patch in series.patches:
            mirrored = with_mirrors(patch, active)
            if mirrored is None:
                items.append(Applicable(patch, patch.path, patch.text, patch.files))
                continue
            text, files = mirrored
            path = Path(tmp) / patch.name
            path.write_text(text, encoding="utf-8")
            items.append(Applicable(patch, path, text, files))
        yield tuple(items)


def with_mirrors(patch: PatchFile, active: Mapping[str, str]) -> tuple[str, tuple[str, ...]] | None:
    """The patch text with file diffs duplicated into active mirrors, and all paths touched; None when
    no file of the patch lies under an active mirror."""
    if not active:
        return None
    patched_files = list(PatchSet(patch.text))
    extra: list[str] = []
    files = list(patch.files)
    for patched in patched_files:
        paths = {_strip(patched.source_file), _strip(patched.target_file)} - {None}
        for source, copy in active.items():
            if any(p == source or p.startswith(f"{source}/") for p in paths if p):
                extra.append(_rewrite(file_diff_text(patched), source, copy))
                files += [copy + p[len(source):] for p in sorted(p for p in paths if p)
                          if p == source or p.startswith(f"{source}/")]
    if not extra:
        return None
    text = "".join(file_diff_text(p) for p in patched_files) + "".join(extra)
    return text, tuple(dict.fromkeys(files))


def file_diff_text(patched: PatchedFile) -> str:
    """One file's diff on its own: from its `diff --git` line (no mail header), the ---/+++ lines, hunks."""
    info = [str(line) for line in patched.patch_info]
    starts = [i for i, line in enumerate(info) if line.startswith("diff --git ")]
    header = "".join(info[starts[-1]:]) if starts else ""
    return header + f"--- {patched.source_file}\n+++ {patched.target_file}\n" + "".join(str(h) for h in patched)


def _rewrite(diff: str, source: str, copy: str) -> str:
    """Point a file diff's header paths (`a/`, `b/`, rename/copy lines) from `source/` to `copy/`."""
    cut = diff.find("\n@@")
    head, body = (diff[: cut + 1], diff[cut + 1:]) if cut >= 0 else (diff, "")
    head = re.sub(rf"(^|[ \t])(a/|b/)?{re.escape(source)}/", rf"\g<1>\g<2>{copy}/", head, flags=re.MULTILINE)
    return head + body


def _strip(raw: str) -> str | None:
    if raw == "/dev/null":
        return None
    raw = raw.split("\t", 1)[0]
    return raw[2:] if raw.startswith(("a/", "b/")) else raw
