"""rocminfo parsing against real captures, and against the ways real pastes get damaged."""

from __future__ import annotations

import pytest
from support.fakemachine import REAL

from mlstack_ds.detect.rocminfo import gpu_agents, parse_rocminfo


def gpus_of(name: str, override: str | None = None):
    return gpu_agents(parse_rocminfo((REAL / name).read_text()), override)


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        ("rocminfo_gfx1100_rocm-issue-3949.txt",
         [("gfx1100", "gfx1100", "Radeon RX 7900 XTX", 32, 96, False, 1)]),
        ("rocminfo_gfx1030_rocm-issue-2773.txt",
         [("gfx1030", "gfx1030", "AMD Radeon RX 6900 XT", 32, 80, False, 1)]),
        ("rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt",
         [("gfx1103", "gfx1103", "AMD Radeon Graphics", 32, 12, True, 1)]),
        ("rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt",
         [("gfx90a", "gfx90a:sramecc+:xnack-", "AMD Instinct MI210", 64, 104, False, node)
          for node in (1, 2, 3, 4)]),
    ],
)
def test_real_captures(capture: str, expected: list[tuple]) -> None:
    gpus = gpus_of(capture)
    got = [(g.arch, g.target_id, g.name, g.wavefront_size, g.compute_units, g.integrated, g.node) for g in gpus]
    assert got == expected
    assert [g.index for g in gpus] == list(range(len(expected)))


def test_cpu_agents_are_skipped_and_all_gpus_kept() -> None:
    agents = parse_rocminfo((REAL / "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt").read_text())
    assert [a.device_type for a in agents] == ["CPU", "GPU", "GPU", "GPU", "GPU"]


def test_vram_from_coarse_grained_pool_even_without_pool_info_header() -> None:
    # Agent 4 of this paste lost its "Pool Info:" line; its memory must still be read.
    gpus = gpus_of("rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt")
    assert {g.vram_bytes for g in gpus} == {67092480 * 1024}


def test_apu_uuid_placeholder_is_not_an_id() -> None:
    assert gpus_of("rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt")[0].uuid is None
    assert gpus_of("rocminfo_gfx1100_rocm-issue-3949.txt")[0].uuid == "GPU-dd12161dec38e7a2"


def test_spoofed_igpu_is_flagged_integrated_and_spoofed() -> None:
    (gpu,) = gpus_of("rocminfo_680M-igpu_HSA_OVERRIDE-10.3.0-reports-gfx1030_rocm-issue-5225.txt", "10.3.0")
    assert (gpu.arch, gpu.spoofed, gpu.integrated, gpu.name) == ("gfx1030", True, True, "AMD Radeon 680M")


def test_ansi_codes_crlf_and_stray_m_are_tolerated() -> None:
    text = (REAL / "rocminfo_gfx1100_rocm-issue-3949.txt").read_text()
    first, rest = text.split("\n", 1)
    coloured = f"\x1b[37m{first}\x1b[0m\n{rest}".replace("\n", "\r\n")
    assert [g.arch for g in gpu_agents(parse_rocminfo(coloured))] == ["gfx1100"]
    stray = "m" + text  # what a paste that lost the ESC of the colour code leaves behind
    assert [g.arch for g in gpu_agents(parse_rocminfo(stray))] == ["gfx1100"]


def test_truncated_paste_keeps_complete_agents() -> None:
    text = (REAL / "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt").read_text()
    cut = text[: text.index("Agent 4")] + "Agent 4\n*******\n  Name:                    gfx90a\n  Uuid: GPU"
    gpus = gpu_agents(parse_rocminfo(cut))
    assert [g.arch for g in gpus] == ["gfx90a", "gfx90a", "gfx90a"]
    assert gpus[2].wavefront_size == 64  # from the catalog: the line was cut off


def test_generic_isa_is_ignored() -> None:
    text = (REAL / "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt").read_text()
    # ROCm 6.4+ lists a generic ISA after the real one; it is not the device's target.
    text = text.replace(
        "      Name:                    amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-",
        "      Name:                    amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack-\n"
        "    ISA 2\n      Name:                    amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-",
    )
    assert {g.target_id for g in gpu_agents(parse_rocminfo(text))} == {"gfx90a:sramecc+:xnack-"}
