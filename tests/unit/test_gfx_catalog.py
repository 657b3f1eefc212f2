"""The GPU target catalog is data; these tests keep it consistent and check the derived answers."""

from __future__ import annotations

import pytest
from packaging.version import Version

from mlstack_ds import gfx


def test_catalog_entries_are_valid() -> None:
    families = {"GCN5", "CDNA1", "CDNA2", "CDNA3", "CDNA4", "RDNA1", "RDNA2", "RDNA3", "RDNA3.5", "RDNA4"}
    for arch, target in gfx.catalog().items():
        assert gfx.is_valid_arch(arch), arch
        assert target.family in families, arch
        # wave64 exactly for GCN/CDNA (gfx9), wave32 for RDNA (gfx10+): what HIP compiles for by default
        assert target.wavefront == (64 if arch.startswith("gfx9") else 32), arch
        if target.first_rocm:
            Version(target.first_rocm)


@pytest.mark.parametrize(
    ("arch", "family", "wave", "integrated"),
    [("gfx1100", "RDNA3", 32, False), ("gfx90a", "CDNA2", 64, False), ("gfx942", "CDNA3", 64, False),
     ("gfx1103", "RDNA3", 32, True), ("gfx1036", "RDNA2", 32, True), ("gfx1201", "RDNA4", 32, False)],
)
def test_known_targets(arch: str, family: str, wave: int, integrated: bool) -> None:
    target = gfx.lookup(arch)
    assert (target.family, target.wavefront, target.integrated, target.known) == (family, wave, integrated, True)


def test_unknown_target_falls_back_to_generation_rule() -> None:
    assert gfx.lookup("gfx1299").known is False
    assert gfx.wavefront_for("gfx1299") == 32
    assert gfx.wavefront_for("gfx9ff") == 64
    assert gfx.wavefront_for("not-a-gpu") is None


def test_generic_and_feature_suffixes() -> None:
    assert gfx.is_generic("gfx9-4-generic") and gfx.is_generic("gfx11-generic")
    assert not gfx.is_generic("gfx942")
    assert gfx.base_arch("amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-") == "gfx90a"


@pytest.mark.parametrize(("value", "arch"), [("10.3.0", "gfx1030"), ("11.0.2", "gfx1102"), ("9.0.10", "gfx90a"),
                                             ("9.4.2", "gfx942"), ("bogus", None), ("10.3", None)])
def test_override_to_arch(value: str, arch: str | None) -> None:
    assert gfx.arch_from_override(value) == arch


def test_rocm_support() -> None:
    assert gfx.rocm_supports("gfx1100", "5.4") is False
    assert gfx.rocm_supports("gfx1100", "6.2.2") is True
    assert gfx.rocm_supports("gfx1201", "6.3") is False
    assert gfx.rocm_supports("gfx1103", "6.2") is None  # never officially supported: unknown, not "no"
