"""Patch 0010: ROCm target archs and wavefront size come from the build targets, not the first rocminfo line.

Each scenario is a fake machine (real rocminfo captures on PATH, a user's environment) run through
DeepSpeed's real `FusedLambBuilder().builder()`: the patched tree must pick the right
`-DROCM_WAVEFRONT_SIZE` and keep the user's `PYTORCH_ROCM_ARCH`; the pristine tree shows the bug.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ds_patch import FIXTURES, fake_tool, run_python_in_tree

PROBE = Path(__file__).resolve().parent / "probes" / "rocm_build_target_probe.py"
MI210_HOST = "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt"
RX7900_HOST = "rocminfo_gfx1100_rocm-issue-3949.txt"
APU_HOST = "rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt"
NO_GPU_HOST = "rocminfo_no-gpu-visible_debian-rocminfo-5.2.3.txt"


def igpu_listed_first() -> str:
    """A dGPU + iGPU host where HSA lists the iGPU first: the 780M's agent block spliced in front of the
    MI210 host's GPU agents (both blocks verbatim from real captures, renumbering left as is)."""
    mi210 = (FIXTURES / MI210_HOST).read_text()
    apu = (FIXTURES / APU_HOST).read_text()
    igpu_agent = apu[apu.index("Agent 2"):apu.index("*** Done ***") if "*** Done ***" in apu else len(apu)]
    first_gpu = mi210.index("Agent 2")
    return mi210[:first_gpu] + igpu_agent + mi210[first_gpu:]


# name -> (rocminfo output, rocminfo exit status, user environment)
SCENARIOS: dict[str, tuple[str, int, dict[str, str]]] = {
    "build-host-without-gpu-user-arch": ((FIXTURES / NO_GPU_HOST).read_text(), 1,
                                         {"PYTORCH_ROCM_ARCH": "gfx90a"}),
    "multi-arch-wheel-on-rdna-host": ((FIXTURES / RX7900_HOST).read_text(), 0,
                                      {"PYTORCH_ROCM_ARCH": "gfx90a;gfx942"}),
    "comma-separated-user-arch": ((FIXTURES / RX7900_HOST).read_text(), 0,
                                  {"PYTORCH_ROCM_ARCH": "gfx90a,gfx942"}),
    "mixed-wave-user-arch": ((FIXTURES / MI210_HOST).read_text(), 0,
                             {"PYTORCH_ROCM_ARCH": "gfx90a gfx1100"}),
    "igpu-listed-first": (igpu_listed_first(), 0, {}),
    "no-gpu-no-arch": ((FIXTURES / NO_GPU_HOST).read_text(), 1, {}),
    "no-gpu-explicit-wavefront": ((FIXTURES / NO_GPU_HOST).read_text(), 1, {"DS_ROCM_WAVEFRONT_SIZE": "64"}),
    "four-mi210": ((FIXTURES / MI210_HOST).read_text(), 0, {}),
}


@pytest.fixture(scope="module")
def outcomes(ds_tree: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """Every scenario's outcome on one tree, from one subprocess (importing torch costs seconds)."""
    kind, tree = ds_tree
    scenarios = []
    for name, (output, returncode, env) in SCENARIOS.items():
        tool_dir = tmp_path_factory.mktemp(f"fake-{name}")
        fake_tool(tool_dir, "rocminfo", output, returncode)
        scenarios.append({"name": name, "env": env, "path": str(tool_dir)})
    result = run_python_in_tree(tree, PROBE, json.dumps(scenarios))
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    return kind, json.loads(line.removeprefix("RESULTS "))


def test_build_host_without_gpu_keeps_user_arch_and_builds_wave64(outcomes):
    kind, results = outcomes
    outcome = results["build-host-without-gpu-user-arch"]
    if kind == "pristine":  # the bug: no GPU visible -> wave32 kernels for the user's wave64 target
        assert outcome == {"wavefront_flags": ["-DROCM_WAVEFRONT_SIZE=32"], "PYTORCH_ROCM_ARCH": "gfx90a"}
    else:
        assert outcome == {"wavefront_flags": ["-DROCM_WAVEFRONT_SIZE=64"], "PYTORCH_ROCM_ARCH": "gfx90a"}


@pytest.mark.parametrize("scenario", ["multi-arch-wheel-on-rdna-host", "comma-separated-user-arch"])
def test_user_arch_list_is_never_overwritten(outcomes, scenario):
    kind, results = outcomes
    user_value = SCENARIOS[scenario][2]["PYTORCH_ROCM_ARCH"]
    outcome = results[scenario]
    if kind == "pristine":  # the bug: the 7900 XTX on the build host replaces the user's CDNA targets
        assert outcome == {"wavefront_flags": ["-DROCM_WAVEFRONT_SIZE=32"], "PYTORCH_ROCM_ARCH": "gfx1100"}
    else:
        assert outcome == {"wavefront_flags": ["-DROCM_WAVEFRONT_SIZE=64"], "PYTORCH_ROCM_ARCH": user_value}


def test_targets_mixing_wave32_and_wave64_are_refused(outcomes):
    kind, results = outcomes
    outcome = results["mixed-wave-user-arch"]
    if kind == "pristine":  # the bug: builds silently, for the MI210 host's wave64 only
        assert outcome["wavefront_flags"] == ["-DROCM_WAVEFRONT_SIZE=64"]
    else:
        error = outcome["error"]
        assert error.startswith("RuntimeError: PYTORCH_ROCM_ARCH mixes wave64 targets ['gfx90a'] and "
                                "wave32 targets ['gfx1100']")
        assert "Build one wheel per family" in error


def test_detection_collects_every_gpu_agent(outcomes):
    kind, results = outcomes
    outcome = results["igpu-listed-first"]
    if kind == "pristine":  # the bug: the first gfx on the page (the iGPU) is the only target
        assert outcome == {"wavefront_flags": ["-DROCM_WAVEFRONT_SIZE=32"], "PYTORCH_ROCM_ARCH": "gfx1103"}
    else:  # both agents seen; they need different wavefront sizes, so the build is refused
        assert outcome["error"].startswith("RuntimeError: PYTORCH_ROCM_ARCH mixes wave64 targets ['gfx90a'] "
                                           "and wave32 targets ['gfx1103']")


def test_no_gpu_and_no_arch_is_refused_instead_of_guessing_wave32(outcomes):
    kind, results = outcomes
    outcome = results["no-gpu-no-arch"]
    if kind == "pristine":  # the bug: silently wave32, no target
        assert outcome["wavefront_flags"] == ["-DROCM_WAVEFRONT_SIZE=32"]
    else:
        assert outcome["error"].startswith("RuntimeError: No ROCm target to build DeepSpeed ops for")
        assert "Set PYTORCH_ROCM_ARCH" in outcome["error"]


def test_explicit_wavefront_override(outcomes):
    kind, results = outcomes
    flags = results["no-gpu-explicit-wavefront"]["wavefront_flags"]
    assert flags == (["-DROCM_WAVEFRONT_SIZE=32"] if kind == "pristine" else ["-DROCM_WAVEFRONT_SIZE=64"])


def test_single_arch_multi_gpu_host_is_unchanged(outcomes):
    """Regression guard: the common case (4x MI210) builds as before, and the detected arch is exported."""
    _, results = outcomes
    assert results["four-mi210"] == {"wavefront_flags": ["-DROCM_WAVEFRONT_SIZE=64"],
                                     "PYTORCH_ROCM_ARCH": "gfx90a"}
