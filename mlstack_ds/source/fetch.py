"""`fetch`: from a source spec to a clean git tree at the pinned content, via the cache.

Why every source ends as a git repo: patching, rollback and the reproducible tree hash then work the
same way whatever the source was. A git source keeps upstream's pinned commit; any other source is
imported as one commit with a fixed identity, date and message, so identical content always gives the
identical commit id (an sdist from PyPI, the same sdist from a URL, or its extracted directory).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlstack_ds.errors import FetchError, UsageError
from mlstack_ds.recipe import Recipe
from mlstack_ds.source.archive import extract_archive, is_archive_name
from mlstack_ds.source.cache import Cache, publish, sha256_of
from mlstack_ds.source.checkout import (
    copy_files,
    dirty_pin,
    files_digest,
    short_pin,
    working_tree_files,
    working_tree_status,
)
from mlstack_ds.source.git import clone_pinned_tag, git_cache_entry, repo_head
from mlstack_ds.source.gitrepo import PRISTINE_REF, WORK_BRANCH, git, import_tree, is_git_worktree, rev_parse
from mlstack_ds.source.local import check_deepspeed_tree, copy_plain_tree, has_commit, tree_digest
from mlstack_ds.source.pypi import pip_download_sdist
from mlstack_ds.source.url import ProgressCallback, download, filename_from_url

SourceKind = Literal["git", "pypi", "url", "path"]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class SourceSpec:
    """Where to get the source. `git_url`/`git_commit` override the recipe for a mirror (git only);
    `sha256` overrides the pinned sdist hash for a different archive of the same release."""

    kind: SourceKind
    location: str | None = None
    git_url: str | None = None
    git_commit: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class SourceTree:
    """A fetched tree: a git work tree at `commit` on branch `mlstack-ds`, clean.

    `from_cache`: the pinned content was already in the cache, so `origin` was not contacted (entries
    are keyed by sha256 / commit, so the content is the same whichever URL or mirror is named).
    `pin`: set when the tree is neither a commit nor an archive of the pin, but a dirty checkout's working
    tree: `<pinned commit>+dirty.<digest>` of the files that were copied (`commit` is then the commit
    made of them, on top of the pinned one).
    `store`: the cache's repository the tree was cloned from (None for a user's checkout or directory), where
    the patch stage may remember patched trees (patches/prefix_store.py).
    """

    path: Path
    commit: str
    kind: SourceKind
    origin: str
    sha256: str | None
    from_cache: bool = False
    pin: str | None = None
    store: Path | None = None


@dataclass(frozen=True)
class SourcePin:
    """`source_pin`'s answer with what the plan should say about it (a dirty checkout, say)."""

    pin: str
    notes: tuple[str, ...] = ()


def parse_source_spec(source: str = "git", *, git_url: str | None = None, git_commit: str | None = None,
                      sha256: str | None = None) -> SourceSpec:
    """Interpret `--source` (git | pypi | http(s) URL | path) and its companion options."""
    if source in ("git", "pypi"):
        kind: SourceKind = source  # type: ignore[assignment]
        location = None
    elif source.startswith(("http://", "https://")):
        kind, location = "url", source
    elif source.startswith("file://"):
        kind, location = "path", source.removeprefix("file://")
    elif "://" in source:
        raise UsageError(f"--source {source}: unsupported URL scheme",
                         hint="use http(s)://, file:// or a path")
    else:
        kind, location = "path", source
    if kind != "git" and (git_url or git_commit):
        raise UsageError("--git-url/--git-commit only apply to --source git",
                         hint="drop them or use --source git")
    if kind in ("git", "pypi") and sha256:
        raise UsageError(f"--sha256 does not apply to --source {kind}",
                         hint="pypi is checked against the pinned sha256; git against the pinned commit")
    if sha256 is not None and not _SHA256.match(sha256.lower()):
        raise UsageError(f"--sha256 {sha256!r} is not 64 hex characters", hint="pass the full sha256 digest")
    if git_commit is not None and not _COMMIT.match(git_commit.lower()):
        raise UsageError(f"--git-commit {git_commit!r} is not a full 40-character commit id",
                         hint="pass the full commit id (git rev-parse TAG^{commit})")
    return SourceSpec(kind=kind, location=location, git_url=git_url,
                      git_commit=git_commit.lower() if git_commit else None,
                      sha256=sha256.lower() if sha256 else None)


def fetch_source(recipe: Recipe, spec: SourceSpec, cache_dir: Path | None, dest: Path,
                 progress: ProgressCallback | None = None) -> SourceTree:
    """Fetch `recipe`'s release from `spec` into `dest` (must not exist, or be empty)."""
    dest = Path(os.path.abspath(dest))
    _check_dest(dest)
    cache = Cache.open(cache_dir)
    sha256: str | None = None
    if spec.kind == "git":
        url = spec.git_url or recipe.git.url
        commit = spec.git_commit or pinned_commit(recipe)
        from_cache = repo_head(git_cache_entry(cache, url, recipe.git.tag, commit)) == commit
        repo = clone_pinned_tag(cache, url, recipe.git.tag, commit)
        origin = f"{url}@{recipe.git.tag}"
    elif spec.kind == "pypi":
        sha256 = recipe.sdist.sha256
        from_cache = repo_head(_archive_entry(cache, sha256)) is not None
        repo, commit = _repo_from_archive(cache, sha256, recipe, lambda: _cached_download(
            cache, sha256, recipe.sdist.filename,
            lambda into: pip_download_sdist(recipe.package, recipe.requirement, into)))
        origin = f"pypi:{recipe.requirement}"
    elif spec.kind == "url":
        assert spec.location is not None
        url = spec.location
        sha256 = spec.sha256 or recipe.sdist.sha256
        from_cache = repo_head(_archive_entry(cache, sha256)) is not None
        repo, commit = _repo_from_archive(cache, sha256, recipe, lambda: _cached_download(
            cache, sha256, filename_from_url(url), lambda into: download(url, into, progress)))
        origin = url
    else:
        assert spec.location is not None
        return _fetch_local(recipe, spec, cache, dest)
    _materialize(repo, commit, dest)
    return SourceTree(path=dest, commit=commit, kind=spec.kind, origin=origin, sha256=sha256,
                      from_cache=from_cache, store=repo)


def fetch_archive(recipe: Recipe, spec: SourceSpec, cache_dir: Path | None,
                  progress: ProgressCallback | None = None) -> Path:
    """The pinned source archive itself (for `bundle`, which carries it to an air-gapped machine), from the
    cache or fetched into it, checked against the pin's sha256 (`--sha256` for a URL or local archive).
    Only archives: a git clone or a plain directory is not what an offline node's `--source` can take."""
    cache = Cache.open(cache_dir)
    if spec.kind == "pypi":
        sha256 = recipe.sdist.sha256
        return _cached_download(cache, sha256, recipe.sdist.filename,
                                lambda into: pip_download_sdist(recipe.package, recipe.requirement, into))
    if spec.kind == "url":
        assert spec.location is not None
        url, sha256 = spec.location, spec.sha256 or recipe.sdist.sha256
        return _cached_download(cache, sha256, filename_from_url(url), lambda into: download(url, into, progress))
    path = check_local_source(spec)
    if path is None or not path.is_file():
        raise UsageError(f"--source {spec.kind if path is None else path}: a bundle carries the pinned source "
                         "archive, not a git clone or a directory",
                         hint="use --source pypi (default), an http(s) URL or a local .tar.gz of the release")
    sha256 = spec.sha256 or recipe.sdist.sha256
    _check_sha256(path, sha256)
    return path


def pinned_commit(recipe: Recipe) -> str:
    """The recipe's git commit; a recipe whose commit could not be verified when pinned has none, and
    then only the sdist (or a commit the user vouches for with --git-commit) can be used."""
    if recipe.git.commit is None:
        raise UsageError(f"recipe {recipe.name} pins no git commit (it could not be verified when pinned)",
                         hint="use --source pypi (the sdist is pinned by sha256), or --source git with "
                              "--git-commit COMMIT you have checked")
    return recipe.git.commit


def source_pin(recipe: Recipe, spec: SourceSpec) -> str:
    """What the build will really use, for the plan and the wheel-cache key: the commit (`git`, a clean
    git checkout; `--git-commit` when given), the sha256 of the archive (PyPI's pinned sdist, or `--sha256`
    for a URL or a local archive), `<commit>+dirty.<digest>` of a git checkout with uncommitted changes,
    or `tree:<digest>` of a plain local directory (edits change both)."""
    return pin_source(recipe, spec).pin


def pin_source(recipe: Recipe, spec: SourceSpec) -> SourcePin:
    """`source_pin`, with notes for the plan: a dirty checkout, a checkout whose HEAD is not the pin, a
    local `--git-url` repository whose uncommitted changes the clone leaves out."""
    if spec.kind == "git":
        return SourcePin(spec.git_commit or pinned_commit(recipe), _git_url_notes(recipe, spec))
    if spec.kind == "pypi":
        return SourcePin(recipe.sdist.sha256)
    if spec.kind == "url":
        return SourcePin(spec.sha256 or recipe.sdist.sha256)
    path = check_local_source(spec)
    assert path is not None
    if path.is_file():
        return SourcePin(spec.sha256 or recipe.sdist.sha256)
    if is_git_worktree(path) and _has_pinned_commit(recipe, path):
        return _checkout_pin(recipe, path)
    check_deepspeed_tree(path, recipe, str(path))
    pin = SourcePin("tree:" + tree_digest(path))
    if is_git_worktree(path):
        return SourcePin(pin.pin, (_foreign_history_note(recipe, path),))
    return pin


def _has_pinned_commit(recipe: Recipe, path: Path) -> bool:
    return recipe.git.commit is not None and has_commit(path, recipe.git.commit)


def _foreign_history_note(recipe: Recipe, path: Path) -> str:
    """A checkout whose history lacks the pinned commit: a tree `mlstack-ds fetch` made from the sdist
    (its own import commit), or a copy with another history. Its files are what the user means to build."""
    return (f"{path} is a git checkout without the pinned commit {(recipe.git.commit or 'none')[:12]} (e.g. a "
            f"tree made by `mlstack-ds fetch`): its files are built as a plain directory, pinned by their content")


def _checkout_pin(recipe: Recipe, path: Path) -> SourcePin:
    """A clean checkout gives the pinned commit (its HEAD does not matter: the build takes that commit
    from it); a dirty one gives its working tree, built on top of the pinned commit."""
    commit = pinned_commit(recipe)
    state = working_tree_status(path)
    if not state.dirty:
        if state.head == commit:
            return SourcePin(commit)
        return SourcePin(commit, (f"{path} is at {(state.head or 'no commit')[:12]}, not the pinned commit "
                                  f"{commit[:12]}: the build takes {commit[:12]} from it, without the "
                                  "checkout's own commits",))
    check_deepspeed_tree(path, recipe, str(path))
    pin = dirty_pin(commit, files_digest(path, working_tree_files(path)))
    count = len(state.changes)
    return SourcePin(pin, (f"{path} is dirty ({count} uncommitted change{'s' if count > 1 else ''}, first "
                           f"`{state.changes[0].strip()}`): the build takes its working tree as it is on disk, "
                           f"files git ignores left out, on top of the pinned commit {commit[:12]} "
                           f"(pin {short_pin(pin)})",))


def _git_url_notes(recipe: Recipe, spec: SourceSpec) -> tuple[str, ...]:
    """`--source git` clones the tag, never a working tree: say so when the repository named is a local
    checkout with uncommitted changes (they are not built, and nothing says so otherwise)."""
    url = spec.git_url or recipe.git.url
    if "://" in url and not url.startswith("file://"):
        return ()
    path = Path(url.removeprefix("file://")).expanduser()
    if not is_git_worktree(path) or not working_tree_status(path).dirty:
        return ()
    return (f"{url} has uncommitted changes, which --source git does not build: it clones the tag "
            f"{recipe.git.tag} from there (--source {path} builds a checkout's working tree)",)


def check_local_source(spec: SourceSpec) -> Path | None:
    """The cheap checks of a PATH source (no hashing, no copying), so that `install --dry-run` refuses
    what the real run would refuse; the absolute path, or None for other kinds of source."""
    if spec.kind != "path" or spec.location is None:
        return None
    path = Path(os.path.abspath(Path(spec.location).expanduser()))
    if path.is_file():
        if not is_archive_name(path.name):
            raise FetchError(f"{path} is neither a directory nor a source archive",
                             hint="pass a DeepSpeed checkout, an extracted sdist, or a .tar.gz/.zip")
    elif not path.is_dir():
        raise FetchError(f"{path} does not exist", hint="check the path given to --source")
    elif spec.sha256:
        raise UsageError("--sha256 applies to archives, not directories", hint="drop --sha256")
    return path


def _fetch_local(recipe: Recipe, spec: SourceSpec, cache: Cache, dest: Path) -> SourceTree:
    path = check_local_source(spec)
    assert path is not None
    if path.is_file():
        sha256 = spec.sha256 or recipe.sdist.sha256
        _check_sha256(path, sha256)
        repo, commit = _repo_from_archive(cache, sha256, recipe, lambda: path)
        _materialize(repo, commit, dest)
        return SourceTree(path=dest, commit=commit, kind="path", origin=str(path), sha256=sha256, store=repo)
    if is_git_worktree(path) and _has_pinned_commit(recipe, path):
        commit = pinned_commit(recipe)
        if working_tree_status(path).dirty:
            return _fetch_dirty_checkout(recipe, path, commit, dest)
        _materialize(path, commit, dest)
        return SourceTree(path=dest, commit=commit, kind="path", origin=str(path), sha256=None)
    check_deepspeed_tree(path, recipe, str(path))
    with cache.staging_dir("import") as staging:
        tree = staging / "tree"
        copy_plain_tree(path, tree)
        commit = import_tree(tree, _import_message(recipe), FetchError)
        _materialize(tree, commit, dest)
    return SourceTree(path=dest, commit=commit, kind="path", origin=str(path), sha256=None)


def _fetch_dirty_checkout(recipe: Recipe, path: Path, commit: str, dest: Path) -> SourceTree:
    """The pinned commit with one commit on top holding the checkout's working tree as copied; the tree's
    pin is the digest of the copy, so a checkout edited while it was read does not pass for the plan's."""
    check_deepspeed_tree(path, recipe, str(path))
    copied: list[str] = []

    def overlay(tree: Path) -> None:
        files = working_tree_files(path)
        for entry in tree.iterdir():
            if entry.name == ".git":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        copy_files(path, tree, files)
        copied.append(dirty_pin(commit, files_digest(tree, files)))
        git(["add", "-A", "-f", "."], cwd=tree, error=FetchError, what="git add")
        git(["commit", "-q", "--no-verify", "--allow-empty", "-m", _working_tree_message(recipe, copied[0])],
            cwd=tree, error=FetchError, what="git commit")

    head = _materialize(path, commit, dest, overlay)
    return SourceTree(path=dest, commit=head, kind="path", origin=str(path), sha256=None, pin=copied[0])


def _working_tree_message(recipe: Recipe, pin: str) -> str:
    # Equal content => equal commit id, wherever the checkout is.
    return (f"Working tree of a {recipe.package} {recipe.version} checkout\n\n"
            f"Made by mlstack-ds from a checkout with uncommitted changes (pin {pin}).\n")


def _import_message(recipe: Recipe) -> str:
    # Content-independent of where it came from: equal content => equal commit id.
    return f"Import {recipe.package} {recipe.version} source\n\nMade by mlstack-ds from a non-git source.\n"


def _check_sha256(path: Path, expected: str) -> None:
    found = sha256_of(path)
    if found != expected:
        raise FetchError(
            f"sha256 mismatch for {path.name}: expected {expected}, got {found}",
            hint="this is not the pinned release (or it was altered); "
            "use --sha256 only for an archive you trust",
        )


def _cached_download(cache: Cache, sha256: str, filename: str, fetch: Callable[[Path], Path]) -> Path:
    """The archive with `sha256`, from the cache or fetched into a staging dir, checked, then published."""
    final = cache.download_path(sha256, filename)
    if final.is_file() and sha256_of(final) == sha256:
        return final
    with cache.staging_dir("download") as staging:
        got = fetch(staging)
        _check_sha256(got, sha256)
        return publish(got, final)


def _repo_from_archive(cache: Cache, sha256: str, recipe: Recipe,
                       get_archive: Callable[[], Path]) -> tuple[Path, str]:
    """The cached one-commit repo made from the archive with `sha256` (extracted safely, version checked).

    The archive is only fetched (`get_archive`) on a cache miss: a repeated fetch needs no network.
    """
    entry = _archive_entry(cache, sha256)
    commit = repo_head(entry)
    if commit is not None:
        return entry, commit
    archive = get_archive()
    with cache.staging_dir("extract") as staging:
        root = extract_archive(archive, staging / "x")
        check_deepspeed_tree(root, recipe, archive.name)
        commit = import_tree(root, _import_message(recipe), FetchError)
        # A leftover that is not a repo (damaged by hand) goes; a valid entry is another fetch's, which won
        # the race and may be cloning from it right now: `publish` keeps it (the import is deterministic,
        # so it holds the same commit).
        if entry.exists() and repo_head(entry) is None:
            shutil.rmtree(entry)
        publish(root, entry)
    return entry, repo_head(entry) or commit


def _archive_entry(cache: Cache, sha256: str) -> Path:
    return cache.repo_path(f"archive-{sha256[:32]}")


def _check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"destination {dest} already exists and is not empty",
                         hint="remove it or choose another --dest")


def _materialize(repo: Path, commit: str, dest: Path, overlay: Callable[[Path], None] | None = None) -> str:
    """Clone `repo` at `commit` into `dest` on branch `mlstack-ds`; `dest` appears only when complete.
    `overlay` may commit more on top first; the pristine ref and the returned commit are the final HEAD."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    except OSError as exc:
        raise FetchError(f"cannot create {dest}: {exc.strerror or exc}",
                         hint="choose a writable --dest") from exc
    try:
        tree = staging / "tree"
        git(["clone", "-q", "--no-checkout", str(repo), str(tree)], cwd=staging, error=FetchError,
            what=f"cloning {repo} into the destination")
        git(["checkout", "-q", "-B", WORK_BRANCH, commit], cwd=tree, error=FetchError,
            what="checkout of the pinned commit")
        if overlay is not None:
            overlay(tree)
        head = rev_parse(tree, "HEAD", FetchError)
        steps = (
            (["update-ref", PRISTINE_REF, head], "recording the pristine commit"),
            (["remote", "remove", "origin"], "detaching from the cache"),
        )
        for args, what in steps:
            git(args, cwd=tree, error=FetchError, what=what)
        dirty = git(["status", "--porcelain", "--ignored"], cwd=tree, error=FetchError, what="git status")
        if dirty.stdout.strip():
            raise FetchError(f"fetched tree is not clean: {dirty.stdout.splitlines()[0]}",
                             hint="report this; the cache may be damaged (remove it and retry)")
        if dest.exists():
            dest.rmdir()
        os.rename(tree, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return head
