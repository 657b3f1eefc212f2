"""`mlstack-ds publish`: wheels of the wheel cache (named by path or by cache key) into a team's index.

Why the cache: it holds each wheel with the plan it was built from (build.json), and checks the wheel
against the sha256 recorded at build time before it goes anywhere (`build/wheel.checked_entry`). A wheel
copied out by `build --wheel-dir` is found in the cache by its sha256.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlstack_ds.build.wheel import checked_entry
from mlstack_ds.errors import UsageError
from mlstack_ds.index.publish import Published, publish_wheel
from mlstack_ds.source.cache import Cache, sha256_of


def cache_entry(cache: Cache, item: str) -> tuple[Path, dict[str, Any]]:
    """The cached wheel and its build record for `item`: a cache key, a wheel in the cache, or a copy of
    one (`build --wheel-dir`), found by its sha256."""
    path = Path(item)
    wheels = cache.root / "wheels"
    if path.suffix != ".whl":
        entry = sorted((wheels / item).glob("deepspeed-*.whl")) if item and "/" not in item else []
        if not entry:
            raise UsageError(f"{item}: neither a wheel file nor a cache key of {wheels}",
                             hint="name a wheel (mlstack-ds build --wheel-dir DIR) or the cache key "
                             "`install --dry-run` prints")
        path = entry[0]
    if not path.is_file():
        raise UsageError(f"{item}: no such wheel", hint="name a wheel mlstack-ds built")
    if (path.parent / "build.json").is_file():
        meta, _ = checked_entry(path)
        return path, meta
    digest = sha256_of(path)
    for record in sorted(wheels.glob("*/build.json")):
        try:
            meta = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("wheel_sha256") == digest:
            cached = sorted(record.parent.glob("deepspeed-*.whl"))
            if cached:
                return cached[0], checked_entry(cached[0])[0]
    raise UsageError(f"{path}: not a wheel of the cache {cache.root} (no build record has its sha256)",
                     hint="publish needs the plan the wheel was built from: publish from the cache that built it "
                     "(--cache-dir), or by its cache key")


def publish(items: Sequence[str], to: Path, cache_dir: Path | None,
            status: Callable[[str], None] = lambda _msg: None) -> list[Published]:
    """Each item's wheel (with its plan) into the index in `to`; all are found and checked before the first
    is written."""
    cache = Cache.open(cache_dir)
    entries = [cache_entry(cache, item) for item in items]
    done = []
    for wheel, record in entries:
        status(f"publishing {wheel.name}")
        done.append(publish_wheel(wheel, record, to))
    return done
