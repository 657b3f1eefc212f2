"""The patch engine on the real DeepSpeed 0.19.5 tree, with small series written for these tests
(made with real git from real files), including broken ones; and the shipped series."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.patchmaker import PatchMaker, copy_tree, git_out, insert_line, new_file, replace_text, write_series

from mlstack_ds.errors import ExitCode, PatchError
from mlstack_ds.patches import (
    PatchState,
    apply_series,
    check_series,
    lint_patch_dir,
    load_series,
    tree_status,
)
from mlstack_ds.patches import Series as LoadedSeries
from mlstack_ds.recipe import find_recipe
from mlstack_ds.resources import data_dir
from mlstack_ds.source.gitrepo import FIXED_IDENTITY, PRISTINE_REF


@dataclass(frozen=True)
class Series:
    good: Path       # 0001 two hunks, 0002 depends on 0001, 0003 new file
    conflicts: Path  # good, conflict in hunk 2 of one file, conflict in another file, good
    first_only: Path  # just 0001 of `good`


@pytest.fixture(scope="module")
def series(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Series:
    root = tmp_path_factory.mktemp("series")
    maker = PatchMaker(pristine_tree_template, root / "work")
    builder = "op_builder/builder.py"
    p1 = maker.diff(insert_line(builder, 10, "# mlstack-ds marker one"),
                    insert_line(builder, 300, "# mlstack-ds marker two"))
    p2 = maker.diff(replace_text(builder, "# mlstack-ds marker one", "# mlstack-ds marker one, refined"),
                    base=(insert_line(builder, 10, "# mlstack-ds marker one"),
                          insert_line(builder, 300, "# mlstack-ds marker two")))
    p3 = maker.diff(new_file("deepspeed/mlstack_marker.py", "MARKER = True\n"))
    init = "deepspeed/__init__.py"
    # Hunk 1 fits the pristine file; hunk 2's context only exists in a changed file.
    two_hunks_second_bad = maker.diff(
        insert_line(init, 3, "# mlstack-ds top marker"),
        replace_text(init, "__version__ = version  # changed", "__version__ = version  # changed twice"),
        base=(replace_text(init, "__version__ = version", "__version__ = version  # changed"),))
    version_bad = maker.diff(replace_text("version.txt", "9.9.9", "9.9.10"),
                             base=(replace_text("version.txt", "0.19.5", "9.9.9"),))
    good = write_series(root / "good", {
        "0001-builder-markers.patch": ("builder: add two markers", p1),
        "0002-builder-refine-marker.patch": ("builder: refine marker one", p2),
        "0003-add-marker-module.patch": ("add marker module", p3),
    })
    conflicts = write_series(root / "conflicts", {
        "0001-builder-markers.patch": ("builder: add two markers", p1),
        "0002-init-second-hunk-conflicts.patch": ("init: conflicting second hunk", two_hunks_second_bad),
        "0003-version-conflicts.patch": ("version: conflicting", version_bad),
        "0004-add-marker-module.patch": ("add marker module", p3),
    })
    first_only = write_series(root / "first-only",
                              {"0001-builder-markers.patch": ("builder: add two markers", p1)})
    return Series(good=good, conflicts=conflicts, first_only=first_only)


def test_test_series_are_lint_clean(series: Series) -> None:
    for series_file in (series.good, series.conflicts):
        assert [str(p) for p in lint_patch_dir(series_file.parent)] == []


def test_check_follows_the_sequence(series: Series, pristine_tree_template: Path) -> None:
    result = check_series(pristine_tree_template, load_series(series.good))
    # 0002 only applies on top of 0001: checking in sequence is what makes it "applies".
    assert [r.state for r in result.results] == [PatchState.APPLIES] * 3
    assert result.all_apply
    assert git_out(pristine_tree_template, "status", "--porcelain") == ""  # read-only


def test_check_reports_every_conflict_with_file_and_hunk(series: Series, pristine_tree_template: Path
                                                         ) -> None:
    result = check_series(pristine_tree_template, load_series(series.conflicts))
    states = {r.name: r.state for r in result.results}
    assert states == {
        "0001-builder-markers.patch": PatchState.APPLIES,
        "0002-init-second-hunk-conflicts.patch": PatchState.CONFLICTS,
        "0003-version-conflicts.patch": PatchState.CONFLICTS,
        "0004-add-marker-module.patch": PatchState.APPLIES,
    }
    (init_conflict,) = result.results[1].conflicts
    assert (init_conflict.file, init_conflict.hunk) == ("deepspeed/__init__.py", 2)
    assert init_conflict.hunk_header is not None and init_conflict.hunk_header.startswith("@@ -")
    assert init_conflict.reason == "patch does not apply"
    (version_conflict,) = result.results[2].conflicts
    assert (version_conflict.file, version_conflict.hunk) == ("version.txt", 1)


def test_apply_commits_each_patch_reproducibly(series: Series, pristine_tree_template: Path,
                                               tmp_path: Path) -> None:
    loaded = load_series(series.good)
    first = apply_series(copy_tree(pristine_tree_template, tmp_path / "a"), loaded)
    second = apply_series(copy_tree(pristine_tree_template, tmp_path / "b"), loaded)
    assert len(first.commits) == 3
    assert first.base == git_out(pristine_tree_template, "rev-parse", "HEAD")
    assert (first.commits, first.tree_hash) == (second.commits, second.tree_hash)
    assert first.tree_hash == git_out(first.tree, "rev-parse", "HEAD^{tree}")
    assert first.patches == tuple((p.name, p.sha256) for p in loaded.patches)
    log = git_out(first.tree, "log", "--format=%an <%ae> %aI|%cn %cI|%s", f"{first.base}..HEAD").splitlines()
    assert log == [
        f"mlstack-ds <mlstack-ds@invalid> 2000-01-01T00:00:00+00:00|mlstack-ds 2000-01-01T00:00:00+00:00|{s}"
        for s in ("add marker module", "builder: refine marker one", "builder: add two markers")
    ]
    assert FIXED_IDENTITY["GIT_AUTHOR_NAME"] == "mlstack-ds"
    assert "# mlstack-ds marker one, refined" in (first.tree / "op_builder/builder.py").read_text()
    assert (first.tree / "deepspeed/mlstack_marker.py").read_text() == "MARKER = True\n"
    assert git_out(first.tree, "status", "--porcelain") == ""
    # Applying again is a no-op that says so.
    again = apply_series(first.tree, loaded)
    assert again.already_applied and again.commits == () and again.head == first.head


def test_conflict_leaves_the_tree_untouched(series: Series, pristine_tree_template: Path, tmp_path: Path
                                            ) -> None:
    tree = copy_tree(pristine_tree_template, tmp_path / "t")
    pristine = git_out(tree, "rev-parse", PRISTINE_REF)
    with pytest.raises(PatchError) as info:
        apply_series(tree, load_series(series.conflicts))
    message = info.value.message
    assert "0002-init-second-hunk-conflicts.patch" in message
    assert "deepspeed/__init__.py hunk 2" in message
    assert "and 1 more conflicting patch" in message
    assert info.value.exit_code == ExitCode.PATCH
    assert git_out(tree, "rev-parse", "HEAD") == pristine
    assert git_out(tree, "status", "--porcelain", "--untracked-files=all") == ""


def test_failure_during_apply_rolls_back_to_the_start(series: Series, pristine_tree_template: Path,
                                                      tmp_path: Path) -> None:
    # A path the series creates a file *under* is a file in this tree. The check only looks at the
    # files the patches name, so it passes; git refuses at apply time, after 0001 was committed.
    tree = copy_tree(pristine_tree_template, tmp_path / "t")
    (tree / "deepspeed" / "mlstack_marker.py").mkdir()
    (tree / "deepspeed" / "mlstack_marker.py" / "keep").write_text("a directory where a file should go\n")
    git_out(tree, "add", "-A")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "blocker"],
                   cwd=tree, check=True)
    start = git_out(tree, "rev-parse", "HEAD")
    with pytest.raises(PatchError, match=r"0003-add-marker-module\.patch failed to apply"):
        apply_series(tree, load_series(series.good))
    assert git_out(tree, "rev-parse", "HEAD") == start
    assert git_out(tree, "status", "--porcelain", "--untracked-files=all") == ""
    assert "marker one" not in (tree / "op_builder/builder.py").read_text()


def test_partly_patched_and_dirty_trees_are_refused(series: Series, pristine_tree_template: Path,
                                                    tmp_path: Path) -> None:
    tree = copy_tree(pristine_tree_template, tmp_path / "t")
    apply_series(tree, load_series(series.first_only))
    head = git_out(tree, "rev-parse", "HEAD")
    with pytest.raises(PatchError, match="partly patched already") as info:
        apply_series(tree, load_series(series.good))
    assert PRISTINE_REF in info.value.hint
    assert git_out(tree, "rev-parse", "HEAD") == head

    (tree / "version.txt").write_text("local edit\n")
    with pytest.raises(PatchError, match="has uncommitted changes"):
        apply_series(tree, load_series(series.good))
    assert (tree / "version.txt").read_text() == "local edit\n"


def test_status_of_a_plain_directory_and_of_a_patched_checkout(series: Series, pristine_tree_template: Path,
                                                               tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(pristine_tree_template, plain, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    status = tree_status(plain, load_series(series.good))
    assert not status.is_git and status.head is None and status.version == "0.19.5"
    assert status.check.all_apply
    with pytest.raises(PatchError, match="not a git work tree"):
        apply_series(plain, load_series(series.good))

    checkout = copy_tree(pristine_tree_template, tmp_path / "checkout")
    apply_series(checkout, load_series(series.first_only))
    status = tree_status(checkout, load_series(series.good))
    assert [r.state for r in status.check.results] == [
        PatchState.ALREADY_APPLIED, PatchState.APPLIES, PatchState.APPLIES]
    assert status.pristine == git_out(pristine_tree_template, "rev-parse", "HEAD")
    assert status.head != status.pristine and not status.dirty


def test_mirrored_copies_are_patched_with_the_original(series: Series, pristine_tree_template: Path,
                                                       tmp_path: Path) -> None:
    mirrors = find_recipe().patch_mirrors  # op_builder -> deepspeed/ops/op_builder, csrc -> ...
    loaded = load_series(series.good, mirrors=mirrors)
    # The sdist tree holds a real copy of op_builder/ under deepspeed/ops/: both get the hunks.
    sdist_tree = copy_tree(pristine_tree_template, tmp_path / "sdist")
    applied = apply_series(sdist_tree, loaded)
    for builder in ("op_builder/builder.py", "deepspeed/ops/op_builder/builder.py"):
        assert "# mlstack-ds marker one, refined" in (sdist_tree / builder).read_text(), builder
    first = git_out(sdist_tree, "show", "--name-only", "--format=", applied.commits[0]).splitlines()
    assert sorted(first) == ["deepspeed/ops/op_builder/builder.py", "op_builder/builder.py"]
    assert [r.state for r in check_series(sdist_tree, loaded).results] == [PatchState.ALREADY_APPLIED] * 3

    # A git-tag-like tree has a symlink there instead: the patch is applied once, the link follows it.
    linked = copy_tree(pristine_tree_template, tmp_path / "linked")
    shutil.rmtree(linked / "deepspeed/ops/op_builder")
    (linked / "deepspeed/ops/op_builder").symlink_to("../../op_builder")
    git_out(linked, "add", "-A")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "symlink"],
                   cwd=linked, check=True)
    applied = apply_series(linked, loaded)
    first = git_out(linked, "show", "--name-only", "--format=", applied.commits[0]).splitlines()
    assert first == ["op_builder/builder.py"]
    assert "# mlstack-ds marker one, refined" in (linked / "deepspeed/ops/op_builder/builder.py").read_text()

    # A copy that differs from the original is a conflict, named by the copy's path.
    drifted = copy_tree(pristine_tree_template, tmp_path / "drifted")
    copy = drifted / "deepspeed/ops/op_builder/builder.py"
    lines = copy.read_text().splitlines(keepends=True)
    del lines[5:20]
    copy.write_text("".join(lines))
    git_out(drifted, "add", "-A")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "drift"],
                   cwd=drifted, check=True)
    result = check_series(drifted, loaded)
    assert result.results[0].state is PatchState.CONFLICTS
    assert [c.file for c in result.results[0].conflicts] == ["deepspeed/ops/op_builder/builder.py"]


def shipped_series() -> list[Path]:
    return sorted(data_dir("patches").glob("*/series"))


@pytest.mark.parametrize("series_file", shipped_series(), ids=lambda p: p.parent.name)
def test_shipped_series_applies_to_the_pinned_tree(series_file: Path, request: pytest.FixtureRequest,
                                                   tmp_path: Path) -> None:
    recipe = find_recipe(series_file.parent.name)
    # each series on its own release's sdist tree (tests/conftest.py makes both)
    pristine_tree_template = request.getfixturevalue(
        "pristine_tree_template" if recipe.name == find_recipe().name else "next_pristine_tree")
    assert (pristine_tree_template / "version.txt").read_text().strip() == recipe.version
    loaded = load_series(series_file, mirrors=recipe.patch_mirrors)
    check = check_series(pristine_tree_template, loaded)
    expected = [(p.name, PatchState.APPLIES) for p in loaded.patches]
    assert [(r.name, r.state) for r in check.results] == expected
    applied = apply_series(copy_tree(pristine_tree_template, tmp_path / "t"), loaded)
    assert len(applied.commits) == len(loaded.patches)


# --- patched trees remembered in the cache's source repository (patches/prefix_store.py, issue 43) ---------

def _store(template: Path, where: Path, kind: str) -> Path:
    """A repository like the cache's: an archive's one-commit repo with its files, or a depth-1 clone (git)."""
    if kind == "archive":
        return copy_tree(template, where)
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{template}", str(where)], check=True)
    return where


def _clone(store: Path, dest: Path) -> Path:
    """What fetch does for a build: a clone of the store at its HEAD, on the work branch, detached from it."""
    subprocess.run(["git", "clone", "-q", str(store), str(dest)], check=True)
    git_out(dest, "checkout", "-q", "-B", "mlstack-ds")
    git_out(dest, "update-ref", PRISTINE_REF, "HEAD")
    git_out(dest, "remote", "remove", "origin")
    return dest


def _series_refs(store: Path) -> dict[str, str]:
    listed = git_out(store, "for-each-ref", "--format=%(refname) %(objectname)", "refs/mlstack-ds/series/")
    return dict(line.split() for line in listed.splitlines())


def _variant(good: Path, where: Path, edit: Callable[[str], str], name: str = "0003-add-marker-module.patch"
             ) -> LoadedSeries:
    """`good` with one patch's text changed by `edit` (the others byte for byte the same)."""
    shutil.copytree(good.parent, where)
    patch = where / name
    patch.write_text(edit(patch.read_text()))
    return load_series(where / "series")


@pytest.mark.parametrize("kind", ["archive", "shallow"])
def test_a_rebuild_starts_from_the_remembered_patched_tree(series: Series, pristine_tree_template: Path,
                                                            tmp_path: Path, kind: str) -> None:
    store = _store(pristine_tree_template, tmp_path / "store", kind)
    loaded = load_series(series.good)
    first = apply_series(_clone(store, tmp_path / "a"), loaded, store=store)
    assert first.restored == 0 and sorted(_series_refs(store).values()) == sorted(first.commits)
    second = apply_series(_clone(store, tmp_path / "b"), loaded, store=store)
    assert second.restored == 3
    assert (second.base, second.head, second.commits, second.tree_hash, second.patches) == \
        (first.base, first.head, first.commits, first.tree_hash, first.patches)
    assert git_out(second.tree, "rev-parse", "HEAD", PRISTINE_REF).split() == [first.head, first.base]
    assert git_out(second.tree, "status", "--porcelain", "--untracked-files=all") == ""
    assert (second.tree / "deepspeed/mlstack_marker.py").read_text() == "MARKER = True\n"


def test_a_changed_last_patch_reuses_the_ones_before_it(series: Series, pristine_tree_template: Path,
                                                        tmp_path: Path) -> None:
    store = _store(pristine_tree_template, tmp_path / "store", "archive")
    apply_series(_clone(store, tmp_path / "a"), load_series(series.good), store=store)
    changed = _variant(series.good, tmp_path / "changed", lambda text: text.replace("MARKER = True", "MARKER = 2"))
    applied = apply_series(_clone(store, tmp_path / "b"), changed, store=store)
    plain = apply_series(copy_tree(pristine_tree_template, tmp_path / "c"), changed)  # no store at all
    assert applied.restored == 2 and (applied.commits, applied.tree_hash) == (plain.commits, plain.tree_hash)
    assert (applied.tree / "deepspeed/mlstack_marker.py").read_text() == "MARKER = 2\n"
    assert len(_series_refs(store)) == 4  # the new third prefix beside the old one


def test_a_conflict_after_the_remembered_prefix_leaves_the_tree_at_its_start(
        series: Series, pristine_tree_template: Path, tmp_path: Path) -> None:
    store = _store(pristine_tree_template, tmp_path / "store", "archive")
    good = apply_series(_clone(store, tmp_path / "a"), load_series(series.good), store=store)
    conflicting = _variant(series.good, tmp_path / "bad",
                           lambda text: text.replace("MARKER = True", "MARKER = 2").replace("--- /dev/null",
                                                                                           "--- a/version.txt"))
    tree = _clone(store, tmp_path / "b")
    start = git_out(tree, "rev-parse", "HEAD")
    with pytest.raises(PatchError, match=r"^patch 0003-add-marker-module\.patch"):
        apply_series(tree, conflicting, store=store)
    moves = git_out(tree, "reflog", "--format=%gs").splitlines()
    assert moves[:2] == [f"reset: moving to {start}", f"reset: moving to {good.commits[1]}"]  # newest first
    assert git_out(tree, "rev-parse", "HEAD") == start
    assert git_out(tree, "status", "--porcelain", "--untracked-files=all") == ""


def test_a_remembered_commit_that_is_not_the_prefix_is_not_used(series: Series, pristine_tree_template: Path,
                                                                tmp_path: Path) -> None:
    store = _store(pristine_tree_template, tmp_path / "store", "archive")
    loaded = load_series(series.good)
    first = apply_series(_clone(store, tmp_path / "a"), loaded, store=store)
    refs = {commit: ref for ref, commit in _series_refs(store).items()}
    git_out(store, "update-ref", refs[first.commits[2]], first.commits[0])  # the 3-patch name on 1 patch
    again = apply_series(_clone(store, tmp_path / "b"), loaded, store=store)
    assert again.restored == 0 and (again.commits, again.tree_hash) == (first.commits, first.tree_hash)


def test_remembering_starts_no_gc_in_the_store(series: Series, pristine_tree_template: Path, tmp_path: Path
                                               ) -> None:
    """A store whose every push would end in a repack (gc.auto=1, in the foreground so that this test can
    see it): the push that remembers the series starts none, so no detached gc is left behind."""
    store = _store(pristine_tree_template, tmp_path / "store", "archive")
    git_out(store, "config", "gc.auto", "1")
    git_out(store, "config", "gc.autoDetach", "false")
    loose_before = int(git_out(store, "count-objects", "-v").split("\n")[0].split()[1])
    apply_series(_clone(store, tmp_path / "a"), load_series(series.good), store=store)
    assert len(_series_refs(store)) == 3
    assert int(git_out(store, "count-objects", "-v").split("\n")[0].split()[1]) > loose_before
