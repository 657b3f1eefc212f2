"""Fallback GPU sources and ROCm version sources, against real captures."""

from __future__ import annotations

import pytest
from support.fakemachine import REAL

from mlstack_ds.detect import smi, versions


def test_amd_smi_list_2x_mi210() -> None:
    devices = smi.parse_amd_smi_list((REAL / "amd-smi_list_2xMI210_rocm-6.3.3_rocm-issue-5480.txt").read_text())
    assert [(d.index, d.node, d.bdf) for d in devices] == [(0, 2, "0000:03:00.0"), (1, 3, "0000:83:00.0")]
    assert devices[0].uuid == "67ff740f-0000-1000-80c6-3ac3c3c637f9"


def test_rocm_smi_productname_gives_arch_and_name() -> None:
    text = (REAL / "rocm-smi_showproductname_2xMI210-gfx90a_rocm-6.3.3_rocm-issue-5480.txt").read_text()
    devices = smi.parse_rocm_smi_productname(text)
    assert [(d.index, d.arch, d.name, d.node) for d in devices] == [
        (0, "gfx90a", "Instinct MI210", 2), (1, "gfx90a", "Instinct MI210", 3)]


@pytest.mark.parametrize(
    ("capture", "archs"),
    [
        ("rocm_agent_enumerator_gfx1010-rx5700_rocm-4.2_fedora-blog.txt", ["gfx1010"]),
        ("rocm_agent_enumerator_MI300X-gfx941-with-gfx000_rocminfo-docs-c6f7a17.txt", ["gfx941"]),
    ],
)
def test_enumerator_drops_cpu_gfx000(capture: str, archs: list[str]) -> None:
    assert smi.parse_rocm_agent_enumerator((REAL / capture).read_text()) == archs


def test_merge_uses_catalog_for_wavefront() -> None:
    listed = smi.parse_amd_smi_list((REAL / "amd-smi_list_2xMI210_rocm-6.3.3_rocm-issue-5480.txt").read_text())
    gpus = smi.merge(listed, [], ["gfx90a", "gfx90a"], source="amd-smi+rocm_agent_enumerator")
    assert [(g.arch, g.wavefront_size, g.family, g.node) for g in gpus] == [
        ("gfx90a", 64, "CDNA2", 2), ("gfx90a", 64, "CDNA2", 3)]


def test_info_version_file() -> None:
    assert versions.parse_info_version("6.2.0-66\n") == "6.2.0"
    assert versions.parse_info_version("7.2.0-39") == "7.2.0"
    assert versions.parse_info_version("garbage") is None


def test_rocm_version_header() -> None:
    header = "#define ROCM_VERSION_MAJOR 6\n#define ROCM_VERSION_MINOR 3\n#define ROCM_VERSION_PATCH 3\n"
    assert versions.parse_rocm_version_header(header) == "6.3.3"
    assert versions.parse_rocm_version_header("#define ROCM_VERSION_MAJOR 6\n") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ((REAL / "torch_version_hip_MI210-gfx90a_rocm-6.0_deepspeed-pr-5249.txt").read_text(), "6.0"),
        ((REAL / "hipconfig_rocm-6.1.1_gfx1103-apu_rocm-issue-3207.txt").read_text(), "6.1"),
        # torch.version.hip strings seen in the wild (shared/fixtures/real/SOURCES.md)
        ("5.1.20531-cacfa990", "5.1"),
        ("6.4.43482-0f2d60242", "6.4"),
        ("6.2.41134-65d174c3e", "6.2"),
    ],
)
def test_hip_version_gives_rocm_major_minor(text: str, expected: str) -> None:
    parsed = versions.parse_hip_version(text)
    assert parsed is not None and parsed[0] == expected


def test_amd_smi_version() -> None:
    text = (REAL / "amd-smi_version_MI350-ci_rocm-6.4.1_pytorch-pr-192824.txt").read_text()
    assert versions.parse_amd_smi_version(text) == "6.4.1"


def test_a_hip_version_names_the_rocm_release_only_up_to_7_2() -> None:
    """ROCm 6.x and 7.0-7.2 number HIP alike; TheRock's 7.14 and ROCm 10.1 (HIP 7.16) do not."""
    from mlstack_ds.detect.versions import hip_names_rocm

    assert [hip_names_rocm(v) for v in ("5.2", "6.4", "7.2", "7.14", "7.16", "10.1")] == [
        True, True, True, False, False, False]


def test_the_newest_core_directory_is_the_system_rocm_without_rocm_path(tmp_path) -> None:
    """2026's system packages (amdrocm-*) install under /opt/rocm/core-X.Y, with nothing in /opt/rocm itself."""
    from mlstack_ds.detect.probes import find_rocm_root

    for name in ("core-7.14", "core-10.0", "core-9.1", "core-notes"):
        (tmp_path / name).mkdir()
    assert find_rocm_root({}, default=tmp_path) == tmp_path / "core-10.0"
    assert find_rocm_root({"ROCM_PATH": str(tmp_path / "core-7.14")}, default=tmp_path) == tmp_path / "core-7.14"
    (tmp_path / "bin").mkdir()  # a classic /opt/rocm stays itself
    assert find_rocm_root({}, default=tmp_path) == tmp_path
    assert find_rocm_root({}, default=tmp_path / "missing") is None
