"""Archive extraction refuses hostile or broken archives, names the member, and leaves nothing behind."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from mlstack_ds.errors import ExitCode, FetchError
from mlstack_ds.recipe import find_recipe
from mlstack_ds.source import fetch_source, parse_source_spec
from mlstack_ds.source.archive import extract_archive

GOOD_FILES = {
    "deepspeed-0.19.5/version.txt": b"0.19.5\n",
    "deepspeed-0.19.5/deepspeed/__init__.py": b"x = 1\n",
}


def _tar(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_good_tarball_extracts_to_its_top_directory(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "ok.tar.gz", GOOD_FILES, links={"deepspeed-0.19.5/link": "version.txt"})
    root = extract_archive(archive, tmp_path / "out")
    assert root == tmp_path / "out" / "deepspeed-0.19.5"
    assert (root / "version.txt").read_text() == "0.19.5\n"
    assert (root / "link").is_symlink()


def test_good_zip_extracts(tmp_path: Path) -> None:
    archive = tmp_path / "ok.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in GOOD_FILES.items():
            zf.writestr(name, data)
    root = extract_archive(archive, tmp_path / "out")
    assert (root / "deepspeed" / "__init__.py").read_bytes() == b"x = 1\n"


@pytest.mark.parametrize(
    ("files", "links", "why"),
    [
        ({**GOOD_FILES, "deepspeed-0.19.5/../../evil.py": b"boom"}, None, "leaves the extraction directory"),
        ({**GOOD_FILES, "/etc/evil.conf": b"boom"}, None, "absolute path"),
        (GOOD_FILES, {"deepspeed-0.19.5/escape": "../../../etc/passwd"}, "outside the tree"),
        (GOOD_FILES, {"deepspeed-0.19.5/abs": "/etc/passwd"}, "outside the tree"),
    ],
)
def test_unsafe_members_are_refused_by_fetch(tmp_path: Path, files: dict[str, bytes],
                                             links: dict[str, str] | None, why: str) -> None:
    archive = _tar(tmp_path / "evil.tar.gz", files, links)
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    spec = parse_source_spec(str(archive), sha256=_sha(archive))
    with pytest.raises(FetchError, match="refusing unsafe archive member") as info:
        fetch_source(find_recipe(), spec, cache, dest)
    assert why in info.value.message
    assert info.value.exit_code == ExitCode.FETCH
    _assert_nothing_left(cache, dest)
    assert not (tmp_path / "evil.py").exists()


def test_truncated_archive_is_a_clear_error(tmp_path: Path, deepspeed_sdist: Path) -> None:
    truncated = tmp_path / "deepspeed-0.19.5.tar.gz"
    truncated.write_bytes(deepspeed_sdist.read_bytes()[: deepspeed_sdist.stat().st_size // 2])
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    # The hash of the truncated bytes is given on purpose: the extraction itself must notice.
    spec = parse_source_spec(str(truncated), sha256=_sha(truncated))
    with pytest.raises(FetchError, match="damaged or truncated archive"):
        fetch_source(find_recipe(), spec, cache, dest)
    _assert_nothing_left(cache, dest)


def test_archive_of_another_version_is_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "old.tar.gz", {"deepspeed-0.19.4/version.txt": b"0.19.4\n",
                                              "deepspeed-0.19.4/deepspeed/__init__.py": b""})
    cache, dest = tmp_path / "cache", tmp_path / "dest"
    with pytest.raises(FetchError, match=r"is deepspeed 0\.19\.4, but the pin is 0\.19\.5"):
        fetch_source(find_recipe(), parse_source_spec(str(archive), sha256=_sha(archive)), cache, dest)
    _assert_nothing_left(cache, dest)


def _assert_nothing_left(cache: Path, dest: Path) -> None:
    assert not dest.exists()
    assert list((cache / "repos").iterdir()) == []
    assert list((cache / "tmp").iterdir()) == []
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.partial-")]


def test_a_fetch_that_lost_the_race_keeps_the_winners_repo(tmp_path: Path) -> None:
    """Two fetches of one archive at once (the rehearsal matrix runs two builds at once on a cold cache):
    the one that finishes second used to delete the first one's published repo, while the first was
    cloning from it (`fatal: failed to copy file to .../objects/17/...: No such file or directory`).
    Here the second fetch runs to the end inside the first one's archive download, as it did then."""
    from mlstack_ds.source.cache import Cache
    from mlstack_ds.source.fetch import _repo_from_archive

    archive = _tar(tmp_path / "deepspeed-0.19.5.tar.gz", GOOD_FILES)
    sha = _sha(archive)
    cache = Cache.open(tmp_path / "cache")
    won: dict[str, object] = {}

    def download_while_another_fetch_finishes() -> Path:
        won["entry"], won["commit"] = _repo_from_archive(cache, sha, find_recipe(), lambda: archive)
        won["inode"] = (Path(str(won["entry"])) / ".git").stat().st_ino
        return archive

    entry, commit = _repo_from_archive(cache, sha, find_recipe(), download_while_another_fetch_finishes)
    assert (entry, commit) == (won["entry"], won["commit"])
    assert (entry / ".git").stat().st_ino == won["inode"]  # the winner's repo, never deleted and replaced
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
