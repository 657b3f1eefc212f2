"""Keep a DeepSpeed that mlstack-ds did not install: pack its installed files back into a wheel.

Why repack instead of `pip wheel deepspeed==X` or recording "pip install deepspeed==X": DeepSpeed is
an sdist on PyPI, so either would *rebuild* it, with whatever ops, flags and compilers the rebuild
happens to get, and needs the package index. The installed files are the exact distribution the user
had (their own prebuilt ops included); pip's RECORD lists every one of them, so they can be zipped
into a wheel that `pip install --no-deps --force-reinstall` puts back byte for byte, offline.

Layout of the wheel: files under site-packages at its root, files pip placed elsewhere below the
prefix in `<name>-<version>.data/` (`bin/` -> `scripts/`, anything else -> `data/`). Left out: what pip
writes itself at install time (`INSTALLER`, `REQUESTED`, `direct_url.json`, `RECORD`, `.pyc` files,
console-script launchers generated from `entry_points.txt`). The RECORD inside is written afresh.
"""

from __future__ import annotations

import configparser
import contextlib
import csv
import io
import os
import tempfile
import zipfile
from pathlib import Path

from mlstack_ds.installed.integrity import parse_record, record_digest

INSTALLER_FILES = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"})


class RepackError(Exception):
    """The installed distribution cannot be packed (no RECORD, a listed file is gone, no WHEEL)."""


def repack_installed(record: str | Path, prefix: str | Path, dest_dir: Path) -> Path:
    """Pack the distribution whose RECORD is `record` (installed below `prefix`) into a wheel in
    `dest_dir`; returns its path. Written under a temporary name and renamed: never half a wheel."""
    record = Path(record)
    dist_info = record.parent
    site = dist_info.parent
    prefix = Path(os.path.realpath(prefix))
    try:
        entries = parse_record(record.read_text(encoding="utf-8"))
        wheel_meta = (dist_info / "WHEEL").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RepackError(f"{dist_info}: {exc}") from exc
    tag = next((line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:")),
               "py3-none-any")
    stem = dist_info.name.removesuffix(".dist-info")  # "deepspeed-0.19.5"
    launchers = _generated_launchers(dist_info)
    written_by_pip = {f"{dist_info.name}/{name}" for name in INSTALLER_FILES}
    members: list[tuple[str, Path]] = []
    for entry in entries:
        source = Path(os.path.normpath(site / entry.path))
        name = Path(entry.path).name
        if source.suffix == ".pyc" or entry.path in written_by_pip:
            continue
        if not entry.path.startswith(".."):
            members.append((Path(os.path.relpath(source, site)).as_posix(), source))
            continue
        outside = Path(os.path.relpath(os.path.realpath(source), prefix))
        if outside.parts[:1] == ("..",):
            raise RepackError(f"{entry.path} is outside the environment {prefix}")
        if outside.parts[:1] == ("bin",) and len(outside.parts) == 2:
            if name in launchers:
                continue
            members.append((f"{stem}.data/scripts/{name}", source))
        else:
            members.append((f"{stem}.data/data/{outside.as_posix()}", source))
    dest_dir.mkdir(parents=True, exist_ok=True)
    wheel = dest_dir / f"{stem}-{tag}.whl"
    fd, partial = tempfile.mkstemp(dir=dest_dir, prefix=".repack-", suffix=".whl")
    os.close(fd)
    try:
        _write_wheel(Path(partial), members, f"{dist_info.name}/RECORD")
        os.replace(partial, wheel)
    except OSError as exc:
        raise RepackError(f"cannot write {wheel}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return wheel


def _write_wheel(path: Path, members: list[tuple[str, Path]], record_name: str) -> None:
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for arcname, source in sorted(members):
            try:
                data = source.read_bytes()
                mode = source.stat().st_mode
            except OSError as exc:
                raise RepackError(f"{source} is listed in RECORD but cannot be read: {exc.strerror or exc}") from exc
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (mode & 0o777 | 0o100000) << 16  # keeps scripts executable
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
            writer.writerow([arcname, f"sha256={record_digest(data)}", len(data)])
        writer.writerow([record_name, "", ""])
        archive.writestr(zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0)), rows.getvalue())


def _generated_launchers(dist_info: Path) -> set[str]:
    """Console/GUI script names from entry_points.txt: pip regenerates those launchers itself."""
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string((dist_info / "entry_points.txt").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, configparser.Error):
        return set()
    return {name for section in ("console_scripts", "gui_scripts") if parser.has_section(section)
            for name in parser.options(section)}
