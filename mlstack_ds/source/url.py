"""The `URL` source: an http(s) tarball, streamed to the cache with time-outs, retries and a sha256 check.

Why stream into a temporary file in the cache and rename: a dropped connection or a wrong hash must
leave nothing that a later fetch could mistake for a good download.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util.retry import Retry

from mlstack_ds.errors import FetchError
from mlstack_ds.patience import WAITS

# (bytes so far, total bytes or None) -> None; the CLI draws a progress bar with it.
ProgressCallback = Callable[[int, int | None], None]
ATTEMPTS = 3
BACKOFF_S = 0.5
CHUNK = 1 << 16


def filename_from_url(url: str) -> str:
    name = Path(unquote(urlparse(url).path)).name
    return name or "download.tar.gz"


def download(url: str, into: Path, progress: ProgressCallback | None = None) -> Path:
    """Download `url` to a file in the directory `into`, retrying whole-transfer failures."""
    target = into / filename_from_url(url)
    last_problem = ""
    with _session() as session:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                _download_once(session, url, target, progress)
                return target
            except requests.HTTPError as exc:
                status = exc.response.status_code if exc.response is not None else "?"
                if isinstance(status, int) and status < 500:
                    raise FetchError(f"download of {url} failed: HTTP {status}",
                                     hint="check the URL") from exc
                last_problem = f"HTTP {status}"
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                    requests.exceptions.ContentDecodingError, Urllib3Error) as exc:
                last_problem = _describe(exc)
            except requests.RequestException as exc:
                raise FetchError(f"download of {url} failed: {_describe(exc)}", hint="check the URL") from exc
            target.unlink(missing_ok=True)
            if attempt < ATTEMPTS:
                time.sleep(BACKOFF_S * attempt)
    raise FetchError(
        f"download of {url} failed after {ATTEMPTS} attempts: {last_problem}",
        hint="check your network or proxy (HTTPS_PROXY), or use --source pypi / a local file",
    )


def _session() -> requests.Session:
    session = requests.Session()
    # Only 502/503/504 answers are retried here; refused connections, time-outs and cut-off bodies are
    # retried as whole transfers by `download`, so the attempts are counted in one place.
    retry = Retry(total=2, connect=0, read=0, other=0, status=2, backoff_factor=BACKOFF_S,
                  status_forcelist=(502, 503, 504), allowed_methods=("GET",), raise_on_status=False)
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _download_once(session: requests.Session, url: str, target: Path,
                   progress: ProgressCallback | None) -> None:
    timeouts = (WAITS["http connect"].ceiling_s, WAITS["http read"].ceiling_s)  # requests': (connect, read)
    with session.get(url, stream=True, timeout=timeouts) as response:
        response.raise_for_status()
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        received = 0
        with target.open("wb") as handle:
            # Raw bytes as sent (no Content-Encoding decoding): they are what the sha256 pins.
            for chunk in response.raw.stream(CHUNK, decode_content=False):
                handle.write(chunk)
                received += len(chunk)
                if progress is not None:
                    progress(received, total)
        if total is not None and received != total:
            raise requests.exceptions.ChunkedEncodingError(f"received {received} of {total} bytes")


def _describe(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {text[:200]}"
