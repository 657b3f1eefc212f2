"""Reading an index: a directory (shared file system) or an http(s) URL of a simple index, its DeepSpeed page,
the plan files beside the wheels, and a wheel downloaded with its sha256 checked while it streams.

Every failure to read is one `FetchError` (exit 4) naming the index and what is wrong with it: unreachable,
not an index, a malformed page. A missing DeepSpeed page in a reachable index only means no candidates.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests

from mlstack_ds.errors import FetchError
from mlstack_ds.index.simple import PROJECT, Link, PageError, parse_project_page
from mlstack_ds.index.wheelfile import file_sha256
from mlstack_ds.patience import WAITS

REQUEST_TIMEOUTS = (WAITS["index connect"].ceiling_s, WAITS["index read"].ceiling_s)  # requests' (connect, read)
MAX_PAGE_BYTES = 16 << 20
NO_INDEX_HINT = "check the index URL or directory (and that its server runs); without --index (and " \
    "MLSTACK_DS_INDEX unset) the wheel is built here"


@dataclass(frozen=True)
class Index:
    """Where an index is: `base` is the URL of its simple directory (`file://` for a directory), with `/`."""

    spec: str
    base: str

    @property
    def local(self) -> bool:
        return self.base.startswith("file:")


def locate(spec: str) -> Index:
    """An index from what the user gave: `http(s)://host/simple`, `file:///dir`, or a directory (the one
    `publish --to` wrote, or its `simple/`)."""
    if spec.startswith(("http://", "https://")):
        return Index(spec, spec.rstrip("/") + "/")
    path = Path(unquote(urlsplit(spec).path)) if spec.startswith("file:") else Path(spec)
    if not path.is_dir():
        raise FetchError(f"the index {spec} is not a directory", hint=NO_INDEX_HINT)
    if (path / "simple").is_dir():
        path = path / "simple"
    return Index(spec, path.resolve().as_uri() + "/")


def _local_path(url: str) -> Path:
    return Path(unquote(urlsplit(url).path))


def _get(index: Index, url: str) -> bytes | None:
    """The bytes at `url`, None when it does not exist (404, or no such file)."""
    if index.local:
        path = _local_path(url)
        if path.is_dir():
            path = path / "index.html"
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FetchError(f"cannot read the index {index.spec}: {path}: {exc.strerror or exc}",
                             hint=NO_INDEX_HINT) from exc
    try:
        with requests.get(url, timeout=REQUEST_TIMEOUTS, stream=True) as response:
            if response.status_code == 404:
                return None
            if response.status_code != 200:
                raise FetchError(f"the index {index.spec} answered {url} with HTTP {response.status_code}",
                                 hint=NO_INDEX_HINT)
            body = response.raw.read(MAX_PAGE_BYTES + 1, decode_content=True)
    except requests.RequestException as exc:
        raise FetchError(f"the index {index.spec} is unreachable: {_reason(exc)}", hint=NO_INDEX_HINT) from exc
    if len(body) > MAX_PAGE_BYTES:
        raise FetchError(f"the index {index.spec} sent more than {MAX_PAGE_BYTES >> 20} MiB for {url}",
                         hint=NO_INDEX_HINT)
    return body


def _reason(exc: BaseException) -> str:
    """What went wrong, on one line (`Connection refused`, `timed out`), not urllib3's whole chain."""
    if isinstance(exc, requests.Timeout):
        return "timed out"
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip()
    return text if len(text) < 200 else text[:197] + "..."


def list_wheels(index: Index) -> list[Link]:
    """The DeepSpeed wheels the index offers; an index without a DeepSpeed page offers none, but a URL that
    has no index at all (no root page either) is an error."""
    page_url = f"{index.base}{PROJECT}/"
    body = _get(index, page_url)
    if body is None:
        if _get(index, index.base) is None:
            raise FetchError(f"no simple index at {index.spec} (neither {page_url} nor the root page exist)",
                             hint=NO_INDEX_HINT)
        return []
    try:
        return parse_project_page(body.decode("utf-8"), page_url)
    except (UnicodeDecodeError, PageError) as exc:
        reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise FetchError(f"the index page {page_url} is malformed: {reason}",
                         hint="republish the index (mlstack-ds publish regenerates its pages), or fix its server"
                         ) from None


def read_file(index: Index, url: str, sha256: str | None, what: str) -> bytes:
    """A small file of the index (a plan file), checked against the hash its link carries."""
    body = _get(index, url)
    if body is None:
        raise FetchError(f"the index {index.spec} lists {what} but it is missing ({url})",
                         hint="republish the index (mlstack-ds publish)")
    if sha256 is not None and hashlib.sha256(body).hexdigest() != sha256:
        raise FetchError(f"{what} in the index {index.spec} does not match its sha256 on the index page; "
                         "nothing was installed", hint="republish it (mlstack-ds publish); the index may have "
                         "been tampered with")
    return body


def download(index: Index, link: Link, directory: Path) -> Path:
    """`link`'s wheel into `directory` (made atomically, kept by its sha256: a second install reads no
    network), its sha256 checked against the index page's while it streams. A mismatch is an error and
    leaves nothing behind."""
    final = directory / link.sha256 / link.filename
    if final.is_file() and file_sha256(final) == link.sha256:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{link.filename}.", suffix=".partial")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            if index.local:
                try:
                    with _local_path(link.url).open("rb") as source:
                        for block in iter(lambda: source.read(1 << 20), b""):
                            digest.update(block)
                            out.write(block)
                except OSError as exc:
                    raise FetchError(f"cannot read {link.filename} from the index {index.spec}: "
                                     f"{exc.strerror or exc}", hint=NO_INDEX_HINT) from exc
            else:
                _stream(index, link, out, digest)
        if digest.hexdigest() != link.sha256:
            raise FetchError(f"{link.filename} from the index {index.spec} does not match its sha256 "
                             f"({digest.hexdigest()} != {link.sha256} on the index page); nothing was installed",
                             hint="the wheel was changed after it was published: republish it (mlstack-ds "
                             "publish), or install without --index")
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return final


def _stream(index: Index, link: Link, out: object, digest: hashlib._Hash) -> None:
    try:
        with requests.get(link.url, timeout=REQUEST_TIMEOUTS, stream=True) as response:
            if response.status_code != 200:
                raise FetchError(f"the index {index.spec} answered {link.url} with HTTP {response.status_code}",
                                 hint=NO_INDEX_HINT)
            for block in response.iter_content(1 << 20):
                digest.update(block)
                out.write(block)  # type: ignore[attr-defined]
    except requests.RequestException as exc:
        raise FetchError(f"downloading {link.filename} from the index {index.spec} failed: {_reason(exc)}",
                         hint=NO_INDEX_HINT) from exc
