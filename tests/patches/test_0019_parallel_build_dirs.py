"""Patch 0019: setup.py's build_ext can build the ops in parallel, each op in its own build directory.

setuptools builds extensions on threads when its `parallel` option is set, but 0.19.5's build_ext (torch's
BuildExtension) compiles every op into one build_temp, where torch's ninja path writes one build.ninja per
op in turn. The probe builds small C extensions with each tree's own build_ext class, through ninja, with
setuptools' parallel option, and reports where the ninja files went and what was built.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ds_patch import probe_result

PROBE = Path(__file__).parent / "probes" / "parallel_build_probe.py"


def build(tree: Path, project: Path, parallel: int, *extensions: str) -> dict:
    return probe_result(tree, PROBE, tree / "setup.py", project, str(parallel), *extensions,
                        env={"DS_ENABLE_NINJA": "1", "MAX_JOBS": "1"}, timeout=300)


def test_ops_built_at_once_each_get_their_own_build_directory(ds_tree: tuple[str, Path], tmp_path: Path) -> None:
    kind, tree = ds_tree
    result = build(tree, tmp_path / "project", 3, "op_a", "op_b", "op_c")
    if kind == "pristine":
        # One build.ninja, rewritten by each op while the others may be running it: 6 builds in 7 failed
        # here (`ld: cannot find .../op_a.o`), so only the shared file is asserted.
        assert len(result["ninja_files"]) == 1, result
    else:
        assert result["status"] == 0 and result["built"] == ["op_a", "op_b", "op_c"], result
        assert {Path(p).parent.name for p in result["ninja_files"]} == {"op_a", "op_b", "op_c"}, result


@pytest.mark.parametrize("parallel", [1])
def test_after_a_failed_op_the_ops_not_started_are_not_built(ds_tree: tuple[str, Path], tmp_path: Path,
                                                           parallel: int) -> None:
    """One worker, the broken op first: what setuptools does after it is deterministic."""
    kind, tree = ds_tree
    result = build(tree, tmp_path / "project", parallel, "broken:bad", "op_b", "op_c")
    assert result["status"] != 0, result
    if kind == "pristine":  # setuptools starts every op and reports the failure at the end
        assert result["built"] == ["op_b", "op_c"] and result["failed_lines"] == [], result
    else:
        assert result["built"] == [], result
        assert result["failed_lines"][0].startswith("error: building 'broken' extension failed"), result
