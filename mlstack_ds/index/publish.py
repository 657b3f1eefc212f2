"""`publish`: a built wheel and the plan it was built from into a PEP 503 index in a directory.

Layout (any static web server or bucket serves it as is; pip takes `--index-url <base>/simple`):
`simple/index.html`, `simple/deepspeed/index.html`, and beside it each wheel (relabelled, see
wheelfile.py) and `<wheel>.plan.json`. Every file is written to a temporary name and renamed into place,
the pages last and regenerated from what the directory holds, under a lock (two publishers at once both
land). Publishing the same build twice changes nothing; other projects' directories are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds import __version__
from mlstack_ds.errors import EnvironmentProblem, UsageError
from mlstack_ds.index.match import PUBLISHED_SCHEMA, published_version
from mlstack_ds.index.simple import PLAN_SUFFIX, PROJECT, project_page, root_page
from mlstack_ds.index.wheelfile import (
    WheelProblem,
    check_record,
    file_sha256,
    python_tag,
    relabel,
    wheel_filename,
    wheel_metadata_version,
)

LOCK_NAME = ".mlstack-ds-publish.lock"


@dataclass(frozen=True)
class Published:
    """One wheel in the index: where, its sha256 and version, and whether this run put it there."""

    wheel: Path
    sha256: str
    version: str
    action: str  # "published" | "already published"

    def to_json(self) -> dict[str, str]:
        return {"wheel": str(self.wheel), "sha256": self.sha256, "version": self.version, "action": self.action}


def simple_dir(to: Path) -> Path:
    return to / "simple"


def published_document(record: Mapping[str, Any], filename: str, version: str, digest: str) -> dict[str, Any]:
    """The plan file beside a published wheel: the build's plan (this host's paths left out), what the
    build recorded about its host (compiler, CPU flags), and the wheel's hashes."""
    plan = {**record["plan"], "target_python": "", "path_prepend": []}
    return {"schema": PUBLISHED_SCHEMA, "project": PROJECT, "version": version, "wheel": filename,
            "wheel_sha256": digest, "built_wheel_sha256": record.get("wheel_sha256"),
            "python_tags": list(python_tag(filename)), "plan": plan,
            "source_commit": record.get("source_commit"), "tree_hash": record.get("tree_hash"),
            "host": record.get("host") or {}, "tool_version": __version__,
            "published_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


@contextlib.contextmanager
def locked_directory(to: Path, what: str = "index") -> Iterator[None]:
    """One writer at a time in `to` (made if absent): `publish` and `bundle` take the same lock, since either may
    add files to a directory the other wrote. `what` names the directory in the error."""
    try:
        to.mkdir(parents=True, exist_ok=True)
        handle = (to / LOCK_NAME).open("a")
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write the {what} in {to}: {exc.strerror or exc}",
                                 hint="choose a writable --to directory") from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@dataclass(frozen=True)
class Publishable:
    """A wheel mlstack-ds built, checked readable, with its build record and the name and version it gets in an
    index (the plan's local version label)."""

    wheel: Path
    record: Mapping[str, Any]
    version: str
    filename: str


def publishable(wheel: Path, record: Mapping[str, Any]) -> Publishable:
    """`wheel` (built by the plan in `record`, the cache's build.json) checked, before any index is touched."""
    plan = record.get("plan")
    if not isinstance(plan, Mapping) or not plan.get("cache_key"):
        raise UsageError(f"the build record of {wheel.name} has no plan", hint="publish wheels mlstack-ds built")
    try:
        version = published_version(wheel_metadata_version(wheel), plan)
        filename = wheel_filename(wheel.name, version)
    except (OSError, KeyError, WheelProblem) as exc:
        raise UsageError(f"{wheel} is not a readable wheel ({exc})", hint="rebuild it (--rebuild)") from None
    return Publishable(wheel, record, version, filename)


def publish_wheel(wheel: Path, record: Mapping[str, Any], to: Path) -> Published:
    """Put `wheel` (built by the plan in `record`, the cache's build.json) into the index in `to`."""
    item = publishable(wheel, record)
    with locked_directory(to):
        return publish_locked(item, to)


def publish_locked(item: Publishable, to: Path) -> Published:
    """`publish_wheel`'s writing, for a caller that holds `to`'s lock already (`bundle --prebuilt`: a second
    flock from the same process on the lock file would wait for itself)."""
    project = simple_dir(to) / PROJECT
    target = project / item.filename
    plan_file = project / (item.filename + PLAN_SUFFIX)
    try:
        project.mkdir(parents=True, exist_ok=True)
        existing = _already(target, plan_file, item.record)
        if existing is not None:
            regenerate(simple_dir(to))
            return Published(target, existing, item.version, "already published")
        digest = _write_wheel(item.wheel, target, item.version)
        write_text_atomically(plan_file, json.dumps(published_document(item.record, item.filename, item.version,
                                                                       digest), indent=2, sort_keys=True) + "\n")
        regenerate(simple_dir(to))
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write the index in {to}: {exc.strerror or exc}",
                                 hint="choose a writable --to directory") from exc
    return Published(target, digest, item.version, "published")


def _already(target: Path, plan_file: Path, record: Mapping[str, Any]) -> str | None:
    """The sha256 of the same build already published here (same plan, same built wheel, intact), else None.
    Another file under the same name is refused: an index never changes a published file's content."""
    if not target.exists():
        return None
    try:
        published = json.loads(plan_file.read_text(encoding="utf-8"))
        same = (published["plan"]["cache_key"] == record["plan"]["cache_key"]
                and published["built_wheel_sha256"] == record.get("wheel_sha256")
                and file_sha256(target) == published["wheel_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        same = False
    if not same:
        raise UsageError(f"{target} is already in the index with other content",
                         hint=f"published files never change; remove {target} and its {PLAN_SUFFIX} first "
                         "if it is really to be replaced")
    return str(published["wheel_sha256"])


def _write_wheel(wheel: Path, target: Path, version: str) -> str:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    os.close(fd)
    try:
        relabel(wheel, Path(tmp), version)
        check_record(Path(tmp))
        digest = file_sha256(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return digest


def write_text_atomically(path: Path, text: str) -> None:
    """`text` at `path` through a temporary name and a rename: a reader sees the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def regenerate(simple: Path) -> None:
    """DeepSpeed's page from the wheels its directory holds (with their sha256 and plan files' sha256),
    and the root page from every project directory that has a page (other projects' pages untouched)."""
    project = simple / PROJECT
    files = []
    for wheel in sorted(project.glob("*.whl")):
        plan = wheel.with_name(wheel.name + PLAN_SUFFIX)
        files.append((wheel.name, file_sha256(wheel), file_sha256(plan) if plan.is_file() else None))
    write_text_atomically(project / "index.html", project_page(PROJECT, files))
    projects = [d.name for d in simple.iterdir() if d.is_dir() and (d / "index.html").is_file()]
    write_text_atomically(simple / "index.html", root_page(projects))
