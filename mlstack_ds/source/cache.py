"""The download and clone cache: `$XDG_CACHE_HOME/mlstack-ds` (or `--cache-dir`).

Why this layout: entries are keyed by what they must contain (an archive's sha256, a git URL + tag +
commit), so a hit needs no network and cannot be stale. Every entry is written under a temporary
name inside the cache and renamed into place when complete, so an interrupted fetch leaves at most
a `tmp-*` directory that the next fetch removes, never a half-entry that looks valid.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import FetchError


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlstack-ds"


@dataclass(frozen=True)
class Cache:
    root: Path

    @classmethod
    def open(cls, root: Path | None) -> Cache:
        """Create the cache directory if needed and prove it is writable, before any download."""
        root = Path(root) if root is not None else default_cache_dir()
        hint = "choose a writable cache with --cache-dir DIR (or set XDG_CACHE_HOME)"
        try:
            for sub in ("downloads", "repos", "tmp"):
                (root / sub).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=root / "tmp", prefix="probe-"):
                pass
        except OSError as exc:
            problem = exc.strerror or exc
            raise FetchError(f"cache directory {root} is not writable: {problem}", hint=hint) from exc
        cache = cls(root)
        cache._remove_stale_tmp()
        return cache

    def download_path(self, sha256: str, filename: str) -> Path:
        return self.root / "downloads" / sha256 / filename

    def repo_path(self, key: str) -> Path:
        return self.root / "repos" / key

    @contextlib.contextmanager
    def staging_dir(self, purpose: str) -> Iterator[Path]:
        """A fresh temporary directory inside the cache, removed afterwards whatever happens."""
        path = Path(tempfile.mkdtemp(prefix=f"tmp-{purpose}-", dir=self.root / "tmp"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def _remove_stale_tmp(self) -> None:
        """Leftovers of fetches that were killed (a running fetch in another process keeps its
        staging dir only for minutes; entries older than a day are certainly abandoned)."""
        now = time.time()
        for entry in (self.root / "tmp").iterdir():
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime < 86400:
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()


def publish(staged: Path, final: Path) -> Path:
    """Move a completed entry into place atomically; if another fetch won the race, keep theirs."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staged, final)
    except OSError:
        if not final.exists():
            raise
    return final


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def short_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
