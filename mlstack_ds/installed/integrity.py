"""Are DeepSpeed's installed files still the ones pip installed? Checked against the wheel's RECORD.

Why: a version number and DeepSpeed's build record survive the loss of a compiled op
(`deepspeed/ops/adam/cpu_adam_op*.so` deleted, a Python file edited in place), so `status`,
`install` and `doctor` would call such an install healthy. pip writes `<name>-<version>.dist-info/RECORD`
with `path,sha256=<urlsafe base64, no padding>,size` for every file it installed; hashing those
files again (a few hundred ms for DeepSpeed's ~1,500 files) shows what is missing or modified.
Files listed without a hash (the RECORD itself, `.pyc` files compiled at install time) are skipped.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHOWN = 3  # paths named in a one-line summary; the JSON form has them all


@dataclass(frozen=True)
class RecordEntry:
    path: str  # relative to the directory holding the .dist-info (site-packages); may start with ../
    algorithm: str | None  # "sha256"; None when RECORD lists no hash (RECORD itself, .pyc)
    digest: str | None  # urlsafe base64 without padding, as in RECORD
    size: int | None


@dataclass(frozen=True)
class FileCheck:
    """The result of hashing an installed distribution's files against its RECORD."""

    record: str
    checked: int
    missing: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    unreadable: str | None = None  # the RECORD itself could not be read or parsed
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.unreadable is None and not self.missing and not self.modified

    def summary(self) -> str:
        """One line: what changed, with a count and the first few paths."""
        if self.unreadable is not None:
            return f"cannot check the installed files: {self.unreadable}"
        parts = []
        for label, paths in (("missing", self.missing), ("modified", self.modified)):
            if paths:
                more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
                parts.append(f"{len(paths)} {label} ({', '.join(paths[:SHOWN])}{more})")
        if not parts:
            return f"all {self.checked} installed files match {self.record}"
        return f"{' and '.join(parts)} of the {self.checked} files listed in {self.record}"

    def to_dict(self) -> dict[str, Any]:
        """Without `seconds`: the same install gives the same document (scripts and tests compare them)."""
        return {"record": self.record, "checked": self.checked, "missing": list(self.missing),
                "modified": list(self.modified), "unreadable": self.unreadable, "ok": self.ok}


def parse_record(text: str) -> list[RecordEntry]:
    """RECORD's CSV rows; `ValueError` for a row that is not `path,[algorithm=digest],[size]`."""
    entries = []
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row:
            continue
        if len(row) != 3 or not row[0]:
            raise ValueError(f"line {number} is not path,hash,size")
        path, hashed, size = row
        algorithm, digest = hashed.split("=", 1) if "=" in hashed else (None, None)
        if hashed and algorithm is None:
            raise ValueError(f"line {number}: hash {hashed!r} is not algorithm=digest")
        try:
            entries.append(RecordEntry(path, algorithm, digest, int(size) if size else None))
        except ValueError as exc:
            raise ValueError(f"line {number}: size {size!r} is not a number") from exc
    return entries


def record_digest(data: bytes, algorithm: str = "sha256") -> str:
    """A file's hash as RECORD writes it (PEP 376/627: urlsafe base64, '=' padding removed)."""
    return base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode("ascii")


def check_files(record: str | Path) -> FileCheck:
    """Hash every file `record` lists with a hash; report the missing and the modified ones (sorted)."""
    started = time.monotonic()
    record = Path(record)
    try:
        entries = parse_record(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return FileCheck(str(record), 0, unreadable=f"{record} is missing (the install was removed or damaged)")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return FileCheck(str(record), 0, unreadable=f"{record} is unreadable ({exc})")
    root = record.parent.parent  # RECORD paths are relative to the directory holding the .dist-info
    missing, modified, checked = [], [], 0
    for entry in entries:
        if entry.algorithm is None or entry.digest is None:
            continue
        checked += 1
        try:
            data = (root / entry.path).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            missing.append(entry.path)
            continue
        except OSError:
            modified.append(entry.path)  # present but unreadable: not what was installed
            continue
        try:
            same = (entry.size in (None, len(data))
                    and record_digest(data, entry.algorithm) == entry.digest)
        except ValueError:  # an algorithm hashlib does not know: cannot vouch for the file
            same = False
        if not same:
            modified.append(entry.path)
    return FileCheck(str(record), checked, tuple(sorted(missing)), tuple(sorted(modified)),
                     seconds=time.monotonic() - started)
