"""A DeepSpeed wheel as a file: give it a version label, check its RECORD, read what DeepSpeed recorded in it.

Why relabel: several builds of one DeepSpeed release (wave64 for MI300X nodes, wave32 for RX 7900
workstations, another torch) must sit side by side in one index, and pip tells files apart only by name
and version. A local version label (`0.19.5+rocm6.2.wave64.gfx90a.gfx942.torch2.5.1.k89b9bbe9`) does that
and says what the build is for. Everything is read with zipfile and hashlib: nothing in a wheel is run.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import zipfile
import zlib
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from mlstack_ds.installed.build_record import RECORD_NAME, parse_git_version_info

_EXTENSION_TAG = re.compile(r"\.(cpython-\d+)[-.]")
_SIGNATURES = (".dist-info/RECORD.jws", ".dist-info/RECORD.p7s")


class WheelProblem(ValueError):
    """The wheel is not what it should be (the message says what)."""


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in blocks (the index's own, so that `doctor` reaching the index never
    reaches the fetch stage's cache)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_hash(data: bytes) -> str:
    """A RECORD hash entry: `sha256=` and the urlsafe base64 digest without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_filename(filename: str, version: str) -> str:
    """`filename` with its version replaced (the build tag and the compatibility tags kept)."""
    parts = filename[:-len(".whl")].split("-")
    return "-".join([parts[0], version, *parts[2:]]) + ".whl"


def python_tag(filename: str) -> tuple[str, ...]:
    """The interpreter tags of a wheel's name (`cp311`, or `py3` for a pure wheel)."""
    try:
        tags = parse_wheel_filename(filename)[3]
    except InvalidWheelFilename as exc:
        raise WheelProblem(f"{filename} is not a valid wheel name ({exc})") from None
    return tuple(sorted({tag.interpreter for tag in tags}))


def _dist_info(names: list[str]) -> str:
    dirs = {name.split("/", 1)[0] for name in names if name.split("/", 1)[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise WheelProblem(f"expected one .dist-info directory, found {len(dirs)}")
    return dirs.pop()


def relabel(source: Path, target: Path, version: str) -> None:
    """Write `source` to `target` as version `version`: the .dist-info renamed, METADATA's Version and the
    RECORD rewritten, every other member byte for byte with its timestamp (same input, same bytes)."""
    with zipfile.ZipFile(source) as archive:
        infos = archive.infolist()
        old = _dist_info([info.filename for info in infos])
        name = old[: -len(".dist-info")].rsplit("-", 1)[0]
        new = f"{name}-{version}.dist-info"
        members: list[tuple[zipfile.ZipInfo, bytes]] = []
        for info in infos:
            data = archive.read(info)
            filename = new + info.filename[len(old):] if info.filename.startswith(old + "/") else info.filename
            if filename == f"{new}/METADATA":
                data = _with_version(data, version)
            members.append((_renamed(info, filename), data))
    record_name = f"{new}/RECORD"
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    for info, data in members:
        if info.filename == record_name:
            continue
        if not info.filename.endswith("/"):
            writer.writerow([info.filename, record_hash(data), str(len(data))])
    writer.writerow([record_name, "", ""])
    with zipfile.ZipFile(target, "w") as out:
        for info, data in members:
            body = rows.getvalue().encode() if info.filename == record_name else data
            out.writestr(info, body, compress_type=info.compress_type)


def _renamed(info: zipfile.ZipInfo, filename: str) -> zipfile.ZipInfo:
    copy = zipfile.ZipInfo(filename, date_time=info.date_time)
    copy.compress_type, copy.external_attr, copy.create_system = (info.compress_type, info.external_attr,
                                                                 info.create_system)
    return copy


def _with_version(metadata: bytes, version: str) -> bytes:
    lines = metadata.decode("utf-8").split("\n")
    for index, line in enumerate(lines):
        if line.startswith("Version:"):
            lines[index] = f"Version: {version}"
            return "\n".join(lines).encode("utf-8")
        if not line:
            break
    raise WheelProblem("METADATA has no Version field")


def check_record(wheel: Path) -> int:
    """Every member of the wheel hashed against its RECORD, and every hashed RECORD entry present: the
    number of files checked, or `WheelProblem` naming the first that differs."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if not n.endswith("/")]
            dist_info = _dist_info(names)
            rows = list(csv.reader(io.StringIO(archive.read(f"{dist_info}/RECORD").decode("utf-8"))))
            recorded = {row[0]: row[1] for row in rows if row}
            checked = 0
            for name in names:
                if name == f"{dist_info}/RECORD" or name.endswith(_SIGNATURES):
                    continue
                if name not in recorded or not recorded[name]:
                    raise WheelProblem(f"{name} is not in the wheel's RECORD")
                if record_hash(archive.read(name)) != recorded[name]:
                    raise WheelProblem(f"{name} does not match its hash in the wheel's RECORD")
                checked += 1
            absent = sorted(n for n, h in recorded.items() if h and n not in set(names))
            if absent:
                raise WheelProblem(f"{absent[0]} is in the wheel's RECORD but not in the wheel")
    except (OSError, KeyError, EOFError, UnicodeDecodeError, csv.Error, zipfile.BadZipFile, zlib.error) as exc:
        raise WheelProblem(f"not a readable wheel ({exc})") from None
    return checked


def wheel_metadata_version(wheel: Path) -> str:
    """The Version field of the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"{_dist_info(archive.namelist())}/METADATA").decode("utf-8", "replace")
    for line in metadata.split("\n"):
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
        if not line:
            break
    raise WheelProblem("METADATA has no Version field")


def deepspeed_build_info(wheel: Path) -> dict[str, object]:
    """DeepSpeed's own record inside the wheel (installed_ops, torch_info, accelerator_name), read as literals."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            text = archive.read(f"deepspeed/{RECORD_NAME}").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise WheelProblem(f"no readable deepspeed/{RECORD_NAME} ({exc})") from None
    return parse_git_version_info(text)


def compiled_tags(wheel: Path) -> set[str]:
    """The interpreter tags of the compiled extensions (`cpython-311` of `*.cpython-311-x86_64-linux-gnu.so`)."""
    with zipfile.ZipFile(wheel) as archive:
        return {found.group(1) for name in archive.namelist() if name.endswith(".so")
                and (found := _EXTENSION_TAG.search(name.rsplit("/", 1)[-1]))}
