"""scripts/bench.py build without building: the op set a time cap allows, the recipe cut to it, the one-op
patch the rebuild applies, the result, and the arguments it refuses (issue 43)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
CUDA_OPS = ["fused_adam", "fused_lamb", "fused_lion", "cpu_adam", "cpu_adagrad", "cpu_lion", "quantizer",
            "transformer", "stochastic_transformer", "transformer_inference", "random_ltd", "utils", "async_io",
            "pin_memory"]
CPU_OPS = ["cpu_adam", "fused_adam", "deepspeed_shm_comm", "async_io", "pin_memory"]


def load(name: str) -> ModuleType:
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))  # the scripts import each other by name, as bench.py runs them
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    return load("bench_build_ops")


@pytest.fixture(scope="module")
def bb() -> ModuleType:
    return load("bench_build")


def test_without_a_cap_both_builds_build_every_planned_op(ops: ModuleType) -> None:
    chosen = ops.choose_ops(CPU_OPS, "cpu", None)
    assert chosen.ops == tuple(CPU_OPS) and not chosen.cut and "no --time-cap" in chosen.reason


def test_a_gpu_check_cap_cuts_cudas_ops_to_what_the_hand_build_can_finish_and_says_so(ops: ModuleType) -> None:
    chosen = ops.choose_ops(CUDA_OPS, "cuda", 225)
    assert chosen.cut and chosen.ops[0] == "fused_adam"  # the GPU optimizer first: a GPU op is always compared
    assert set(chosen.ops) <= {"fused_adam", "cpu_adam", "pin_memory", "utils", "cpu_adagrad"}
    assert chosen.hand_estimate_s <= 225 * ops.HAND_SHARE
    assert f"{len(chosen.ops)} of the plan's 14 ops" in chosen.reason and "--time-cap 225" in chosen.reason
    # the H100 hand build: fused_adam, cpu_adam and pin_memory done at 245 s, so they fit a 245 s share
    assert ops.hand_estimate(["fused_adam", "cpu_adam", "pin_memory"], "cuda") <= 245


def test_a_larger_cap_takes_more_ops_and_the_plans_order_is_kept(ops: ModuleType) -> None:
    small, large = ops.choose_ops(CUDA_OPS, "cuda", 200), ops.choose_ops(CUDA_OPS, "cuda", 2000)
    assert set(small.ops) < set(large.ops)
    assert list(large.ops) == [op for op in CUDA_OPS if op in large.ops]


def test_a_cap_too_small_for_any_op_still_compares_one(ops: ModuleType) -> None:
    assert ops.choose_ops(CUDA_OPS, "cuda", 60).ops == ("fused_adam",)
    assert ops.choose_ops(["transformer"], "rocm", 60).ops == ("transformer",)


def test_asked_ops_are_taken_as_given_and_an_unplanned_one_is_refused(ops: ModuleType) -> None:
    assert ops.choose_ops(CPU_OPS, "cpu", 100, ["fused_adam", "cpu_adam"]).ops == ("cpu_adam", "fused_adam")
    with pytest.raises(ValueError, match="--ops transformer: not in the plan for cpu"):
        ops.choose_ops(CPU_OPS, "cpu", None, ["transformer"])


def test_the_recipe_copy_cuts_only_the_platforms_ops(bb: ModuleType, tmp_path: Path) -> None:
    recipe = bb.recipe_copy(tmp_path, ["fused_adam", "cpu_adam"], None, "cuda").read_text()
    section = recipe.split("[platforms.cuda.ops]")[1].split("\n[")[0]
    built = [line.split("=")[0].strip() for line in section.splitlines() if "build = true" in line]
    assert built == ["fused_adam", "cpu_adam"]
    rocm = recipe.split("[platforms.rocm.ops]")[1].split("\n[")[0]
    assert "quantizer = { flag = \"DS_BUILD_QUANTIZER\", build = true" in rocm  # other platforms untouched


@pytest.mark.parametrize("case", [
    ("cpu", ["cpu_adam", "fused_adam", "deepspeed_shm_comm"], ("deepspeed_shm_comm", "csrc/cpu/comm/shm.cpp")),
    ("cuda", ["fused_adam", "cpu_adam"], ("fused_adam", "csrc/adam/fused_adam_frontend.cpp")),
    ("rocm", ["cpu_adam", "utils"], ("cpu_adam", "csrc/adam/cpu_adam.cpp")),
])
def test_the_rebuilds_patch_changes_one_source_of_an_op_in_the_set_and_applies(
        bb: ModuleType, deepspeed_sdist: Path, tmp_path: Path, case: tuple[str, list[str], tuple[str, str]]) -> None:
    platform, planned, changed = case
    assert bb.rebuild_source(platform, planned) == changed
    with tarfile.open(deepspeed_sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    tree = tmp_path / "deepspeed-0.19.5"
    patch = bb.one_op_patch(tree, *changed)
    assert f"Subject: [PATCH] {changed[0]}: a one-op change" in patch and "Forwarded: not-needed" in patch
    subprocess.run(["git", "apply", "--check", "-"], input=patch, text=True, cwd=tree, check=True)
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=tree, check=True)
    assert "// rebuild benchmark: a one-op change" in (tree / changed[1]).read_text().splitlines()[3]
    assert bb.rebuild_source("cuda", ["utils", "pin_memory"]) is None  # nothing to change: no rebuild step


def test_the_result_says_which_ops_why_and_what_did_not_finish(bb: ModuleType, ops: ModuleType) -> None:
    op_set = ops.choose_ops(CUDA_OPS, "cuda", 225)
    steps = {"hand": {"wall": 200.0, "user": 190.0, "system": 10.0, "limit": 12.5, "wall_over_limit": 16.0,
                      "finished": False},
             "cold": {"wall": 40.0, "user": 300.0, "system": 20.0, "limit": 20.0, "wall_over_limit": 2.0,
                      "finished": True}}
    report = bb.make_report(steps, op_set, {"concurrency": None}, platform="cuda", command="build", cap_s=225,
                            rebuild_ccache={}, rebuild_changes=None, compared=None)
    assert report["ops"] == list(op_set.ops) and report["op_set"]["cut"] is True
    assert report["cold_over_hand"] is None and report["same_ops_and_symbols"] is None  # no comparison
    text = bb.markdown(report)
    assert "| hand | 200.0 | 190.0 | 10.0 | 12.5 | 16.0 | **no** (stopped at the cap) |" in text
    assert "ours: `mlstack-ds build`" in text and "No rebuild" in text and op_set.reason in text


def test_a_step_past_its_time_is_stopped_with_its_children(bb: ModuleType) -> None:
    result = bb.timed(["bash", "-c", "sleep 30 & sleep 30; wait"], {"PATH": "/usr/bin:/bin"}, timeout=1)
    assert result["finished"] is False and result["wall"] < 10
    assert bb.timed(["true"], {"PATH": "/usr/bin:/bin"})["finished"] is True


@pytest.mark.parametrize(("args", "says"), [
    (["--time-cap", "30"], "error: --time-cap 30: too short for two builds (at least 60 s)"),
    (["--sdist", "/nonexistent/deepspeed.tar.gz"], "error: --sdist /nonexistent/deepspeed.tar.gz: no such file"),
    (["--python", "/nonexistent/python"], "error: --python /nonexistent/python: no such interpreter"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
])
def test_bad_arguments_are_one_error_line_a_hint_and_exit_2(args: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), "build", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [says, "hint: python scripts/bench.py build --help"]
