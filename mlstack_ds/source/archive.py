"""Safe extraction of source archives (sdist tarballs, GitHub tarballs or zips).

Why not a bare `extractall`: a hostile or broken archive can write outside the target (`../x`,
absolute names, links pointing out). Every member is checked first and the whole archive refused
with the offending member named; extraction goes to a staging directory the caller discards on error.
"""

from __future__ import annotations

import posixpath
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path

from mlstack_ds.errors import FetchError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")


def is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def extract_archive(archive: Path, target: Path) -> Path:
    """Extract `archive` into the empty directory `target`; return the source root inside it.

    The root is the single top-level directory when there is one (sdists have `deepspeed-X.Y.Z/`).
    """
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, target)
        else:
            _extract_tar(archive, target)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
        if isinstance(exc, FileNotFoundError) and not archive.exists():
            raise FetchError(f"{archive}: no such file", hint="check the path") from exc
        raise FetchError(
            f"{archive.name}: damaged or truncated archive ({type(exc).__name__}: {exc})",
            hint="download it again; if it came from a mirror, the mirror's copy may be broken",
        ) from exc
    entries = [p for p in target.iterdir()]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return target


def _check_member_name(archive: Path, name: str) -> str:
    normalized = posixpath.normpath(name.replace("\\", "/"))
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(archive, name, "absolute path")
    if normalized == ".." or normalized.startswith("../") or "/../" in f"/{name}/":
        raise _unsafe(archive, name, "path leaves the extraction directory")
    return normalized


def _unsafe(archive: Path, member: str, why: str) -> FetchError:
    return FetchError(f"{archive.name}: refusing unsafe archive member {member!r} ({why})",
                      hint="this is not a genuine source archive; get it from a trusted source")


def _extract_tar(archive: Path, target: Path) -> None:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()  # reads the whole archive: truncation shows up here
        for member in members:
            name = _check_member_name(archive, member.name)
            if member.isdev() or member.isfifo():
                raise _unsafe(archive, member.name, "device or fifo")
            if member.issym() or member.islnk():
                link = member.linkname
                base = posixpath.dirname(name) if member.issym() else ""
                resolved = posixpath.normpath(posixpath.join(base, link))
                if link.startswith("/") or resolved == ".." or resolved.startswith("../"):
                    raise _unsafe(archive, member.name, f"link to {link!r} outside the tree")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, members=members, filter="data")
        else:  # pragma: no cover - Python without PEP 706; members were checked above
            tar.extractall(target, members=members)


def _extract_zip(archive: Path, target: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            _check_member_name(archive, info.filename)
            if stat.S_ISLNK(info.external_attr >> 16):
                raise _unsafe(archive, info.filename, "symbolic link")
        bad = zf.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"member {bad} fails its CRC check")
        for info in infos:
            zf.extract(info, target)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o100 and not info.is_dir():
                path = target / info.filename
                path.chmod(path.stat().st_mode | 0o111)
