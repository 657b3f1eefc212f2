"""The ROCm build rehearsal: DeepSpeed's real setup.py, in ROCm mode, on every row of the build matrix.

Each row runs our whole build stage (fetch, patch, `pip wheel`) with torch reporting a ROCm release and
recording stand-ins for hipcc and the host compiler (mlstack_ds/rehearsal). The matrix runs once per
session, two rehearsals at a time; the rows and docs/rocm-build-matrix.md come from the same results.
Extra rehearsals of the *pristine* release show what the rows would get wrong without our patches.
"""

from __future__ import annotations

import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from support.target_env import DS_NEXT_SDIST_SHA256, DS_NEXT_VERSION, DS_VERSION, cached_deepspeed_sdist

from mlstack_ds.recipe import find_recipe
from mlstack_ds.rehearsal.matrix import GFX1100, ROWS, Row, matrix_markdown, rocminfo_text, spec_for
from mlstack_ds.rehearsal.run import (
    NOT_FOR_ROCM,
    RehearsalResult,
    RehearsalSpec,
    deepspeed_chose_standard,
    rehearse,
    standard_year,
    violations,
)
from mlstack_ds.source.fetch import parse_source_spec

REPO = Path(__file__).resolve().parents[2]
CAPTURES = (REPO / "tests" / "fixtures" / "real", REPO / "tests" / "patches" / "fixtures")
DOCS = REPO / "docs" / "rocm-build-matrix.md"
STUBS = REPO / "tests" / "patches" / "hip" / "stub"
HIPCC = shutil.which("hipcc")  # Debian's (scripts/test.sh installs it): the syntax check of hipified sources
ROWS_BY_NAME = {row.name: row for row in ROWS}
ROCM_PLANNED = {"fused_adam", "fused_lamb", "fused_lion", "cpu_adam", "cpu_adagrad", "cpu_lion", "quantizer", "utils",
                "async_io", "pin_memory"}

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler (build-essential)")


def find_capture(name: str) -> Path:
    return next(d / name for d in CAPTURES if (d / name).is_file())


# Pristine DeepSpeed 0.19.5 on three rows: each shows one failure our series prevents.
PRISTINE = {
    "torch2.14": replace(spec_for(ROWS_BY_NAME["mi300x-build-host-rocm7.0-torch2.14"], find_capture),
                         name="pristine-torch2.14", patches=False),
    "distro": replace(spec_for(ROWS_BY_NAME["rx6900xt-distro-rocm6.2-torch2.11"], find_capture),
                      name="pristine-distro", patches=False),
    "all-ops": replace(spec_for(ROWS_BY_NAME["rx7900xtx-all-ops-rocm6.4-torch2.13"], find_capture),
                       name="pristine-all-ops", patches=False),
}


@pytest.fixture(scope="session")
def rehearsals(deepspeed_sdist: Path, fetch_cache: Path) -> dict[str, RehearsalResult]:
    """Every matrix row (each with its pin's sdist and series) and the pristine rehearsals, run once, two at
    a time (2 cores)."""
    sdists = {DS_VERSION: deepspeed_sdist, DS_NEXT_VERSION: cached_deepspeed_sdist(DS_NEXT_VERSION,
                                                                                   DS_NEXT_SDIST_SHA256)}
    specs = [spec_for(row, find_capture, HIPCC, STUBS) for row in ROWS] + list(PRISTINE.values())
    recipes = [row.recipe for row in ROWS] + [f"deepspeed-{DS_VERSION}"] * len(PRISTINE)

    def one(spec: RehearsalSpec, recipe_name: str) -> RehearsalResult:
        recipe = find_recipe(recipe_name)
        source = parse_source_spec(str(sdists[recipe.version]))
        return rehearse(spec, recipe, source, python=Path(sys.executable), fetch_cache=fetch_cache)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, specs, recipes))
    return {r.spec.name: r for r in results}


def hip_compiles(result: RehearsalResult) -> list:
    return [r for op in result.ops.values() for r in op.compiles if r.is_hip]


PLANNED_ROWS = [r for r in ROWS if not r.all_ops]


@pytest.mark.parametrize("row", PLANNED_ROWS, ids=[r.name for r in PLANNED_ROWS])
def test_matrix_row_builds_exactly_the_plan(rehearsals, row: Row):
    result = rehearsals[row.name]
    assert result.outcome == "built", f"{result.error}\n{result.log_tail}"
    assert violations(result) == []
    plan = result.plan
    assert plan is not None
    expected = ROCM_PLANNED - ({"async_io"} if not plan_has_libaio(result) else set())
    assert set(plan.built_ops) == expected
    assert set(result.ops) == expected == {n for n, on in result.installed_ops.items() if on}
    assert not set(result.ops) & NOT_FOR_ROCM
    assert hip_compiles(result), "no HIP translation unit was compiled"
    for record in hip_compiles(result):
        assert sorted(record.offload_archs) == sorted(plan.archs)
        assert set(record.wavefront_defines) == {plan.wavefront}
        assert standard_year(record.std[-1]) >= standard_year(result.required_std)


def plan_has_libaio(result: RehearsalResult) -> bool:
    assert result.plan is not None
    return any(op.name == "async_io" and op.build for op in result.plan.ops)


@pytest.mark.parametrize(("row", "archs", "wave", "source"), [
    ("rx7900xtx-rocm6.4-torch2.13", ("gfx1100",), 32, "detected"),
    ("mi210x4-rocm6.4-torch2.12", ("gfx90a",), 64, "detected"),
    ("mi300x-build-host-rocm7.0-torch2.14", ("gfx942",), 64, "flag"),
    ("rx9070-build-host-rocm7.0-torch2.13", ("gfx1201",), 32, "environment"),
    ("gfx1100+gfx1030-rocm7.0-torch2.12", ("gfx1100", "gfx1030"), 32, "detected"),
    ("rx7900xtx-rocm6.4-torch2.13-ds0.19.8", ("gfx1100",), 32, "detected"),
    ("mi300x-build-host-rocm7.0-torch2.14-ds0.19.8", ("gfx942",), 64, "flag"),
    ("rx9070-therock7.14-torch2.14", ("gfx1201",), 32, "environment"),
    ("strix-halo-therock7.14-torch2.14", ("gfx1151",), 32, "flag"),
    ("mi300x-therock10.1-torch2.13", ("gfx942",), 64, "flag"),
    ("mi300x-core10.0-torch2.13", ("gfx942",), 64, "flag"),
])
def test_targets_and_wavefront_per_machine(rehearsals, row, archs, wave, source):
    result = rehearsals[row]
    assert result.plan is not None
    assert (result.plan.archs, result.plan.wavefront, result.plan.targets_source) == (archs, wave, source)
    offload = {f"--offload-arch={a}" for a in archs}
    for record in hip_compiles(result):
        assert offload <= set(record.argv)
        assert f"-DROCM_WAVEFRONT_SIZE={wave}" in record.argv


@pytest.mark.parametrize(("row", "std"), [("rx7900xtx-rocm6.2-torch2.11", "c++17"),
                                          ("rx7900xtx-rocm6.4-torch2.13", "c++20"),
                                          ("mi210x4-rocm6.4-torch2.12", "c++20"),
                                          ("mi300x-build-host-rocm7.0-torch2.14", "c++20"),
                                          ("mi300x-build-host-rocm7.0-torch2.14-ds0.19.8", "c++20")])
def test_deepspeed_gives_every_compile_the_standard_of_its_torch(rehearsals, row, std):
    """Where DeepSpeed chooses the standard (CUDAOpBuilder's cxx_args() and nvcc_args()) it follows torch
    (patch 0015); where it gives none (fused_adam/lamb/lion on hipcc, utils, pin_memory), torch's
    cpp_extension adds its default: C++20 in the installed 2.13's code, whatever release the row reports,
    which every release's headers accept."""
    records = [r for op in rehearsals[row].ops.values() for r in op.compiles]
    chosen = [r for r in records if deepspeed_chose_standard(r)]
    assert any(r.is_hip for r in chosen) and any(not r.is_hip for r in chosen)
    assert {r.std[-1] for r in chosen} == {std}
    assert all(standard_year(r.std[-1]) >= standard_year(std) for r in records)


@pytest.mark.skipif(HIPCC is None, reason="hipcc not installed (scripts/test.sh installs Debian's)")
@pytest.mark.parametrize("row", [r.name for r in ROWS if r.syntax_check])
def test_hipified_sources_pass_the_syntax_check_where_headers_allow(rehearsals, row):
    """Debian's hipcc (ROCm 5.2) checks each hipified translation unit with the recorded flags; a unit
    fails only for a header this machine lacks, never for an error in DeepSpeed's (patched) code."""
    verdicts = {Path(r.source or "").name: r.syntax for op in rehearsals[row].ops.values() for r in op.compiles
                if r.syntax is not None}
    assert verdicts, "no syntax check ran"
    assert verdicts["quantize_intX.hip"] == {"ok": True, "first_error": None}
    for name, verdict in verdicts.items():
        assert verdict["ok"] or "file not found" in (verdict["first_error"] or ""), (name, verdict)


def test_distro_rocm_without_info_version_builds(rehearsals):
    assert rehearsals["rx6900xt-distro-rocm6.2-torch2.11"].outcome == "built"
    # the torch of this row reports no arch list: the plan says it could not check the targets
    notes = rehearsals["rx6900xt-distro-rocm6.2-torch2.11"].plan.notes  # type: ignore[union-attr]
    assert any("could not check the targets" in n for n in notes)


def test_pristine_hipcc_gets_cxx17_that_torch_2_14_headers_refuse(rehearsals):
    result = rehearsals["pristine-torch2.14"]
    assert result.outcome == "built"
    wrong = {r.std[-1] for op in result.ops.values() for r in op.compiles if r.is_hip}
    assert "c++17" in wrong  # DeepSpeed's nvcc_args() hard-codes it on ROCm (patch 0015 fixes it)
    assert any("quantizer" in v and "-std=c++17, but torch 2.14.0's headers need -std=c++20" in v
               for v in violations(result))


def test_pristine_setup_asserts_without_info_version(rehearsals):
    result = rehearsals["pristine-distro"]
    assert result.outcome == "build-failed"
    assert "AssertionError" in result.log_tail or "assert" in (result.error or "").lower()


def test_pristine_all_ops_attempts_a_cuda_only_op(rehearsals):
    result = rehearsals["pristine-all-ops"]
    assert result.outcome == "build-failed"
    assert "dskernels" in result.log_tail


def test_all_ops_with_series_builds_only_what_rocm_can(rehearsals):
    result = rehearsals["rx7900xtx-all-ops-rocm6.4-torch2.13"]
    assert result.outcome == "built", result.log_tail
    assert violations(result) == []
    assert not set(result.ops) & NOT_FOR_ROCM
    assert {"fused_adam", "cpu_adam", "quantizer", "transformer"} <= set(result.ops)


WHEELS_ROWS = [r.name for r in ROWS if r.rocm_layout == "wheels"]


@pytest.mark.parametrize("row", WHEELS_ROWS)
def test_a_rocm_wheels_venv_builds_against_its_devel_tree(rehearsals, row):
    """Not activated, no ROCm root on the host, torch guessing the venv root or the devel tree: the plan names
    ROCM_HOME and ROCM_PATH itself, so every hipcc line reads the devel tree's headers either way (without it,
    torch's guess gives `cannot find -lamdhip64` or `hipblas/hipblas.h: No such file or directory`)."""
    result = rehearsals[row]
    assert result.plan is not None and result.plan.rocm_wheels == result.spec.rocm_version
    devel = result.plan.env["ROCM_HOME"]
    assert devel == result.plan.env["ROCM_PATH"] and devel.endswith("/site-packages/_rocm_sdk_devel")
    assert hip_compiles(result)
    for record in hip_compiles(result):
        assert f"-I{devel}/include" in record.argv


def test_the_2026_system_layout_is_found_without_rocm_path(rehearsals):
    """`amdrocm-*` packages install under /opt/rocm/core-X.Y; with no variable naming it and its bin not on
    PATH, detect finds it there, and the build gets it as ROCM_HOME (the ROCm gate reads its 10.0.0)."""
    result = rehearsals["mi300x-core10.0-torch2.13"]
    assert result.plan is not None and result.outcome == "built"
    assert result.plan.env["ROCM_HOME"].endswith("/opt-rocm/core-10.0")
    assert "ROCM_PATH" not in result.plan.env and "ROCM_PATH" not in result.spec.user_env


def test_docs_matrix_is_current(rehearsals):
    expected = matrix_markdown(ROWS, [rehearsals[row.name] for row in ROWS])
    assert DOCS.read_text() == expected, "regenerate: scripts/rehearse_rocm_build.py --matrix --write-docs"


def test_spliced_node_has_both_gpus():
    text = rocminfo_text([find_capture(GFX1100), find_capture("rocminfo_gfx1030_rocm-issue-2773.txt")])
    assert "gfx1100" in text and "gfx1030" in text and text.count("*** Done ***") <= 1


@pytest.mark.parametrize(("change", "message"), [
    ({"torch_build": "cpu"}, "has a CPU PyTorch"),
    ({"torch_build": "cuda"}, "has a CUDA PyTorch"),
    ({"archs": "gfx90a,gfx1100"}, "mix wave32 and wave64"),
    ({"archs": "gfx9999"}, "not a known GPU target"),
    ({"user_env": {"PYTORCH_ROCM_ARCH": "cuda;sm_80"}}, "PYTORCH_ROCM_ARCH"),
    ({"archs": "gfx1151", "torch_archs": ("gfx90a", "gfx1100")}, "not in torch"),
])
def test_bad_machines_are_refused_before_building(deepspeed_sdist, fetch_cache, change, message):
    base = RehearsalSpec("bad", find_capture(GFX1100).read_text(), **change)
    result = rehearse(base, find_recipe("deepspeed-0.19.5"), parse_source_spec(str(deepspeed_sdist)),
                      python=Path(sys.executable), fetch_cache=fetch_cache)
    assert result.outcome == "refused"
    assert message in (result.error or ""), result.error
    assert result.exit_code in (2, 3)
    assert result.hint
    assert result.ops == {}

