"""A synthetic install the size of DeepSpeed with its op libraries, for the integrity check's test and its
benchmark (scripts/bench_integrity.py): one maker, so both measure the same thing."""

from __future__ import annotations

import os
from pathlib import Path

from mlstack_ds.installed.integrity import record_digest


def synthetic_install(site: Path, files: int = 1500) -> Path:
    """`files` modules under `site/big` (every 100th a 2 MiB binary-like one: 30 MB for 1,500), listed with
    their sha256 in `site/big-1.0.dist-info/RECORD`, which is returned."""
    rows = []
    for index in range(files):
        data = (b"x = %d\n" % index) * 200 if index % 100 else os.urandom(2 * 2**20)
        path = site / "big" / f"m{index}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        rows.append(f"big/m{index}.py,sha256={record_digest(data)},{len(data)}")
    record = site / "big-1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("\n".join(rows) + "\n")
    return record
