"""Fetching from git (a local mirror), the package index (through pip), and local paths; the cache;
destinations and caches that cannot be used."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from support.cli import run_cli
from support.e2e import still_there_after

from mlstack_ds.errors import ExitCode, FetchError, UsageError
from mlstack_ds.patience import Patience
from mlstack_ds.recipe import find_recipe
from mlstack_ds.source import fetch_source, parse_source_spec
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.fetch import source_pin
from mlstack_ds.source.git import clone_pinned_tag
from mlstack_ds.source.gitrepo import PRISTINE_REF, WORK_BRANCH

PINNED_UPSTREAM_COMMIT = "cf44300453eb0af79ed84ed8f1cb49d57478bd76"


def git_out(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True, text=True).stdout.strip()


def assert_clean_pinned_tree(tree: Path, commit: str) -> None:
    assert git_out(tree, "rev-parse", "HEAD") == commit
    assert git_out(tree, "rev-parse", PRISTINE_REF) == commit
    assert git_out(tree, "symbolic-ref", "--short", "HEAD") == WORK_BRANCH
    assert git_out(tree, "status", "--porcelain", "--ignored") == ""
    assert (tree / "version.txt").read_text().strip() == "0.19.5"


def nothing_left(cache: Path, dest: Path) -> None:
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.partial-")]
    assert list((cache / "tmp").iterdir()) == []


# --- git -------------------------------------------------------------------------------------------

def test_git_mirror_gives_a_shallow_clone_of_the_tag(git_source_repo, tmp_path: Path,
                                                     pristine_tree_template: Path) -> None:
    spec = parse_source_spec("git", git_url=git_source_repo.url, git_commit=git_source_repo.commit)
    tree = fetch_source(find_recipe(), spec, tmp_path / "cache", tmp_path / "ds")
    assert tree.kind == "git" and tree.sha256 is None
    assert tree.commit == git_source_repo.commit
    assert_clean_pinned_tree(tree.path, git_source_repo.commit)
    assert git_out(tree.path, "rev-parse", "--is-shallow-repository") == "true"
    assert not (tree.path / "AFTER_THE_TAG.txt").exists()  # the tag, not the branch tip
    # Same files as the sdist import: the tree object is identical.
    assert git_out(tree.path, "rev-parse", "HEAD^{tree}") == git_out(pristine_tree_template, "rev-parse",
                                                                      "HEAD^{tree}")
    assert git_out(tree.path, "remote") == ""  # not tied to the cache


def test_git_plain_path_mirror_works_and_second_fetch_uses_the_cache(git_source_repo, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    spec = parse_source_spec("git", git_url=str(git_source_repo.path), git_commit=git_source_repo.commit)
    first = fetch_source(find_recipe(), spec, cache, tmp_path / "a")
    # Make the mirror unusable: a second fetch must not need it.
    moved = git_source_repo.path.with_name("DeepSpeed-moved")
    git_source_repo.path.rename(moved)
    try:
        with pytest.raises(FetchError, match="does not exist"):  # the mirror really is gone...
            fetch_source(find_recipe(), spec, tmp_path / "other-cache", tmp_path / "x")
        spec_by_uri = parse_source_spec("git", git_url=git_source_repo.url, git_commit=git_source_repo.commit)
        second = fetch_source(find_recipe(), spec_by_uri, cache, tmp_path / "b")  # ...yet the cache serves
    finally:
        moved.rename(git_source_repo.path)
    assert second.commit == first.commit
    assert second.from_cache and not first.from_cache
    assert first.store == second.store and first.store is not None and first.store.parent == cache / "repos"
    assert_clean_pinned_tree(second.path, first.commit)


def test_tag_on_another_commit_is_refused_as_tag_moved(git_source_repo, tmp_path: Path) -> None:
    # No --git-commit: the recipe's pin (upstream cf44300...) is enforced, and the mirror's tag differs.
    cache, dest = tmp_path / "cache", tmp_path / "ds"
    spec = parse_source_spec("git", git_url=git_source_repo.url)
    with pytest.raises(FetchError, match="tag moved") as info:
        fetch_source(find_recipe(), spec, cache, dest)
    assert PINNED_UPSTREAM_COMMIT in info.value.message
    assert git_source_repo.commit in info.value.message
    assert info.value.exit_code == ExitCode.FETCH
    nothing_left(cache, dest)
    assert list((cache / "repos").iterdir()) == []


def test_unreachable_git_url_fails_cleanly(tmp_path: Path) -> None:
    cache, dest = tmp_path / "cache", tmp_path / "ds"
    spec = parse_source_spec("git", git_url="file:///nonexistent/DeepSpeed.git")
    with pytest.raises(FetchError, match=r"git clone of v0\.19\.5 from file:///nonexistent") as info:
        fetch_source(find_recipe(), spec, cache, dest)
    assert "fatal:" in info.value.message and "stderr:" not in info.value.message  # git's own words
    nothing_left(cache, dest)


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_git_server_that_never_answers_is_stopped_and_killed(tmp_path: Path) -> None:
    """The clone runs under the runner: a time-out, then git's whole process group is killed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # accepts connections (the kernel does) and never says a word
    url = f"http://127.0.0.1:{server.getsockname()[1]}/DeepSpeed.git"
    cache = tmp_path / "cache"
    started = time.monotonic()
    try:
        with pytest.raises(FetchError, match=r"did not finish within 3 s"):
            clone_pinned_tag(Cache.open(cache), url, "v0.19.5", PINNED_UPSTREAM_COMMIT, patience=Patience(ceiling_s=3))
    finally:
        server.close()
    assert time.monotonic() - started < 120  # the time-out and the kill, not a hang
    leftover = still_there_after(lambda: [p for p in Path("/proc").iterdir()
                                          if p.name.isdigit() and url.encode() in _cmdline(p)])
    assert leftover == [], "a git process was left running"
    assert list((cache / "tmp").iterdir()) == []


# --- pypi ------------------------------------------------------------------------------------------

@pytest.fixture
def local_index(pip_mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip configured the way an air-gapped site configures it: no index, a local find-links mirror.

    This runs the real `pip download`; only pip's own configuration (PIP_* variables) points it at
    the mirror, which is exactly how `--source pypi` is meant to reach a site's mirror.
    """
    mirror = tmp_path / "mirror"
    shutil.copytree(pip_mirror, mirror)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(mirror))
    return mirror


def test_pypi_source_through_pip_configuration(local_index: Path, tmp_path: Path,
                                               pristine_tree_template: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    tree = fetch_source(find_recipe(), parse_source_spec("pypi"), cache, tmp_path / "a")
    assert tree.kind == "pypi"
    assert tree.sha256 == find_recipe().sdist.sha256
    assert tree.commit == git_out(pristine_tree_template, "rev-parse", "HEAD")
    assert_clean_pinned_tree(tree.path, tree.commit)

    # Second fetch: pip now has nowhere to download from, so success proves the cache served it.
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    second = fetch_source(find_recipe(), parse_source_spec("pypi"), cache, tmp_path / "b")
    assert second.commit == tree.commit and second.from_cache
    assert tree.store == second.store and tree.store is not None and tree.store.parent == cache / "repos"
    with pytest.raises(FetchError, match=r"pip download deepspeed==0\.19\.5 failed"):
        fetch_source(find_recipe(), parse_source_spec("pypi"), tmp_path / "cold-cache", tmp_path / "c")
    nothing_left(tmp_path / "cold-cache", tmp_path / "c")


def test_pypi_sdist_with_wrong_hash_is_refused(local_index: Path, tmp_path: Path) -> None:
    # A mirror serving a different file under the same name: a re-packed (still valid) sdist.
    sdist = local_index / "deepspeed-0.19.5.tar.gz"
    repacked = tmp_path / "repacked.tar.gz"
    with tarfile.open(sdist) as src, tarfile.open(repacked, "w:gz") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        extra = tarfile.TarInfo("deepspeed-0.19.5/EXTRA.txt")
        dst.addfile(extra, io.BytesIO(b""))
    shutil.move(repacked, sdist)
    cache, dest = tmp_path / "cache", tmp_path / "ds"
    with pytest.raises(FetchError, match="sha256 mismatch"):
        fetch_source(find_recipe(), parse_source_spec("pypi"), cache, dest)
    nothing_left(cache, dest)
    assert list((cache / "downloads").iterdir()) == []


# --- local paths -----------------------------------------------------------------------------------

def test_extracted_sdist_directory_gives_the_same_commit(pristine_tree_template: Path, tmp_path: Path
                                                         ) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(pristine_tree_template, plain, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    tree = fetch_source(find_recipe(), parse_source_spec(str(plain)), tmp_path / "cache", tmp_path / "ds")
    assert tree.commit == git_out(pristine_tree_template, "rev-parse", "HEAD")
    assert_clean_pinned_tree(tree.path, tree.commit)
    assert not (plain / ".git").exists()  # the user's directory is not touched
    assert tree.store is None


def test_directory_of_another_version_is_refused(pristine_tree_template: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(pristine_tree_template, plain, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    (plain / "version.txt").write_text("0.18.0\n")
    with pytest.raises(FetchError, match=r"is deepspeed 0\.18\.0, but the pin is 0\.19\.5"):
        fetch_source(find_recipe(), parse_source_spec(str(plain)), tmp_path / "cache", tmp_path / "ds")
    with pytest.raises(FetchError, match="is not a deepspeed source tree"):
        fetch_source(find_recipe(), parse_source_spec(str(tmp_path / "cache")), tmp_path / "cache",
                     tmp_path / "ds")
    with pytest.raises(FetchError, match="does not exist"):
        fetch_source(find_recipe(), parse_source_spec(str(tmp_path / "nope")), tmp_path / "cache",
                     tmp_path / "ds")
    nothing_left(tmp_path / "cache", tmp_path / "ds")


def test_git_checkout_without_the_pinned_commit_is_imported_like_a_plain_directory(git_source_repo,
                                                                                   tmp_path: Path) -> None:
    spec = parse_source_spec(str(git_source_repo.path))
    tree = fetch_source(find_recipe(), spec, tmp_path / "cache", tmp_path / "ds")
    assert tree.commit != git_source_repo.commit  # its files, imported: not its history
    assert (tree.path / "version.txt").read_text().strip() == "0.19.5"
    assert source_pin(find_recipe(), spec).startswith("tree:")


def test_git_checkout_with_the_pinned_commit_is_cloned_at_that_commit(git_source_repo, tmp_path: Path) -> None:
    # A site recipe pinning the mirror's commit (recipes may be given by path: --recipe FILE).
    shipped = find_recipe().path.read_text()
    custom = tmp_path / "recipes" / "site.toml"
    custom.parent.mkdir()
    custom.write_text(shipped.replace(PINNED_UPSTREAM_COMMIT, git_source_repo.commit))
    recipe = find_recipe(custom)
    # A clean checkout: the pinned commit is taken from it (a dirty one gives its working tree on top of the
    # pinned commit instead: tests/integration/test_dirty_checkout.py).
    tree = fetch_source(recipe, parse_source_spec(str(git_source_repo.path)), tmp_path / "c", tmp_path / "ds")
    assert tree.kind == "path" and tree.commit == git_source_repo.commit and tree.pin is None
    assert tree.store is None  # a user's checkout: the build remembers no patched tree in it
    assert_clean_pinned_tree(tree.path, git_source_repo.commit)
    assert not (tree.path / "AFTER_THE_TAG.txt").exists()  # the pinned commit, not the checkout's tip


def test_sdist_file_with_wrong_hash_is_refused(deepspeed_sdist: Path, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="sha256 mismatch"):
        fetch_source(find_recipe(), parse_source_spec(str(deepspeed_sdist), sha256="1" * 64), tmp_path / "c",
                     tmp_path / "ds")
    nothing_left(tmp_path / "c", tmp_path / "ds")


# --- destination and cache -------------------------------------------------------------------------

def test_non_empty_destination_is_a_usage_error(deepspeed_sdist: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    dest.mkdir()
    (dest / "precious.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists and is not empty"):
        fetch_source(find_recipe(), parse_source_spec(str(deepspeed_sdist)), tmp_path / "c", dest)
    assert (dest / "precious.txt").read_text() == "mine"


def _unwritable_cache(tmp_path: Path, how: str) -> Path:
    if how == "under-a-file":
        # A cache path below a regular file cannot be created by anyone, root included (ENOTDIR);
        # this is the honest stand-in for a read-only location when the tests run as root.
        blocker = tmp_path / "blocker"
        blocker.write_text("a file, not a directory")
        return blocker / "cache"
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    cache.chmod(0o500)
    return cache


@pytest.mark.parametrize(
    "how",
    [
        "under-a-file",
        pytest.param("chmod-0500", marks=pytest.mark.skipif(
            os.geteuid() == 0, reason="root ignores directory permissions (DAC override); "
                                      "the under-a-file case covers root")),
    ],
)
def test_unwritable_cache_is_a_clear_error(deepspeed_sdist: Path, tmp_path: Path, how: str) -> None:
    cache = _unwritable_cache(tmp_path, how)
    dest = tmp_path / "ds"
    with pytest.raises(FetchError, match="is not writable") as info:
        fetch_source(find_recipe(), parse_source_spec(str(deepspeed_sdist)), cache, dest)
    assert "--cache-dir" in info.value.hint
    assert not dest.exists()


# --- the CLI end to end ----------------------------------------------------------------------------

def flat(text: str) -> str:
    """Output with line wrapping undone (rich wraps long messages at the terminal width)."""
    return " ".join(text.split())


def test_cli_fetch_json_and_exit_codes(deepspeed_sdist: Path, tmp_path: Path) -> None:
    import json

    done = run_cli("fetch", "--source", str(deepspeed_sdist), "--dest", str(tmp_path / "ds"),
                   "--cache-dir", str(tmp_path / "cache"), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["kind"] == "path" and document["path"] == str(tmp_path / "ds")
    assert_clean_pinned_tree(tmp_path / "ds", document["commit"])

    again = run_cli("fetch", "--source", str(deepspeed_sdist), "--dest", str(tmp_path / "ds"),
                    "--cache-dir", str(tmp_path / "cache"))
    assert again.returncode == ExitCode.USAGE
    assert "already exists" in flat(again.stderr) and "Traceback" not in flat(again.stderr)

    bad = run_cli("fetch", "--source", str(deepspeed_sdist), "--sha256", "2" * 64, "--dest",
                  str(tmp_path / "ds2"), "--cache-dir", str(tmp_path / "cache"))
    assert bad.returncode == ExitCode.FETCH
    assert "sha256 mismatch" in flat(bad.stderr) and "hint:" in flat(bad.stderr) and "Traceback" not in flat(bad.stderr)
