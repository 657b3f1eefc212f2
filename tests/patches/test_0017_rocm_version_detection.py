"""Patch 0017: OpBuilder.installed_rocm_version() finds the ROCm version without <ROCM_HOME>/.info/version.

Each scenario is a fake ROCm root (probes/rocm_version_probe.py) holding only some of the files ROCm
installs; DeepSpeed's real installed_rocm_version() runs against it with a ROCm torch faked. 0.19.5 knows
only .info/version, a "+rocmX.Y" torch version and /usr/include/rocm_version.h; without them it asserts,
which kills setup.py (it calls this at import) and every ROCm op build.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

PROBE = Path(__file__).resolve().parent / "probes" / "rocm_version_probe.py"
ASSERTION = "AssertionError: Could not detect ROCm version"
ROCM_VERSION_H = """#ifndef ROCM_VERSION_H
#define ROCM_VERSION_H
#define ROCM_VERSION_MAJOR   6
#define ROCM_VERSION_MINOR   4
#define ROCM_VERSION_PATCH   1
#endif
"""
HIP_6_2 = "6.2.41134-65d174c3e"  # torch.version.hip of a ROCm 6.2 wheel
# name -> (files in the ROCm root, what bin/hipconfig prints or None, torch.__version__, torch.version.hip)
SCENARIOS: dict[str, tuple[dict[str, str], str | None, str, str]] = {
    "amd-packages": ({".info/version": "6.2.4-120\n"}, None, "2.5.1", HIP_6_2),
    "torch-rocm-wheel": ({}, None, "2.5.1+rocm6.1", HIP_6_2),
    "rocm-core-header-only": ({"include/rocm-core/rocm_version.h": ROCM_VERSION_H}, None, "2.5.1", HIP_6_2),
    "legacy-header-only": ({"include/rocm_version.h": ROCM_VERSION_H}, None, "2.5.1", HIP_6_2),
    # Debian's hipconfig --version, captured on the CI machine (ROCm 5.2 packages); torch says 6.2 so
    # the result shows which source won
    "distro-hipconfig-only": ({}, "5.2.21153-0", "2.5.1", HIP_6_2),
    "torch-hip-version-only": ({}, None, "2.5.1", HIP_6_2),
    "nothing-known": ({}, None, "2.5.1", "unknown"),
}


@pytest.fixture(scope="module")
def detected(ds_tree: tuple[str, Path]) -> tuple[str, dict]:
    if Path("/usr/include/rocm_version.h").exists():
        pytest.skip("this machine has /usr/include/rocm_version.h, which 0.19.5 reads for every fake root")
    kind, tree = ds_tree
    scenarios = [{"name": name, "files": files, "hipconfig": hipconfig, "torch_version": torch_version,
                  "hip_version": hip_version}
                 for name, (files, hipconfig, torch_version, hip_version) in SCENARIOS.items()]
    result = run_python_in_tree(tree, PROBE, json.dumps(scenarios))
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    return kind, json.loads(line.removeprefix("RESULTS "))


@pytest.mark.parametrize(("scenario", "version"), [("amd-packages", [6, 2]), ("torch-rocm-wheel", [6, 1])])
def test_sources_0195_knew_are_unchanged(detected, scenario, version):
    _, results = detected
    assert results[scenario] == {"version": version, "printed": ""}


@pytest.mark.parametrize(("scenario", "version"), [
    ("rocm-core-header-only", [6, 4]),
    ("legacy-header-only", [6, 4]),
    ("distro-hipconfig-only", [5, 2]),
    ("torch-hip-version-only", [6, 2]),
])
def test_version_found_without_info_version(detected, scenario, version):
    kind, results = detected
    if kind == "pristine":  # the bug: the build dies
        assert results[scenario] == {"error": ASSERTION}
    else:
        assert results[scenario] == {"version": version, "printed": ""}


def test_nothing_known_warns_instead_of_asserting(detected):
    kind, results = detected
    if kind == "pristine":
        assert results["nothing-known"] == {"error": ASSERTION}
    else:
        assert results["nothing-known"]["version"] == [0, 0]
        assert "Could not detect the ROCm version of" in results["nothing-known"]["printed"]
