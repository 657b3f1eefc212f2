"""Checks and imports for sources that are already on disk (a checkout, an extracted sdist, an archive).

Why check the content: a path is only trusted to be "DeepSpeed of the pinned version" after looking —
a checkout must contain the pinned commit, an extracted tree must say it is that version.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from mlstack_ds.errors import FetchError
from mlstack_ds.recipe import Recipe
from mlstack_ds.source.gitrepo import git


def check_deepspeed_tree(root: Path, recipe: Recipe, origin: str) -> None:
    """Refuse a tree that is not `recipe.package` at `recipe.version` (version.txt + package dir)."""
    version_file = root / "version.txt"
    package_init = root / recipe.package / "__init__.py"
    if not version_file.is_file() or not package_init.is_file():
        raise FetchError(
            f"{origin} is not a {recipe.package} source tree "
            f"(no version.txt or {recipe.package}/__init__.py)",
            hint="pass the top directory of a DeepSpeed checkout or extracted sdist",
        )
    found = version_file.read_text(encoding="utf-8", errors="replace").strip()
    if found != recipe.version:
        raise FetchError(f"{origin} is {recipe.package} {found}, but the pin is {recipe.version}",
                         hint=f"use a {recipe.version} tree, or let mlstack-ds fetch it (--source git|pypi)")


def has_commit(repo: Path, commit: str) -> bool:
    result = git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo, error=FetchError,
                 what="git cat-file", check=False)
    return result.ok


def copy_plain_tree(source: Path, target: Path) -> None:
    """Copy a non-git tree (symlinks kept as links) so importing it never touches the user's files."""
    try:
        shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    except (OSError, shutil.Error) as exc:
        raise FetchError(f"cannot copy {source}: {exc}", hint="check permissions and free space") from exc


def tree_digest(root: Path) -> str:
    """A content hash of a plain source tree, for the plan and the wheel-cache key: every path (sorted),
    whether it is executable, and each file's bytes or link's target; `.git` left out, as the import
    leaves it out. An edited tree gets a new digest, so it never reuses the wheel of the old one."""
    digest = hashlib.sha256()
    try:
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != ".git" and not os.path.islink(os.path.join(directory, d)))
            links = [d for d in os.listdir(directory) if os.path.islink(os.path.join(directory, d))]
            for name in sorted(set(files) | set(links)):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root)
                if os.path.islink(path):
                    digest.update(f"L {relative}\0{os.readlink(path)}\0".encode())
                    continue
                executable = os.access(path, os.X_OK)
                digest.update(f"F {relative} {int(executable)}\0".encode())
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
                digest.update(b"\0")
    except OSError as exc:
        raise FetchError(f"cannot read {root}: {exc.strerror or exc}", hint="check permissions") from exc
    return digest.hexdigest()
