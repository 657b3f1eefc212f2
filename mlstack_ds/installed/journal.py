"""The change journal: a note written before pip touches DeepSpeed's files and removed after the receipt.

Why: pip replaces a DeepSpeed by moving the old files aside, then writing the new ones; a `kill -9` (of
the tool and its pip, an OOM kill, a lost node) in between leaves part of the new version, or nothing,
with the old receipt still in place. The journal (`<prefix>/share/mlstack-ds/change-in-progress.json`)
survives that; the next `install` finds it while holding the environment's lock (so its writer is gone),
and repairs; `status` reports it.

While the journal exists, a guard `.pth` in site-packages makes `import deepspeed` fail with a message
naming the repair: a half-written DeepSpeed is never imported (by a job started meanwhile, or after a
kill), so what imports is the previous DeepSpeed (before pip starts), none, or the finished new one.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.installed.lock import is_locked
from mlstack_ds.target_side import mlstack_change_guard as guard_module
from mlstack_ds.target_side import source

GUARD_NAME = "mlstack-ds-change-in-progress.pth"


def journal_path(prefix: str | Path) -> Path:
    return Path(prefix) / "share" / "mlstack-ds" / "change-in-progress.json"


@dataclass(frozen=True)
class Journal:
    """What a change was doing: which command, from which DeepSpeed to which, and what the receipt would
    have recorded as the previous install (the repair keeps it, so `rollback` still goes back there)."""

    action: str  # "install" | "rollback" | "uninstall"
    pid: int
    started_at: str
    from_version: str | None
    to_version: str | None
    python: str
    previous: dict[str, Any] | None = None  # receipt.PreviousInstall as a dict (install only)
    guards: tuple[str, ...] = ()  # the guard files written, removed when the change ends

    def describe(self) -> str:
        change = f"DeepSpeed {self.from_version or 'none'} -> {self.to_version or 'none'}"
        return f"`mlstack-ds {self.action}` (pid {self.pid}, started {self.started_at}: {change})"


def read_journal(prefix: str | Path) -> Journal | None:
    """The journal of a change that has not ended (running now or interrupted); None when there is none.
    An unreadable journal still means a change did not end: it is reported with what is known."""
    path = journal_path(prefix)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Journal(**{**data, "guards": tuple(data.get("guards", ()))})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        return Journal("unknown", 0, "unknown", None, None, "unknown")


def begin_change(prefix: str | Path, site_dirs: Sequence[str], journal: Journal) -> Journal:
    """Write the journal, then the guard (in that order: a guard is never left without its journal)."""
    guards = tuple(str(Path(d) / GUARD_NAME) for d in dict.fromkeys(site_dirs))
    journal = Journal(**{**asdict(journal), "guards": guards})
    _write_atomically(journal_path(prefix), json.dumps(asdict(journal), indent=2) + "\n")
    message = (f"DeepSpeed in {prefix} is being changed by {journal.describe()}, or that change was "
               f"interrupted: `mlstack-ds status --python {journal.python}` says which; `mlstack-ds install` "
               "repairs an interrupted one")
    for guard in guards:
        _write_atomically(Path(guard), guard_line(message))
    return journal


def lift_guard(journal: Journal, site_dirs: Sequence[str] = ()) -> None:
    """DeepSpeed's files are complete again: imports may proceed (the journal stays until the receipt).
    `site_dirs`: also look there (a journal that could not be read does not name its guards)."""
    for guard in (*journal.guards, *(str(Path(d) / GUARD_NAME) for d in site_dirs)):
        Path(guard).unlink(missing_ok=True)


def end_change(prefix: str | Path, journal: Journal, site_dirs: Sequence[str] = ()) -> None:
    """The change is complete and recorded: remove the guard (if still there) and the journal."""
    lift_guard(journal, site_dirs)
    journal_path(prefix).unlink(missing_ok=True)


def guard_line(message: str) -> str:
    """The `.pth` line: site.py executes lines that start with `import`; this one runs
    target_side/mlstack_change_guard.py's text, which puts a finder first on `sys.meta_path` that refuses
    `deepspeed` (and its submodules) with `message`. Nothing else changes."""
    code = f"{source(guard_module)}guard({message!r}, sys.meta_path)\n"
    return f"import sys; exec({code!r})\n"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mlstack-ds-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def unfinished_change(prefix: str | Path, python: str) -> str | None:
    """A change journal that is still there: one running now, or one that was killed and left DeepSpeed
    half-swapped (imports refused until `install` repairs it). One wording for `status` and `doctor`."""
    journal = read_journal(prefix)
    if journal is None:
        return None
    if is_locked(prefix):
        return f"{journal.describe()} is changing this environment now"
    return (f"{journal.describe()} was interrupted before it finished: DeepSpeed may be half-installed and "
            f"`import deepspeed` is refused until `mlstack-ds install --python {python}` repairs it")
