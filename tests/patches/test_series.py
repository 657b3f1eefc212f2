"""The shipped series applies in order to the pristine sdist tree, copies under deepspeed/ops/ included.

(Headers, diffs and the series listing are linted for every series by tests/unit/test_patches_lint.py.)"""

from __future__ import annotations

import shutil
import subprocess

from mlstack_ds.patches import apply_series, series_for_recipe
from mlstack_ds.recipe import find_recipe


def test_series_applies_in_order(patched_tree):
    """patched_tree applies every patch (and fails the session fixture otherwise); check one result."""
    assert "def set_rocm_arch_env" in (patched_tree / "op_builder" / "builder.py").read_text()
    # the sdist's copy used by JIT loads at run time got the same hunks
    assert "def set_rocm_arch_env" in (patched_tree / "deepspeed/ops/op_builder/builder.py").read_text()
    # 0021 is for JIT builds at run time, which import that copy
    assert "def rocm_tool_paths" in (patched_tree / "deepspeed/ops/op_builder/builder.py").read_text()


def test_next_series_applies_to_its_sdist_with_no_offset_or_fuzz(next_pristine_tree, tmp_path):
    """The shipped 0.19.8 series (refreshed from 0.19.5) applies in order to the 0.19.8 sdist, every hunk
    at its recorded line: git's strict apply reports no offset, and the engine applies it, copies too."""
    tree = tmp_path / next_pristine_tree.name
    shutil.copytree(next_pristine_tree, tree, symlinks=True)
    series = series_for_recipe(find_recipe("deepspeed-0.19.8"))
    assert [p.name[:4] for p in series.patches] == ["0010", "0011", "0012", "0013", "0014", "0015", "0016",
                                                     "0017", "0018", "0019", "0020", "0021", "0022", "0023",
                                                     "0024", "0025"]
    for patch in series.patches:
        result = subprocess.run(["git", "apply", "--verbose", str(patch.path)], cwd=tree, capture_output=True,
                                text=True, check=False)
        assert result.returncode == 0, (patch.name, result.stderr)
        assert "offset" not in result.stderr and "fuzz" not in result.stderr, (patch.name, result.stderr)
    fresh = tmp_path / "engine" / next_pristine_tree.name
    shutil.copytree(next_pristine_tree, fresh, symlinks=True)
    applied = apply_series(fresh, series)
    assert len(applied.commits) == len(series.patches)
    assert "self.amd_config = get_amd_config(param_dict)" in (fresh / "deepspeed/runtime/config.py").read_text()
    assert "def set_rocm_arch_env" in (fresh / "deepspeed/ops/op_builder/builder.py").read_text()
    assert "def rocm_tool_paths" in (fresh / "deepspeed/ops/op_builder/builder.py").read_text()
    assert "def split_compute_capability" in (fresh / "deepspeed/ops/op_builder/builder.py").read_text()
    assert "must be a non-negative integer" in (fresh / "deepspeed/runtime/lr_schedules.py").read_text()
    assert "def same_compiles(ext)" in (fresh / "setup.py").read_text()
    assert "released_own" in (fresh / "deepspeed/runtime/zero/partitioned_param_coordinator.py").read_text()
