"""The shipped series applies in order to the pristine sdist tree, copies under deepspeed/ops/ included.

(Headers, diffs and the series listing are linted for every series by tests/unit/test_patches_lint.py.)"""

from __future__ import annotations


def test_series_applies_in_order(patched_tree):
    """patched_tree applies every patch (and fails the session fixture otherwise); check one result."""
    assert "def set_rocm_arch_env" in (patched_tree / "op_builder" / "builder.py").read_text()
    # the sdist's copy used by JIT loads at run time got the same hunks
    assert "def set_rocm_arch_env" in (patched_tree / "deepspeed/ops/op_builder/builder.py").read_text()
