"""`mlstack-ds patches refresh` on real trees: the shipped 0.19.5 series replayed on the 0.19.8 sdist.

The trees come from the cached sdists (tests/support/target_env.py) through the tool's own PATH source; one
refresh run is shared by the verdict tests (module scope), so the whole module takes seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.cli import run_cli as support_run_cli

from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.patches.refresh import check_out_dir
from mlstack_ds.resources import data_dir

OLD = data_dir("patches") / "deepspeed-0.19.5"


# The CLI as these tests run it: from this checkout also in another working directory.
run_cli = partial(support_run_cli, env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])}, timeout=300)


@pytest.fixture(scope="module")
def refreshed(next_pristine_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("refresh") / "draft"
    result = run_cli("patches", "refresh", "--from", "deepspeed-0.19.5", "--to", "deepspeed-0.19.8",
                     "--tree", str(next_pristine_tree), "--out", str(out), "--json")
    document = json.loads(result.stdout)
    return {"result": result, "doc": document, "out": out,
            "by_name": {p["name"][:4]: p for p in document["patches"]}}


def test_exit_5_while_a_conflict_is_left_for_a_human(refreshed):
    assert refreshed["result"].returncode == ExitCode.PATCH
    assert refreshed["doc"]["draft_applies"] is False
    assert "0014-runtime-amd_specific-config-section.patch" in refreshed["doc"]["error"]["message"]
    # progress went to stderr, one line per patch
    assert "0010-op_builder-ROCm-targets-and-wavefront-size-from-build-target.patch: offset" in \
        refreshed["result"].stderr


def test_already_upstream_backports_are_dropped_and_listed(refreshed):
    by_name = refreshed["by_name"]
    assert {n for n, p in by_name.items() if p["verdict"] == "upstream"} == {"0001", "0002", "0003", "0004",
                                                                              "0005", "0006"}
    assert by_name["0001"]["how"] == "reverse-applies"
    assert by_name["0005"]["how"].startswith("by content")  # upstream reworked the lines around it
    out = refreshed["out"]
    assert by_name["0006"]["how"] == "reverse-applies"  # 0.19.8's cpu_lion.h is the patched one
    assert not list(out.glob("000[1-6]-*"))
    series = (out / "series").read_text()
    assert "# 0001-zero3-wait-for-every-async-all-gather.patch: dropped, already upstream" in series


def test_clean_and_offset_patches_are_regenerated_without_offset(refreshed, next_pristine_tree, tmp_path):
    by_name = refreshed["by_name"]
    assert by_name["0011"]["verdict"] == "clean" and by_name["0011"]["hunks"] == []
    offset = by_name["0010"]
    assert offset["verdict"] == "offset"
    assert {"file": "op_builder/builder.py", "hunk": 1, "detail": "at line 23, offset -4 lines"} in offset["hunks"]
    draft = refreshed["out"] / "0010-op_builder-ROCm-targets-and-wavefront-size-from-build-target.patch"
    old = OLD / draft.name
    # the header (description, Origin, ...) is kept; the diffstat is gone, the diff is fresh
    assert draft.read_text().split("\n---\n")[0] == old.read_text().split("\n---\n")[0]
    # only the top-level paths, as upstream names them: the sdist's copies are the engine's business
    assert "deepspeed/ops/op_builder" not in draft.read_text()
    tree = tmp_path / "tree"
    shutil.copytree(next_pristine_tree, tree, symlinks=True)
    applied = subprocess.run(["git", "apply", "--verbose", str(draft)], cwd=tree, capture_output=True, text=True,
                             check=False)
    assert applied.returncode == 0 and "offset" not in applied.stderr, applied.stderr


def test_fuzz_is_reported_with_its_hunk(refreshed):
    fuzz = refreshed["by_name"]["0013"]
    assert fuzz["verdict"] == "fuzz"
    assert {"file": "deepspeed/runtime/zero/config.py", "hunk": 1, "detail": "fuzz 2 (@@ -6,9 +6,11 @@)"} \
        in fuzz["hunks"]


def test_conflicts_name_file_and_hunk_and_are_copied_with_a_note(refreshed):
    conflict = refreshed["by_name"]["0014"]
    assert conflict["verdict"] == "conflicts"
    where = {(c["file"], c["hunk"]) for c in conflict["conflicts"]}
    assert ("deepspeed/runtime/config.py", 2) in where
    name = "0014-runtime-amd_specific-config-section.patch"
    out = refreshed["out"]
    assert (out / name).read_bytes() == (OLD / name).read_bytes()
    note = (out / f"{name}.rej").read_text()
    assert "deepspeed/runtime/config.py hunk 2" in note and "+        self.amd_config = get_amd_config" in note
    assert f"{name}  # CONFLICTS" in (out / "series").read_text()
    final = {p["name"][:4]: p["state"] for p in refreshed["doc"]["draft_check"]}
    assert final["0014"] == "conflicts" and final["0010"] == final["0013"] == "applies"


def test_a_series_that_is_current_refreshes_to_itself_and_exits_0(next_pristine_tree, tmp_path):
    """The shipped 0.19.8 series on its own tree: all clean, the draft applies (exit 0), and the
    regenerated patches are byte for byte the shipped ones (refresh is idempotent)."""
    out = tmp_path / "again"
    result = run_cli("patches", "refresh", "--from", "0.19.8", "--to", "0.19.8", "--tree", str(next_pristine_tree),
                     "--out", str(out))
    assert result.returncode == 0, result.stderr
    shipped = data_dir("patches") / "deepspeed-0.19.8"
    for patch in shipped.glob("*.patch"):
        assert (out / patch.name).read_text() == patch.read_text(), patch.name
    assert "draft series:" in result.stdout and "(applies)" in result.stdout


def test_bad_inputs_exit_2_and_write_nothing(next_pristine_tree, tmp_path):
    out = tmp_path / "draft"
    missing = run_cli("patches", "refresh", "--to", "deepspeed-9.9.9", "--tree", str(next_pristine_tree),
                      "--out", str(out))
    assert missing.returncode == ExitCode.USAGE
    assert "no recipe named 'deepspeed-9.9.9'" in missing.stderr
    assert "deepspeed-0.19.5" in missing.stderr and "deepspeed-0.19.8" in missing.stderr  # the hint lists them

    not_ds = tmp_path / "not-deepspeed"
    not_ds.mkdir()
    (not_ds / "README").write_text("hello\n")
    wrong_tree = run_cli("patches", "refresh", "--to", "0.19.8", "--tree", str(not_ds), "--out", str(out))
    assert wrong_tree.returncode == ExitCode.USAGE
    assert "is not a deepspeed source tree" in " ".join(wrong_tree.stderr.split())
    assert "Traceback" not in wrong_tree.stderr

    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine\n")
    not_empty = run_cli("patches", "refresh", "--to", "0.19.8", "--tree", str(next_pristine_tree), "--out", str(full))
    assert not_empty.returncode == ExitCode.USAGE and "not an empty directory" in not_empty.stderr
    assert [p.name for p in full.iterdir()] == ["keep.txt"]

    shipped = data_dir("patches") / "deepspeed-0.19.8"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in shipped.iterdir())
    into_shipped = run_cli("patches", "refresh", "--to", "0.19.8", "--tree", str(next_pristine_tree),
                           "--out", str(shipped))
    assert into_shipped.returncode == ExitCode.USAGE and "shipped series directory" in into_shipped.stderr
    assert sorted((p.name, p.stat().st_mtime_ns) for p in shipped.iterdir()) == before
    assert not out.exists()
    assert not list(tmp_path.glob(".refresh-*"))


def test_out_inside_a_shipped_series_directory_is_refused_too(tmp_path):
    shipped = data_dir("patches") / "deepspeed-0.19.5"
    with pytest.raises(UsageError, match="shipped series directory"):
        check_out_dir(shipped / "draft", (shipped,))
    assert not (shipped / "draft").exists()
    assert check_out_dir(tmp_path / "new", (shipped,)) == tmp_path / "new"
