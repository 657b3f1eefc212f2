"""Patch 0025: with 0019's parallel build, an op that compiles a source another running op compiles with the
same flags waits for it, so that a compiler cache gives it that object (fused_adam and cpu_adam share
cpu_adam_impl.cpp; issue 43). The probe builds small C extensions with the tree's own build_ext class, three
at once; two of them share `shared.c`, which takes a moment to compile. Both series carry it, on their 0019,
so each pin's patched tree is tested (a pristine tree has no parallel build to order); without the patch
(the series up to 0024) the two spans overlapped (checked by hand when it was written).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ds_patch import probe_result
from support.target_env import DS_NEXT_VERSION, DS_VERSION

PROBE = Path(__file__).parent / "probes" / "parallel_build_probe.py"


@pytest.fixture(scope="module", params=[DS_VERSION, DS_NEXT_VERSION])
def patched_pin_tree(request: pytest.FixtureRequest) -> Path:
    """Each pin's tree with its whole series applied (tests/patches/conftest.py's session trees)."""
    return request.getfixturevalue("patched_tree" if request.param == DS_VERSION else "next_patched_tree")


def build(tree: Path, project: Path, *extensions: str) -> dict:
    return probe_result(tree, PROBE, tree / "setup.py", project, "3", *extensions,
                        env={"DS_ENABLE_NINJA": "1", "MAX_JOBS": "1"}, timeout=300)


def test_ops_sharing_a_source_build_one_after_the_other(patched_pin_tree: Path, tmp_path: Path) -> None:
    result = build(patched_pin_tree, tmp_path / "project", "op_a:shared", "op_b", "op_c:shared")
    assert result["status"] == 0 and result["built"] == ["op_a", "op_b", "op_c"], result
    (_, first_done), (second, _) = sorted(result["spans"][op] for op in ("op_a", "op_c"))
    assert second >= first_done, result  # the later one made its first object after the other's library


def test_ops_sharing_nothing_still_build_at_once(patched_pin_tree: Path, tmp_path: Path) -> None:
    result = build(patched_pin_tree, tmp_path / "project", "op_a:shared", "op_b:shared", "op_c")
    spans = result["spans"]
    assert result["status"] == 0, result
    # op_c shares no source: it is built while one of the others is still compiling shared.c
    assert any(spans["op_c"][1] < spans[op][1] for op in ("op_a", "op_b")), result
