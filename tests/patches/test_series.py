"""The patch series for DeepSpeed 0.19.5 is well-formed: named files exist, headers say why, diffs parse,
and the whole series applies in order to the pristine sdist tree (through the `patched_tree` fixture)."""

from __future__ import annotations

import re

import pytest
from ds_patch_helpers import SERIES_DIR, series_patches
from unidiff import PatchSet

PATCHES = series_patches()
REQUIRED_HEADER_FIELDS = ("Subject:", "Origin:", "Forwarded:", "Last-Update:")


def test_series_names_existing_files_once():
    assert PATCHES, "series is empty"
    assert len({p.name for p in PATCHES}) == len(PATCHES)
    for patch in PATCHES:
        assert patch.is_file(), f"series names {patch.name}, which is not in {SERIES_DIR}"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_patch_header_and_diff(patch):
    text = patch.read_text()
    header = text.split("\ndiff --git ", 1)[0]
    for field in REQUIRED_HEADER_FIELDS:
        assert re.search(rf"^{field} \S", header, re.MULTILINE), f"{patch.name}: no {field} line"
    body = header.split("Subject:", 1)[1]
    assert len(body.split("Origin:", 1)[0].split()) > 40, f"{patch.name}: header must say what breaks"
    diff = PatchSet(text)
    assert len(diff) > 0
    assert all(f.added or f.removed for f in diff)


def test_series_applies_in_order(patched_tree):
    """patched_tree applies every patch (and fails the session fixture otherwise); check one result."""
    assert "def set_rocm_arch_env" in (patched_tree / "op_builder" / "builder.py").read_text()
    # the sdist's copy used by JIT loads at run time got the same hunks
    assert "def set_rocm_arch_env" in (patched_tree / "deepspeed/ops/op_builder/builder.py").read_text()
