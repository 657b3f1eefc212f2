"""Writing small patch series for tests: real edits to real files in a scratch clone, diffed by git.

Used by the patch engine and CLI tests; the files look like `git format-patch` output with the
header fields our lint requires.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path


def git_out(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True, text=True).stdout.strip()


HEADER = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: mlstack-ds tests <tests@mlstack-ds.invalid>
Date: Sat, 1 Jan 2000 00:00:00 +0000
Subject: [PATCH] {subject}

Without this patch the test cannot see its marker and fails with:
    AssertionError: marker missing

Origin: mlstack-ds
Forwarded: not-needed
Last-Update: 2026-11-22
---
"""


def copy_tree(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, symlinks=True)
    return dest


Edit = Callable[[Path], None]


def insert_line(rel: str, after: int, text: str) -> Edit:
    def edit(tree: Path) -> None:
        lines = (tree / rel).read_text().splitlines(keepends=True)
        lines.insert(after, text + "\n")
        (tree / rel).write_text("".join(lines))
    return edit


def replace_text(rel: str, old: str, new: str) -> Edit:
    def edit(tree: Path) -> None:
        content = (tree / rel).read_text()
        assert old in content, (rel, old)
        (tree / rel).write_text(content.replace(old, new, 1))
    return edit


def new_file(rel: str, text: str) -> Edit:
    def edit(tree: Path) -> None:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return edit


class PatchMaker:
    """Writes git format-patch-style files: edits are made in a scratch clone and diffed by git."""

    def __init__(self, template: Path, work: Path) -> None:
        self.work = work
        subprocess.run(["git", "clone", "-q", str(template), str(work)], check=True)

    def diff(self, *edits: Edit, base: tuple[Edit, ...] = ()) -> str:
        """The diff of `edits`, made on top of the pristine tree changed by `base` (then reset)."""
        start = git_out(self.work, "rev-parse", "HEAD")
        for edit in base:
            edit(self.work)
        self._commit("base")
        for edit in edits:
            edit(self.work)
        git_out(self.work, "add", "-A")
        text = subprocess.run(["git", "diff", "--cached"], cwd=self.work, check=True, capture_output=True,
                              text=True).stdout
        subprocess.run(["git", "reset", "-q", "--hard", start], cwd=self.work, check=True)
        return text

    def _commit(self, message: str) -> None:
        git_out(self.work, "add", "-A")
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                        "-m", message], cwd=self.work, check=True)


def write_series(directory: Path, patches: dict[str, tuple[str, str]]) -> Path:
    """patches: name -> (subject, diff). Returns the series file."""
    directory.mkdir(parents=True)
    for name, (subject, diff) in patches.items():
        (directory / name).write_text(HEADER.format(subject=subject) + diff)
    (directory / "series").write_text("# test series\n" + "\n".join(patches) + "\n")
    return directory / "series"
