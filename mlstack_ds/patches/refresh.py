"""Move a patch series to a new upstream release: one verdict per patch, and a draft series.

Why a draft and not an in-place edit: like quilt's `push`/`refresh` loop (Debian) or TheRock's patch
rebasing, the old series is replayed on the new tree one patch at a time, in order, and each patch that
still applies is re-diffed against the new tree so the draft carries no offset or fuzz. What upstream
already has (the patch reverse-applies) is left out; what conflicts is copied unchanged with a `.rej`
note naming the failing hunks, for a human. The shipped series is never written: the maintainer
reviews the draft and moves it into place.

Verdicts, tried in this order on the tree as the earlier patches left it:
- clean: `git apply --check` succeeds with every hunk at its recorded line;
- offset: it succeeds, some hunks at other lines (git reports each as "offset N lines");
- upstream: `git apply --reverse --check` succeeds, so the change is already in the tree;
- fuzz: it applies only when git may ignore 1 or 2 lines of context (`-C2`, `-C1`, like patch's fuzz);
- conflicts: none of the above.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from unidiff import PatchSet

from mlstack_ds.errors import MlstackError, PatchError, UsageError
from mlstack_ds.patches.engine import (
    Conflict,
    SeriesCheck,
    _diagnose,
    _git_apply_cached,
    _Scratch,
    _scratch_index,
    check_series,
)
from mlstack_ds.patches.mirror import Applicable, applicable_series, file_diff_text
from mlstack_ds.patches.series import _DIFF_START, SERIES_FILE, PatchFile, Series, load_series
from mlstack_ds.recipe import Recipe, list_recipes
from mlstack_ds.resources import data_dir
from mlstack_ds.source.gitrepo import git
from mlstack_ds.source.local import check_deepspeed_tree

_HUNK_AT = re.compile(r"^Hunk #(?P<hunk>\d+) succeeded at (?P<line>\d+)(?: \(offset (?P<offset>-?\d+) lines?\))?")
_CHECKING = re.compile(r"^Checking patch (?P<file>.+)\.\.\.$")
FUZZ_CONTEXTS = (2, 1)  # `git apply -C<n>`: at least n context lines must match (fuzz 3-n)


class Verdict(str, Enum):
    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    UPSTREAM = "upstream"
    CONFLICTS = "conflicts"


@dataclass(frozen=True)
class HunkNote:
    """Where a patch moved: a hunk applied at another line (`offset`) or with less context (`fuzz`)."""

    file: str
    hunk: int
    detail: str

    def describe(self) -> str:
        return f"{self.file} hunk {self.hunk}: {self.detail}"


@dataclass(frozen=True)
class PatchVerdict:
    name: str
    subject: str
    verdict: Verdict
    notes: tuple[HunkNote, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    context: int | None = None  # the -C<n> a fuzzy patch needs
    how: str = ""  # for `upstream`: how that was established

    def details(self) -> list[str]:
        return ([self.how] if self.how else []) + [n.describe() for n in self.notes] + \
            [c.describe() for c in self.conflicts]


@dataclass(frozen=True)
class RefreshResult:
    tree: Path
    out: Path
    verdicts: tuple[PatchVerdict, ...]
    final: SeriesCheck = field(repr=False)

    @property
    def dropped(self) -> tuple[PatchVerdict, ...]:
        return tuple(v for v in self.verdicts if v.verdict is Verdict.UPSTREAM)

    @property
    def conflicting(self) -> tuple[PatchVerdict, ...]:
        return tuple(v for v in self.verdicts if v.verdict is Verdict.CONFLICTS)

    @property
    def draft_applies(self) -> bool:
        return self.final.all_apply


Progress = Callable[[PatchVerdict], None]


def check_out_dir(out: Path, shipped: tuple[Path, ...]) -> Path:
    """Refuse (exit 2) an --out that is, or lies inside, a shipped series directory, or is not empty."""
    out = Path(os.path.abspath(out))
    resolved = out.resolve()
    for shipped_dir in shipped:
        directory = shipped_dir.resolve()
        if resolved == directory or directory in resolved.parents:
            raise UsageError(f"--out {out} is the shipped series directory {directory}",
                             hint="write the draft elsewhere, review it, then move it into place by hand")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty directory",
                         hint="pass a new directory, or remove the old draft first")
    return out


def shipped_series_dirs() -> tuple[Path, ...]:
    """Every series directory this tool ships (and each recipe's), which refresh must never write."""
    dirs = {p.parent for p in data_dir("patches").glob("*/series")}
    dirs |= {r.series_path.parent for r in list_recipes()}
    return tuple(sorted(dirs))


def check_new_tree(tree: Path, recipe: Recipe) -> Path:
    """`--tree` must be a DeepSpeed tree at the --to release (exit 2 otherwise; nothing is written)."""
    if not tree.is_dir():
        raise UsageError(f"--tree {tree} is not a directory", hint="pass an extracted sdist or a checkout")
    try:
        check_deepspeed_tree(tree, recipe, f"--tree {tree}")
    except MlstackError as exc:
        raise UsageError(exc.message, hint=f"pass a tree of {recipe.name} (an extracted sdist or checkout), "
                         "or leave out --tree to fetch its sdist") from None
    return tree


def refresh_series(series: Series, tree: Path, out: Path, *, title: str,
                   progress: Progress | None = None) -> RefreshResult:
    """Replay `series` on `tree`, write the draft series to `out` (checked with `check_out_dir` first)
    and check that the draft applies to `tree`. The tree itself is never changed."""
    tree = Path(os.path.abspath(tree))
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".refresh-", dir=parent) as tmp:
        staging = Path(tmp) / "draft"
        staging.mkdir()
        with applicable_series(tree, series) as items:
            verdicts = tuple(_replay(tree, items, staging, progress))
        _write_series_file(staging, title, verdicts)
        final = check_series(tree, load_series(staging / SERIES_FILE, mirrors=series.mirrors))
        if out.exists():
            out.rmdir()  # empty (check_out_dir)
        os.replace(staging, out)
    return RefreshResult(tree=tree, out=out, verdicts=verdicts, final=final)


def _replay(tree: Path, items: tuple[Applicable, ...], staging: Path,
            progress: Progress | None) -> Iterator[PatchVerdict]:
    with _scratch_index(tree, items) as scratch:
        for item in items:
            verdict = _classify(scratch, item)
            patch = item.patch
            if verdict.verdict in (Verdict.CLEAN, Verdict.OFFSET, Verdict.FUZZ):
                before = _write_tree(scratch)
                _apply(scratch, item, verdict)
                after = _write_tree(scratch)
                (staging / patch.name).write_text(_header(patch) + _fresh_diff(scratch, before, after, patch),
                                                  encoding="utf-8")
            elif verdict.verdict is Verdict.CONFLICTS:
                shutil.copyfile(patch.path, staging / patch.name)
                (staging / f"{patch.name}.rej").write_text(_reject_note(item, verdict), encoding="utf-8")
            if progress is not None:
                progress(verdict)
            yield verdict


def _classify(scratch: _Scratch, item: Applicable) -> PatchVerdict:
    patch = item.patch
    ok, report = _git_apply_cached(scratch, item.path, "--check", "--verbose")
    if ok:
        notes = _offsets(report, patch)
        return PatchVerdict(patch.name, patch.subject, Verdict.OFFSET if notes else Verdict.CLEAN, notes)
    errors = report
    for context in (3, *FUZZ_CONTEXTS):
        if _git_apply_cached(scratch, item.path, "--check", "--reverse", f"-C{context}")[0]:
            how = "reverse-applies" + (f" with fuzz {3 - context}" if context < 3 else "")
            return PatchVerdict(patch.name, patch.subject, Verdict.UPSTREAM, how=how)
    for context in FUZZ_CONTEXTS:
        ok, report = _git_apply_cached(scratch, item.path, "--check", "--verbose", f"-C{context}")
        if ok:
            fuzzed = tuple(HunkNote(c.file, c.hunk or 0, f"fuzz {3 - context} ({c.hunk_header})")
                           for c in _diagnose(scratch, item, report) if c.file in patch.files)
            return PatchVerdict(patch.name, patch.subject, Verdict.FUZZ, fuzzed + _offsets(report, patch),
                                context=context)
    if _result_present(scratch, patch):
        return PatchVerdict(patch.name, patch.subject, Verdict.UPSTREAM,
                            how="by content (every added line present, every removed line gone; upstream "
                                "moved the context, so check the diff by hand)")
    conflicts = tuple(c for c in _diagnose(scratch, item, errors) if c.file in patch.files or c.hunk is None)
    return PatchVerdict(patch.name, patch.subject, Verdict.CONFLICTS, conflicts=conflicts)


def _result_present(scratch: _Scratch, patch: PatchFile) -> bool:
    """Whether the tree already reads as the patch's result although the patch does not reverse-apply
    (upstream merged it and then changed the lines around it): in every file, each non-blank added line
    is there and each non-blank removed line (that the patch does not also add) is gone."""
    for patched in PatchSet(patch.text):
        added = {ln.value.strip() for h in patched for ln in h if ln.is_added and ln.value.strip()}
        removed = {ln.value.strip() for h in patched for ln in h if ln.is_removed and ln.value.strip()} - added
        if not added and not removed:
            return False
        shown = git(["show", f":{patched.path}"], cwd=scratch.tree, error=PatchError, what="git show",
                     env=scratch.env, check=False)
        if not shown.ok:
            return False
        lines = {ln.strip() for ln in shown.stdout.splitlines()}
        if not added <= lines or removed & lines:
            return False
    return True


def _offsets(report: str, patch: PatchFile) -> tuple[HunkNote, ...]:
    """The "Hunk #N succeeded at L (offset K lines)" lines of `git apply --verbose`, for the patch's own
    files (its mirrored copies move the same way)."""
    notes: list[HunkNote] = []
    current = ""
    for line in report.splitlines():
        checking = _CHECKING.match(line)
        if checking:
            current = checking["file"]
            continue
        hunk = _HUNK_AT.match(line)
        if hunk and hunk["offset"] and current in patch.files:
            notes.append(HunkNote(current, int(hunk["hunk"]), f"at line {hunk['line']}, offset {hunk['offset']} lines"))
    return tuple(notes)


def _apply(scratch: _Scratch, item: Applicable, verdict: PatchVerdict) -> None:
    extra = (f"-C{verdict.context}",) if verdict.context is not None else ()
    ok, errors = _git_apply_cached(scratch, item.path, *extra)
    if not ok:
        raise PatchError(f"{item.patch.name} passed its check but did not apply: {errors.strip()}",
                         hint="report this; the draft was not written")


def _write_tree(scratch: _Scratch) -> str:
    return git(["write-tree"], cwd=scratch.tree, error=PatchError, what="git write-tree",
               env=scratch.env).stdout.strip()


def _fresh_diff(scratch: _Scratch, before: str, after: str, patch: PatchFile) -> str:
    """The patch's change as the new tree has it, for its own files only (never the mirrored copies)."""
    return git(["diff", "--no-color", "--no-ext-diff", "--no-renames", "--full-index", "-U3", before, after,
                "--", *patch.files], cwd=scratch.tree, error=PatchError, what=f"diffing {patch.name}",
               env=scratch.env).stdout


def _header(patch: PatchFile) -> str:
    """The patch's mail header and description, verbatim (everything before its first file diff), less
    the diffstat after `---`, which the fresh diff no longer matches."""
    match = _DIFF_START.search(patch.text)
    header = patch.text[: match.start()] if match else ""
    lines = header.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.strip() == "---":
            return "".join(lines[: index + 1]) + "\n"
    return header if header.endswith("\n") or not header else header + "\n"


def _reject_note(item: Applicable, verdict: PatchVerdict) -> str:
    """A `.rej`-style file: why the patch conflicts, then each failing hunk with its file header."""
    lines = [f"# {item.patch.name} does not apply to the new tree; rebase it by hand.",
             "# Failing hunks (the patch file next to this one is the unchanged old patch):"]
    lines += [f"#   {c.describe()}" for c in verdict.conflicts]
    body = []
    failing = {(c.file, c.hunk) for c in verdict.conflicts}
    for patched in PatchSet(item.patch.text):
        diff = file_diff_text(patched)
        head = diff[: diff.index("\n@@") + 1] if "\n@@" in diff else diff
        hunks = [str(h) for i, h in enumerate(patched, start=1) if (patched.path, i) in failing]
        if hunks:
            body.append(head + "".join(hunks))
    return "\n".join(lines) + "\n" + "".join(body)


def _write_series_file(staging: Path, title: str, verdicts: tuple[PatchVerdict, ...]) -> None:
    lines = [f"# {title}",
             "# Written by `mlstack-ds patches refresh`: review every patch, update Last-Update, and finish",
             "# the ones with a .rej note before moving this directory into place.", ""]
    for v in verdicts:
        if v.verdict is Verdict.UPSTREAM:
            lines.append(f"# {v.name}: dropped, already upstream (reverse-applies)")
        elif v.verdict is Verdict.CONFLICTS:
            lines.append(f"{v.name}  # CONFLICTS: see {v.name}.rej")
        else:
            lines.append(v.name)
    (staging / SERIES_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
