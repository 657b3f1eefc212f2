"""Patched trees remembered in the cache's own source repository, so that a build after a change to one
patch applies only the patches from the first changed one on.

Why: applying the series is one `git apply` and one commit per patch, about 1.1 s for 23 patches on a
2-core machine, before anything compiles; whoever edits a patch (`patches refresh`, a local fix) pays it on
every rebuild. The commits are reproducible (engine.py: a fixed identity and date), so the commit the first
k patches make on a base is the same every time. After applying, the build keeps each prefix's commit under
a ref named by the base, the mirrors and the k patches' sha256, in the repository the tree was cloned from
(one the cache owns, never a user's checkout); the next build on that base starts from the longest one.
A ref is trusted as far as the wheel cache beside it is, and checked for what a stale one could get wrong:
its commit must be a line of exactly k commits on the base.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import PatchError
from mlstack_ds.patches.series import PatchFile
from mlstack_ds.source.gitrepo import git

SERIES_REF_PREFIX = "refs/mlstack-ds/series/"
RECEIVE_PACK = "git -c receive.autogc=false receive-pack"


@dataclass(frozen=True)
class Restored:
    """What `restore_prefix` found: the prefix's commits, oldest first (none: the tree is untouched), and
    the refs the store already holds, so that `remember_prefixes` writes only the new ones."""

    commits: tuple[str, ...]
    known: Mapping[str, str]


def prefix_refs(base: str, mirrors: Mapping[str, str], patches: Sequence[PatchFile]) -> tuple[str, ...]:
    """The ref of each prefix of `patches` on `base`: one per patch, the k-th naming the first k. The
    mirrors are in it because they decide what a patch changes in a tree that ships copies."""
    digest = hashlib.sha256(f"mlstack-ds series prefix 1\0{base}\0".encode())
    for source, copy in sorted(mirrors.items()):
        digest.update(f"mirror {source} {copy}\0".encode())
    refs = []
    for patch in patches:
        digest.update(f"patch {patch.sha256}\0".encode())
        refs.append(SERIES_REF_PREFIX + digest.copy().hexdigest()[:40])
    return tuple(refs)


def restore_prefix(tree: Path, store: Path, base: str, refs: Sequence[str]) -> Restored:
    """Move `tree` (clean, at `base`) to the longest prefix `store` remembers. Anything unexpected (no
    store, a ref that went away, a commit that is not k commits on the base) leaves the tree at `base`."""
    listed = git(["for-each-ref", "--format=%(objectname) %(refname)", SERIES_REF_PREFIX], cwd=store,
                 error=PatchError, what="listing the remembered patched trees", check=False)
    known = dict(reversed(line.split(" ", 1)) for line in listed.stdout.splitlines() if " " in line) \
        if listed.ok else {}
    for count in range(len(refs), 0, -1):
        if refs[count - 1] in known:
            commits = _line_of_commits(tree, store, refs[count - 1], base)
            if len(commits) != count or commits[-1] != known[refs[count - 1]]:
                break
            moved = git(["reset", "-q", "--hard", commits[-1]], cwd=tree, error=PatchError,
                        what="checking out the remembered patched tree", check=False)
            if moved.ok:
                return Restored(commits, known)
            git(["reset", "-q", "--hard", base], cwd=tree, error=PatchError, what="rolling back")
            break
    return Restored((), known)


def _line_of_commits(tree: Path, store: Path, ref: str, base: str) -> tuple[str, ...]:
    """The commits from `base` (excluded) to `ref`'s, oldest first, fetched into `tree`; () unless each
    has one parent, the one before it."""
    fetched = git(["fetch", "-q", "--no-tags", str(store), ref], cwd=tree, error=PatchError,
                  what="fetching a remembered patched tree", check=False)
    if not fetched.ok:
        return ()
    listed = git(["rev-list", "--reverse", "--parents", f"{base}..FETCH_HEAD"], cwd=tree, error=PatchError,
                 what="reading a remembered patched tree", check=False)
    commits: list[str] = []
    for line in listed.stdout.split("\n") if listed.ok else ():
        if not line:
            continue
        commit, *parents = line.split()
        if parents != [commits[-1] if commits else base]:
            return ()
        commits.append(commit)
    return tuple(commits)


def remember_prefixes(tree: Path, store: Path, refs: Sequence[str], commits: Sequence[str],
                      known: Mapping[str, str]) -> None:
    """Keep each prefix's commit (`commits[k]` for `refs[k]`) in `store`, but those it holds already. A
    cache that cannot be written (a concurrent build's lock, a full disk) only loses the speed-up."""
    new = [f"{commit}:{ref}" for ref, commit in zip(refs, commits, strict=True) if known.get(ref) != commit]
    if new:
        # The store's side of a push would start `git gc --auto`, which detaches into the background: a
        # process left behind, repacking the repository other builds clone from.
        git(["push", "-q", "--no-verify", f"--receive-pack={RECEIVE_PACK}", str(store), *new], cwd=tree,
            error=PatchError, what="remembering the patched tree", check=False)
