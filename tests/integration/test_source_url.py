"""The URL source against a real HTTP server on loopback: good, wrong-hash, cut-off and missing downloads."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mlstack_ds.errors import ExitCode, FetchError
from mlstack_ds.recipe import find_recipe
from mlstack_ds.source import fetch_source, parse_source_spec
from mlstack_ds.source.gitrepo import PRISTINE_REF

SDIST = "deepspeed-0.19.5.tar.gz"


@dataclass
class Server:
    base: str
    hits: Counter[str] = field(default_factory=Counter)


def _handler(good: bytes, server_state: Server) -> type[http.server.BaseHTTPRequestHandler]:
    altered = bytearray(good)
    altered[len(altered) // 2] ^= 0xFF

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:
            server_state.hits[self.path] += 1
            if self.path == f"/good/{SDIST}":
                self._send(bytes(good))
            elif self.path == f"/wrong-hash/{SDIST}":
                self._send(bytes(altered))
            elif self.path == f"/cut-off/{SDIST}":
                # The connection dies mid-transfer: promise the whole file, send a third, hang up.
                self.send_response(200)
                self.send_header("Content-Length", str(len(good)))
                self.end_headers()
                self.wfile.write(good[: len(good) // 3])
                self.wfile.flush()
                self.close_connection = True
            else:
                self.send_error(404)

        def _send(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture
def server(deepspeed_sdist: Path) -> Iterator[Server]:
    state = Server(base="")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(deepspeed_sdist.read_bytes(), state))
    state.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_url_download_is_checked_cached_and_imported(server: Server, tmp_path: Path,
                                                     pristine_tree_template: Path) -> None:
    cache = tmp_path / "cache"
    url = f"{server.base}/good/{SDIST}"
    seen: list[tuple[int, int | None]] = []
    tree = fetch_source(find_recipe(), parse_source_spec(url), cache, tmp_path / "a",
                        progress=lambda got, total: seen.append((got, total)))
    assert tree.kind == "url" and not tree.from_cache
    assert tree.sha256 == find_recipe().sdist.sha256
    # Same content as the sdist imported any other way => the same commit id.
    assert tree.commit == _head(pristine_tree_template)
    assert seen and seen[-1][0] == seen[-1][1]  # the progress callback saw the whole file
    assert (cache / "downloads" / tree.sha256 / SDIST).is_file()

    again = fetch_source(find_recipe(), parse_source_spec(url), cache, tmp_path / "b")
    assert again.commit == tree.commit and again.from_cache
    assert server.hits[f"/good/{SDIST}"] == 1  # the second fetch came from the cache
    assert _run_git(again.path, "rev-parse", PRISTINE_REF) == tree.commit


def test_wrong_hash_is_refused_and_nothing_is_kept(server: Server, tmp_path: Path) -> None:
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    with pytest.raises(FetchError, match=r"sha256 mismatch for deepspeed-0\.19\.5\.tar\.gz") as info:
        fetch_source(find_recipe(), parse_source_spec(f"{server.base}/wrong-hash/{SDIST}"), cache, dest)
    assert info.value.exit_code == ExitCode.FETCH
    _assert_nothing_left(cache, dest)


def test_explicit_sha256_overrides_the_pin_and_is_enforced(server: Server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    spec = parse_source_spec(f"{server.base}/good/{SDIST}", sha256="0" * 64)
    with pytest.raises(FetchError, match="expected 0000"):
        fetch_source(find_recipe(), spec, cache, tmp_path / "dest")
    _assert_nothing_left(cache, tmp_path / "dest")


def test_connection_dropped_mid_download_is_retried_then_fails_cleanly(server: Server, tmp_path: Path
                                                                       ) -> None:
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    with pytest.raises(FetchError, match="failed after 3 attempts") as info:
        fetch_source(find_recipe(), parse_source_spec(f"{server.base}/cut-off/{SDIST}"), cache, dest)
    assert "network" in info.value.hint
    assert server.hits[f"/cut-off/{SDIST}"] == 3
    _assert_nothing_left(cache, dest)


def test_missing_file_is_not_retried(server: Server, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch_source(find_recipe(), parse_source_spec(f"{server.base}/nope/{SDIST}"), tmp_path / "c",
                     tmp_path / "dest")
    assert server.hits[f"/nope/{SDIST}"] == 1


def test_unreachable_host_fails_cleanly(tmp_path: Path) -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    with pytest.raises(FetchError, match="failed after 3 attempts"):
        fetch_source(find_recipe(), parse_source_spec(f"http://127.0.0.1:9/{SDIST}"), tmp_path / "c",
                     tmp_path / "dest")
    _assert_nothing_left(tmp_path / "c", tmp_path / "dest")


def _assert_nothing_left(cache: Path, dest: Path) -> None:
    assert not dest.exists()
    for sub in ("downloads", "repos", "tmp"):
        assert list((cache / sub).iterdir()) == [], sub


def _run_git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True, text=True).stdout.strip()


def _head(tree: Path) -> str:
    return _run_git(tree, "rev-parse", "HEAD")
