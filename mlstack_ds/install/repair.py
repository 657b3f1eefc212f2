"""Clear what an interrupted change left in site-packages, so pip installs over a clean slate.

Why pip alone does not repair it: pip moves the old DeepSpeed aside (`~eepspeed/`, `~eepspeed-0.19.5.dist-info/`
next to the originals) before writing the new files, and deletes that stash only at the end; a `kill -9`
in between keeps the stash forever (pip then warns "Ignoring invalid distribution ~eepspeed" on every
run) and leaves new files that no RECORD lists (the dist-info and its RECORD are written last). Installing
another version over such a `deepspeed/` would keep the files it does not overwrite: a mix of versions.
Only called with the journal's proof that our own change was interrupted there.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

PACKAGE = "deepspeed"
# pip's AdjacentTempDirectory: "~" + some of these + the original name with its first characters cut.
_STASH_LEADING = "-~.=%0123456789"


def is_pip_stash(name: str) -> bool:
    """Whether `name` (a site-packages entry) is pip's stash of `deepspeed/` or `deepspeed-X.dist-info/`."""
    if not name.startswith("~"):
        return False
    rest = name[1:].lstrip(_STASH_LEADING)
    stem = rest.split("-", 1)[0] if rest.endswith(".dist-info") else rest
    return len(stem) >= 4 and PACKAGE.endswith(stem)


def scrub_interrupted(site_dirs: Sequence[str]) -> list[str]:
    """Remove pip's stash of the old DeepSpeed, a dist-info without RECORD, and a `deepspeed/` no complete
    dist-info owns; returns the names removed (for the message)."""
    removed: list[str] = []
    for site in map(Path, dict.fromkeys(site_dirs)):
        if not site.is_dir():
            continue
        doomed = [entry for entry in site.iterdir() if is_pip_stash(entry.name)]
        infos = sorted(site.glob(f"{PACKAGE}-*.dist-info"))
        complete = [info for info in infos if (info / "RECORD").is_file()]
        doomed += [info for info in infos if info not in complete]
        if not complete and (site / PACKAGE).exists():
            doomed.append(site / PACKAGE)
        for entry in doomed:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed
