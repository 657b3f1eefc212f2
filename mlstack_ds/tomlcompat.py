"""TOML reading on every supported Python: stdlib `tomllib` (3.11+), its backport `tomli` on 3.10."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

TOMLDecodeError = tomllib.TOMLDecodeError
loads = tomllib.loads
load = tomllib.load
