"""Checking and applying a patch series to a tree, all-or-nothing and reproducibly.

Why a scratch index for checking: patches are checked *in sequence* (a later patch may depend on an
earlier one) without touching the tree, its index or its history. The scratch repository holds only
the files the series touches, read from the work tree, so it works on any tree (a fetched one, a
user's own checkout, even a directory without git). Applying makes one commit per patch with a fixed
identity and date, so the same pinned tree and series always give the same commit and tree hash.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from unidiff import PatchSet

from mlstack_ds.errors import PatchError
from mlstack_ds.patches.mirror import Applicable, applicable_series, file_diff_text
from mlstack_ds.patches.prefix_store import prefix_refs, remember_prefixes, restore_prefix
from mlstack_ds.patches.series import PatchFile, Series
from mlstack_ds.source.gitrepo import PRISTINE_REF, git, is_git_worktree, rev_parse


class PatchState(str, Enum):
    APPLIES = "applies"
    ALREADY_APPLIED = "already applied"
    CONFLICTS = "conflicts"


@dataclass(frozen=True)
class Conflict:
    """Where a patch fails: the file, and the hunk (1-based, with its `@@` header) when known."""

    file: str
    hunk: int | None
    hunk_header: str | None
    reason: str

    def describe(self) -> str:
        where = f"{self.file} hunk {self.hunk} ({self.hunk_header})" if self.hunk else self.file
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class PatchCheck:
    name: str
    subject: str
    state: PatchState
    conflicts: tuple[Conflict, ...] = ()


@dataclass(frozen=True)
class SeriesCheck:
    tree: Path
    results: tuple[PatchCheck, ...]

    @property
    def conflicting(self) -> tuple[PatchCheck, ...]:
        return tuple(r for r in self.results if r.state is PatchState.CONFLICTS)

    @property
    def all_apply(self) -> bool:
        return all(r.state is PatchState.APPLIES for r in self.results)

    @property
    def all_applied(self) -> bool:
        return all(r.state is PatchState.ALREADY_APPLIED for r in self.results)


@dataclass(frozen=True)
class AppliedSeries:
    """The result of `apply_series`: what `install` records in its receipt."""

    tree: Path
    base: str
    head: str
    commits: tuple[str, ...]
    tree_hash: str
    patches: tuple[tuple[str, str], ...]  # (file name, sha256)
    already_applied: bool
    restored: int = 0  # of `commits`, how many came from the cache's remembered patched trees


@dataclass(frozen=True)
class TreeStatus:
    tree: Path
    is_git: bool
    head: str | None
    pristine: str | None
    dirty: bool
    version: str | None
    check: SeriesCheck


def check_series(tree: Path, series: Series) -> SeriesCheck:
    """Classify every patch (not stopping at the first problem) against the tree's working files.

    "applies": forward-applies in sequence (on top of the earlier patches that apply). "already
    applied": reverse-applies when the series is walked backwards from the last patch, so a patch that
    a later one builds on is still recognised. Anything else conflicts, with the failing hunks named.
    """
    tree = _existing_dir(tree)
    with applicable_series(tree, series) as items:
        return _check(tree, items)


def _check(tree: Path, items: tuple[Applicable, ...]) -> SeriesCheck:
    forward, _ = _forward_pass(tree, items, diagnose=frozenset())
    applied = _reverse_pass(tree, items) if not all(forward) else set()
    broken = frozenset(i for i, ok in enumerate(forward) if not ok and i not in applied)
    diagnoses = _forward_pass(tree, items, diagnose=broken)[1] if broken else {}
    results = []
    for index, item in enumerate(items):
        if forward[index]:
            state, conflicts = PatchState.APPLIES, ()
        elif index in applied:
            state, conflicts = PatchState.ALREADY_APPLIED, ()
        else:
            state, conflicts = PatchState.CONFLICTS, diagnoses[index]
        results.append(PatchCheck(item.patch.name, item.patch.subject, state, conflicts))
    return SeriesCheck(tree=tree, results=tuple(results))


def _forward_pass(tree: Path, items: tuple[Applicable, ...], diagnose: frozenset[int]
                  ) -> tuple[list[bool], dict[int, tuple[Conflict, ...]]]:
    """Which patches apply in order (each on top of the earlier ones that do); why `diagnose` ones fail."""
    applies: list[bool] = []
    diagnoses: dict[int, tuple[Conflict, ...]] = {}
    with _scratch_index(tree, items) as scratch:
        for index, item in enumerate(items):
            ok, errors = _git_apply_cached(scratch, item.path, "--check")
            if ok:
                _git_apply_cached(scratch, item.path)  # later patches are checked on top of this one
            elif index in diagnose:
                diagnoses[index] = _diagnose(scratch, item, errors)
            applies.append(ok)
    return applies, diagnoses


def _reverse_pass(tree: Path, items: tuple[Applicable, ...]) -> set[int]:
    """Indexes of patches already in the tree: walking backwards, each one that reverse-applies is undone."""
    applied: set[int] = set()
    with _scratch_index(tree, items) as scratch:
        for index in reversed(range(len(items))):
            path = items[index].path
            if _git_apply_cached(scratch, path, "--check", "--reverse")[0]:
                _git_apply_cached(scratch, path, "--reverse")
                applied.add(index)
    return applied


def apply_series(tree: Path, series: Series, store: Path | None = None) -> AppliedSeries:
    """Apply the whole series as one commit per patch, or change nothing (PatchError, exit 5). `store`: a
    repository the cache owns, which remembers the series' patched trees (prefix_store.py says why)."""
    tree = _existing_dir(tree)
    if not is_git_worktree(tree):
        raise PatchError(f"{tree} is not a git work tree; applying needs git to commit and roll back",
                         hint="get a tree with `mlstack-ds fetch` (any --source), then apply to it")
    git(["update-index", "-q", "--refresh"], cwd=tree, error=PatchError, what="git update-index", check=False)
    changes = git(["status", "--porcelain", "--untracked-files=no"], cwd=tree, error=PatchError,
                  what="git status").stdout.strip()
    if changes:
        raise PatchError(f"{tree} has uncommitted changes ({changes.splitlines()[0].strip()})",
                         hint="commit or discard them first (git stash / git checkout .)")
    base = rev_parse(tree, "HEAD", PatchError)
    if store is None or not series.patches:
        with applicable_series(tree, series) as items:
            return _apply(tree, series, items, base)
    refs = prefix_refs(base, series.mirrors, series.patches)
    restored = restore_prefix(tree, store, base, refs)
    try:
        with applicable_series(tree, series) as items:
            applied = _apply(tree, series, items[len(restored.commits):], base, restored.commits)
    except BaseException:
        if restored.commits:
            git(["reset", "-q", "--hard", base], cwd=tree, error=PatchError, what="rolling back", check=False)
        raise
    if not applied.already_applied:
        remember_prefixes(tree, store, refs, applied.commits, restored.known)
    return applied


def _apply(tree: Path, series: Series, items: tuple[Applicable, ...], base: str,
           restored: tuple[str, ...] = ()) -> AppliedSeries:
    """Apply `items` on top of `restored`, the commits of the series' first patches already in the tree."""
    hashes = tuple((p.name, p.sha256) for p in series.patches)
    if restored and not items:
        return AppliedSeries(tree, base, restored[-1], restored, _tree_hash(tree), hashes, already_applied=False,
                             restored=len(restored))
    checked = _check(tree, items)
    if checked.conflicting:
        raise _conflict_error(tree, checked)
    if series.patches and checked.all_applied and not restored:
        return AppliedSeries(tree, base, base, (), _tree_hash(tree), hashes, already_applied=True)
    if not checked.all_apply:
        done = ", ".join(r.name for r in checked.results if r.state is PatchState.ALREADY_APPLIED)
        raise PatchError(f"{tree} is partly patched already ({done})",
                         hint=f"start from the pristine tree: git -C {tree} reset --hard {PRISTINE_REF} "
                              "(or fetch a fresh one)")
    commits = list(restored)
    try:
        for item in items:
            _apply_one(tree, item)
            commits.append(rev_parse(tree, "HEAD", PatchError))
    except BaseException:
        git(["reset", "-q", "--hard", base], cwd=tree, error=PatchError, what="rolling back", check=False)
        raise
    return AppliedSeries(tree, base, commits[-1] if commits else base, tuple(commits), _tree_hash(tree),
                         hashes, already_applied=False, restored=len(restored))


def tree_status(tree: Path, series: Series) -> TreeStatus:
    """What state an arbitrary tree is in with respect to the series (read-only)."""
    tree = _existing_dir(tree)
    is_git = is_git_worktree(tree)
    head = pristine = None
    dirty = False
    if is_git:
        head = _maybe_rev(tree, "HEAD")
        pristine = _maybe_rev(tree, PRISTINE_REF)
        dirty = bool(git(["status", "--porcelain", "--untracked-files=no"], cwd=tree, error=PatchError,
                         what="git status").stdout.strip())
    version_file = tree / "version.txt"
    version = version_file.read_text(errors="replace").strip() if version_file.is_file() else None
    return TreeStatus(tree, is_git, head, pristine, dirty, version, check_series(tree, series))


def commit_message(patch: PatchFile) -> str:
    return f"{patch.subject or patch.name}\n\nmlstack-ds patch {patch.name}\nPatch-sha256: {patch.sha256}\n"


def _apply_one(tree: Path, item: Applicable) -> None:
    patch = item.patch
    result = git(["apply", "--index", "--whitespace=nowarn", str(item.path)], cwd=tree, error=PatchError,
                 what=f"applying {patch.name}", check=False)
    if not result.ok:
        reason = _first_error(result.stderr)
        raise PatchError(f"patch {patch.name} failed to apply: {reason}",
                         hint=f"the tree was reset to {tree}'s starting commit; "
                              "run `mlstack-ds patches check` for details")
    git(["commit", "-q", "--no-verify", "--allow-empty", "-m", commit_message(patch)], cwd=tree,
        error=PatchError, what=f"committing {patch.name}")


def _tree_hash(tree: Path) -> str:
    return rev_parse(tree, "HEAD^{tree}", PatchError)


def _maybe_rev(tree: Path, rev: str) -> str | None:
    result = git(["rev-parse", "--verify", "--quiet", rev], cwd=tree, error=PatchError, what="rev-parse",
                 check=False)
    return result.stdout.strip() if result.ok else None


def _existing_dir(tree: Path) -> Path:
    tree = Path(os.path.abspath(tree))
    if not tree.is_dir():
        raise PatchError(f"tree {tree} does not exist",
                         hint="fetch one with `mlstack-ds fetch` or pass --tree")
    return tree


def _conflict_error(tree: Path, checked: SeriesCheck) -> PatchError:
    first = checked.conflicting[0]
    detail = first.conflicts[0].describe() if first.conflicts else "does not apply"
    more = len(checked.conflicting) - 1
    tail = f" (and {more} more conflicting patch{'es' if more > 1 else ''})" if more else ""
    return PatchError(f"patch {first.name} conflicts with {tree}: {detail}{tail}",
                      hint="nothing was changed; `mlstack-ds patches check --tree ...` lists every conflict")


@dataclass(frozen=True)
class _Scratch:
    tree: Path
    env: dict[str, str]


@contextlib.contextmanager
def _scratch_index(tree: Path, items: tuple[Applicable, ...]) -> Iterator[_Scratch]:
    """A throw-away git dir + index holding the work-tree files the series touches."""
    with tempfile.TemporaryDirectory(prefix="mlstack-ds-check-") as tmp:
        git_dir = Path(tmp) / "scratch.git"
        git(["init", "-q", "--bare", str(git_dir)], cwd=Path(tmp), error=PatchError, what="git init")
        env = {"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(tree),
               "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        touched = sorted({f for item in items for f in item.files if os.path.lexists(tree / f)})
        for start in range(0, len(touched), 200):
            git(["add", "-f", "--", *touched[start:start + 200]], cwd=tree, error=PatchError,
                what=f"reading files from {tree}", env=env)
        yield _Scratch(tree, env)


def _git_apply_cached(scratch: _Scratch, patch_text_path: Path, *extra: str) -> tuple[bool, str]:
    result = git(["apply", "--cached", "--whitespace=nowarn", *extra, str(patch_text_path)], cwd=scratch.tree,
                 error=PatchError, what="git apply", env=scratch.env, check=False)
    return result.ok, result.stderr


def _diagnose(scratch: _Scratch, item: Applicable, errors: str) -> tuple[Conflict, ...]:
    """Find each failing hunk by checking hunks one at a time; fall back to git's own message."""
    conflicts: list[Conflict] = []
    with tempfile.TemporaryDirectory(prefix="mlstack-ds-hunk-") as tmp:
        hunk_file = Path(tmp) / "hunk.patch"
        for patched in PatchSet(item.text):
            diff = file_diff_text(patched)
            header = diff[: diff.index("\n@@") + 1] if "\n@@" in diff else diff
            for index, hunk in enumerate(patched, start=1):
                hunk_file.write_text(header + str(hunk), encoding="utf-8")
                ok, hunk_errors = _git_apply_cached(scratch, hunk_file, "--check")
                if not ok:
                    header_line = str(hunk).splitlines()[0].strip()
                    reason = _first_error(hunk_errors).removeprefix(f"{patched.path}: ")
                    conflicts.append(Conflict(patched.path, index, header_line, reason))
    if not conflicts:
        match = re.search(r"error: (?:patch failed: )?([^:\n]+)", errors)
        conflicts.append(Conflict(match[1] if match else "?", None, None, _first_error(errors)))
    return tuple(conflicts)


def _first_error(stderr: str) -> str:
    lines = [ln.removeprefix("error: ").strip() for ln in stderr.splitlines() if ln.startswith("error:")]
    if not lines:
        return stderr.strip().splitlines()[-1] if stderr.strip() else "git apply failed"
    # git says "patch failed: f:12" then "f: patch does not apply"; the second reads better alone.
    return lines[-1] if len(lines) > 1 and lines[0].startswith("patch failed") else lines[0]
