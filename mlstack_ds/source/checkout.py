"""A local git checkout's working tree as a source: whether it is dirty, which files it holds, their digest.

Why: a checkout used to be pinned by its commit alone, so one with uncommitted edits got the wheel of its
clean commit back. A dirty checkout is pinned by the content of its working tree instead, and the build
copies exactly the files that digest covers: the tracked files as they are on disk (staged or not; a
deleted file is gone, a mode change counts) and the untracked files git does not ignore. Ignored files
(`.gitignore`, `.git/info/exclude`, git's own ignore file) are left out, so `build/` or the `*.so` of an
in-place build do not make every checkout dirty. Nested repositories and submodules are not copied.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import FetchError
from mlstack_ds.source.gitrepo import git

DIRTY_MARK = "+dirty."
DIGEST_CHARS = 16  # of the pin; 64 bits of sha256 name a working tree well enough within one wheel cache


@dataclass(frozen=True)
class WorkingTree:
    """What `git status` says of a checkout: its HEAD and its uncommitted changes (porcelain lines)."""

    head: str | None
    changes: tuple[str, ...]

    @property
    def dirty(self) -> bool:
        return bool(self.changes)


def working_tree_status(repo: Path) -> WorkingTree:
    """Read-only (`--no-optional-locks`: git does not refresh the user's index)."""
    status = git(["--no-optional-locks", "status", "--porcelain", "--untracked-files=all"], cwd=repo,
                 error=FetchError, what=f"git status in {repo}", hint="check that it is a usable git checkout")
    head = git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=repo, error=FetchError,
               what="git rev-parse", check=False)
    return WorkingTree(head.stdout.strip() if head.ok else None,
                       tuple(line for line in status.stdout.splitlines() if line.strip()))


def working_tree_files(repo: Path) -> tuple[str, ...]:
    """The files and links of the working tree that a build takes (see the module doc), sorted."""
    listed = git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                 error=FetchError, what=f"git ls-files in {repo}").stdout
    paths = set()
    for name in listed.split("\0"):
        full = repo / name
        if name and (full.is_symlink() or full.is_file()):  # deleted files and nested repos drop out
            paths.add(name)
    return tuple(sorted(paths))


def files_digest(root: Path, paths: Iterable[str]) -> str:
    """sha256 of `paths` under `root`: each path, whether it is a link (its target) or a file (its
    executable bit, as git records it, and its bytes). Equal content gives an equal digest, wherever it is."""
    digest = hashlib.sha256(b"mlstack-ds working tree 1\0")
    try:
        for relative in paths:
            path = root / relative
            if path.is_symlink():
                digest.update(f"L {relative}\0{os.readlink(path)}\0".encode())
                continue
            executable = bool(path.stat().st_mode & stat.S_IXUSR)
            digest.update(f"F {relative} {int(executable)}\0".encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            digest.update(b"\0")
    except OSError as exc:
        raise FetchError(f"cannot read {root}: {exc.strerror or exc} ({exc.filename})",
                         hint="a file went away while it was read; run the command again") from exc
    return digest.hexdigest()


def copy_files(source: Path, target: Path, paths: Iterable[str]) -> None:
    """Copy `paths` from `source` into `target` (links as links, the executable bit kept)."""
    try:
        for relative in paths:
            src, dst = source / relative, target / relative
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
                continue
            shutil.copyfile(src, dst)
            dst.chmod(0o755 if src.stat().st_mode & stat.S_IXUSR else 0o644)
    except OSError as exc:
        raise FetchError(f"cannot copy {source}: {exc.strerror or exc} ({exc.filename})",
                         hint="a file went away while it was copied; run the command again") from exc


def dirty_pin(commit: str, digest: str) -> str:
    """`<commit>+dirty.<digest16>`: the pinned commit the tree is built on, and the tree's content."""
    return f"{commit}{DIRTY_MARK}{digest[:DIGEST_CHARS]}"


def short_pin(pin: str, width: int = 12) -> str:
    """A pin as a user reads it: its first `width` characters, and a dirty tree's digest after them."""
    commit, mark, digest = pin.partition(DIRTY_MARK)
    return f"{commit[:width]}{mark}{digest}" if mark else pin[:width]
