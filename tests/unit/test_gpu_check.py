"""scripts/gpu_check.py on this CPU machine: the report it writes (from made-up steps), the wheel parts that
carry a built wheel back from the device, its step runner, its refusals (one `error:` line, one `hint:`
line, exit 2), and the real script on a machine without a GPU (exit 3 at once, a report, nothing run).
Also the `gpu` marker: tests/gpu skips cleanly here, with the reason."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.cli import assert_one_error

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
WRAPPER = REPO / "scripts" / "gpu_check.sh"


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def gc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    """A wheels directory as scripts/gpu_wheels.sh leaves it, in name only (nothing here installs them)."""
    directory = tmp_path / "wheels"
    directory.mkdir()
    for name in ("mlstack_ds-0.1.0-py3-none-any.whl", "hjson-3.1.0-py3-none-any.whl",
                 "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl", "deepspeed-0.19.5.tar.gz"):
        (directory / name).write_bytes(b"not really")
    return directory


VERIFY = {"python": "/venv/bin/python", "world_size": 1, "duration_s": 51.2, "ok": False,
          "counts": {"pass": 2, "fail": 1, "skip": 1},
          "checks": [
              {"name": "zero3", "status": "pass", "reason": "", "duration_s": 4.0},
              {"name": "fused_adam", "status": "pass", "reason": "", "duration_s": 1.5},
              {"name": "activation_checkpointing", "status": "fail", "duration_s": 2.0,
               "reason": "rank 0: Expected all tensors to be on the same device | weight is on cpu"},
              {"name": "pipeline", "status": "skip", "reason": "needs 2 ranks", "duration_s": 0.0}]}
BENCH = {"spec": {"model": "350m", "micro_batch": 2, "seq_len": 1024, "steps": 3}, "ok": True,
         "runs": [{"world_size": 1, "stage": "ddp", "status": "ok", "reason": "",
                   "samples_per_s": {"median": 28.61, "min": 27.0, "max": 29.0}, "tokens_per_s": 29296.6,
                   "model_tflops_per_s": 66.52, "peak_memory_bytes": [10_300_000_000], "peak_memory_kind":
                   "accelerator", "precision": "bf16", "duration_s": 21.0},
                  {"world_size": 1, "stage": "zero3", "status": "oom", "reason": "CUDA out of memory",
                   "samples_per_s": None, "tokens_per_s": None, "model_tflops_per_s": None,
                   "peak_memory_bytes": [None], "peak_memory_kind": "accelerator", "precision": "bf16",
                   "duration_s": 9.0}]}
MACHINE = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "gfx": None,
                     "memory_gib": 79.2}],
           "driver": "580.95.05", "cuda": "13.0", "hip": None, "compiler": "nvcc 13.0.88", "torch": "2.11.0+cu130",
           "python": "3.12.3", "cores": 16, "memory_gib": 125.7}


def made_up_steps(gc: ModuleType) -> list[Any]:
    verify = gc.Step("verify", "verify (world size 1)", argv=["py", "-m", "mlstack_ds", "verify"], seconds=95.4,
                     exit_code=8, verdict="fail", summary=gc.summarize_verify(VERIFY), tail="error: 1 check failed")
    verify.reason = gc.verify_reason(verify.summary)
    bench = gc.Step("bench", "bench (350m, ddp,3)", seconds=40.0, exit_code=0, verdict="pass",
                    summary=gc.summarize_bench(BENCH))
    bench.reason = gc.bench_reason(bench.summary)
    return [gc.Step("tool", "tool install (offline)", seconds=12.0, exit_code=0, verdict="pass"),
            gc.Step("install", "DeepSpeed install", seconds=225.2, exit_code=0, verdict="pass", reason="installed"),
            verify, bench,
            gc.skip(gc.Step("pytest", "pytest -m gpu tests/gpu"), "--skip-pytest")]


def test_the_report_holds_the_machine_each_step_and_verify_and_bench(gc: ModuleType) -> None:
    report = gc.build_report(MACHINE, made_up_steps(gc), options={"budget_s": 540.0}, started=1_800_000_000.0,
                             finished=1_800_000_400.0, exit_code=8, verdict="fail")
    document = json.loads(json.dumps(report))  # it is plain JSON
    assert document["date"] == "2027-01-15T08:00:00+00:00" and document["seconds"] == 400.0
    assert [(s["name"], s["verdict"]) for s in document["steps"]] == [
        ("tool", "pass"), ("install", "pass"), ("verify", "fail"), ("bench", "pass"), ("pytest", "skipped")]
    assert document["steps"][2]["reason"] == "2 pass, 1 fail, 1 skip; failed: activation_checkpointing"
    assert document["verify"]["counts"] == {"pass": 2, "fail": 1, "skip": 1}
    failure = next(c for c in document["verify"]["checks"] if c["status"] == "fail")
    assert "same device" in failure["reason"]
    assert document["bench"]["runs"][0]["peak_gb"] == pytest.approx(10.3)
    assert document["steps"][3]["reason"] == "ddp@1 28.6 samples/s; zero3@1 oom (CUDA out of memory)"
    assert document["machine"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"


def test_the_summary_is_a_readable_table_of_steps_checks_and_numbers(gc: ModuleType) -> None:
    report = gc.build_report(MACHINE, made_up_steps(gc), options={}, started=1_800_000_000.0,
                             finished=1_800_000_400.0, exit_code=8, verdict="fail")
    text = gc.render_markdown(report)
    assert text.startswith("# GPU check: FAIL (exit 8)\n")
    assert ("1 x NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB); driver 580.95.05; CUDA 13.0; nvcc 13.0.88; "
            "torch 2.11.0+cu130; Python 3.12.3; 16 cores, 125.7 GiB") in text
    assert "| DeepSpeed install | 225 | 0 | pass | installed |" in text
    assert "| pytest -m gpu tests/gpu | 0 | - | skipped | --skip-pytest |" in text
    assert "## verify (2 pass, 1 fail, 1 skip; world size 1)" in text
    # a pipe inside a reason cannot break the table
    assert "| activation_checkpointing | fail | 2.0 | rank 0: Expected all tensors to be on the same device \\| " \
           "weight is on cpu |" in text
    assert "| 1 | ddp | ok | 28.6 | 29297 | 66.5 | 10.30 | 21 |" in text
    assert "| 1 | zero3 | oom: CUDA out of memory | - | - | - | - | 9 |" in text
    assert "## verify (world size 1): the end of its output" in text and "error: 1 check failed" in text


def test_a_wheel_goes_out_in_parts_and_comes_back_whole(gc: ModuleType, tmp_path: Path) -> None:
    index = tmp_path / "index" / "simple" / "deepspeed"
    index.mkdir(parents=True)
    payload = bytes(range(256)) * 40  # 10 KiB
    (index / "deepspeed-0.19.5+cu130-cp312-cp312-linux_x86_64.whl").write_bytes(payload)
    tarball = tmp_path / "wheel-index.tar"
    with tarfile.open(tarball, "w") as archive:
        archive.add(tmp_path / "index", arcname=".")
    out = tmp_path / "out"
    out.mkdir()
    parts = gc.split_file(tarball, out, part_bytes=4096, max_parts=5)
    assert parts == [f"wheel.part{i:02d}" for i in range(len(parts))] and len(parts) >= 3
    assert all((out / p).stat().st_size <= 4096 for p in parts)
    back = gc.unpack_wheel_index(out / "wheel.part00", tmp_path / "unpacked" / "index")
    assert (back / "simple" / "deepspeed" / "deepspeed-0.19.5+cu130-cp312-cp312-linux_x86_64.whl").read_bytes() \
        == payload
    with pytest.raises(ValueError, match="only 2 more files can come back"):
        gc.split_file(tarball, out, part_bytes=4096, max_parts=2)
    (out / "wheel.part01").unlink()
    with pytest.raises(gc.UsageProblem, match="without a gap"):
        gc.joined_parts(out / "wheel.part00")


def test_a_step_that_outlives_its_limit_is_killed_and_says_so(gc: ModuleType, tmp_path: Path) -> None:
    clock = gc.Clock(budget_s=gc.RESERVE_S + 6)
    logs = tmp_path / "logs"
    logs.mkdir()
    step = gc.Step("detect", "detect")
    gc.run_commands(step, [[sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"]],
                    env={}, cwd=tmp_path, logs=logs, clock=clock)
    assert step.verdict == "fail" and step.reason.startswith("timed out after")
    assert step.seconds < 60 and "started" in step.tail


def test_a_failing_step_gives_the_tools_error_line(gc: ModuleType, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    step = gc.Step("doctor", "doctor")
    code = "import sys; print('{\"ok\": 1}'); print('working', file=sys.stderr); " \
           "print('error: boom', file=sys.stderr); print('hint: fix it', file=sys.stderr); sys.exit(3)"
    stdout = gc.run_commands(step, [[sys.executable, "-c", code]], env={}, cwd=tmp_path, logs=logs,
                             clock=gc.Clock(budget_s=600))
    assert (step.verdict, step.exit_code, step.reason) == ("fail", 3, "exit 3: error: boom")
    assert gc.json_document(stdout) == {"ok": 1}
    assert gc.pytest_counts("2 passed, 1 skipped, 1 error in 3.2s") == {"passed": 2, "skipped": 1, "error": 1}


def run_wrapper(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The wrapper from `cwd` (a temporary directory: the default --out is relative to it)."""
    return subprocess.run(["bash", str(WRAPPER), *args, "--python", sys.executable], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize(("args", "says"), [
    ((), "the following arguments are required: --wheels"),
    (("--wheels", "/nonexistent/wheels"), "--wheels /nonexistent/wheels: no such directory"),
    (("--wheels", "{empty}"), "no mlstack_ds-*.whl in"),
    (("--wheels", "{wheels}", "--pin", "0.19.9"), "no deepspeed-0.19.9.tar.gz in"),
    (("--wheels", "{wheels}", "--bench-steps", "0"), "--bench-steps 0: must be at least 1"),
    (("--wheels", "{wheels}", "--bogus"), "unrecognized arguments: --bogus"),
])
def test_bad_arguments_are_one_error_line_and_exit_2(args: tuple[str, ...], says: str, wheels: Path,
                                                    tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "deepspeed-0.19.5.tar.gz").write_bytes(b"")
    done = run_wrapper(*(a.format(wheels=wheels, empty=tmp_path / "empty") for a in args), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "gpu-check-out").exists(), "a refusal writes nothing"
    error, hint = assert_one_error(done.stderr)
    assert says in error and hint.startswith("hint: ")


def test_the_wrapper_refuses_a_missing_interpreter() -> None:
    done = subprocess.run(["bash", str(WRAPPER), "--wheels", ".", "--python", "/nonexistent/python"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    error, _ = assert_one_error(done.stderr)
    assert error == "error: --python /nonexistent/python: no such interpreter"


@pytest.mark.skipif("has_gpu()", reason="this machine has a GPU: the check would run for real")
def test_without_a_gpu_it_says_so_at_once_writes_the_report_and_installs_nothing(wheels: Path,
                                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_wrapper("--wheels", str(wheels), "--out", str(out), "--keep-wheel", cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"gpu_check: no GPU visible to {sys.executable}: torch {__import__('torch').__version__} answers "
        "torch.cuda.is_available() = False; nothing was installed"]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "report.json", "report.md"]
    report = json.loads((out / "report.json").read_text())
    assert (report["verdict"], report["exit_code"]) == ("no-gpu", 3)
    assert report["machine"]["gpus"] == [] and report["machine"]["cores"] >= 1
    # nothing was started: no step has a command or an exit code
    assert {(s["verdict"], s["reason"], tuple(s["argv"]), s["exit_code"]) for s in report["steps"]} == {
        ("skipped", "no GPU visible", (), None)}
    assert "# GPU check: NO-GPU (exit 3)" in (out / "report.md").read_text()


def run_pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.skipif("has_gpu()", reason="this machine has a GPU: the gpu tests run instead of skipping")
def test_the_gpu_tests_skip_cleanly_here_with_the_reason() -> None:
    done = run_pytest("-m", "gpu", "tests/gpu")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " skipped" in summary and "passed" not in summary and "failed" not in summary and "error" not in summary
    assert "SKIPPED" in done.stdout and "no GPU visible: torch" in done.stdout
    assert "test_device_visible.py" in done.stdout
    # and CI's plain run leaves them out when asked to: they all carry the marker
    deselected = run_pytest("-m", "not gpu", "tests/gpu")
    assert deselected.returncode == 5 and "deselected" in deselected.stdout.strip().splitlines()[-1]


BUILD_BENCH = {"platform": "cuda", "ours": "mlstack-ds build", "time_cap_s": 225.0, "ops": ["fused_adam"],
               "op_set": {"of": ["fused_adam", "fused_lamb", "cpu_adam"], "cut": True,
                          "reason": "1 of the plan's 3 ops: ...", "hand_estimate_s": 115},
               "seconds": {"hand": {"wall": 118.2, "user": 110.0, "system": 6.5, "finished": True},
                           "cold": {"wall": 31.0, "user": 80.1, "system": 9.9, "finished": True},
                           "rebuild": {"wall": 20.0, "user": 15.0, "system": 2.0, "finished": False}},
               "cold_over_hand": 0.26, "cpu_cold_over_hand": 0.77, "same_ops_and_symbols": True}


def test_the_build_comparison_is_one_line_with_the_op_set_each_step_and_the_ratios(gc: ModuleType) -> None:
    summary = gc.summarize_build_bench(BUILD_BENCH)
    assert summary["steps"]["cold"] == {"wall": 31.0, "cpu": 90.0, "finished": True}
    assert gc.build_bench_reason(summary) == (
        "ops fused_adam (1 of 3: cut to fit the cap); hand 118.2 s; cold 31.0 s; rebuild 20.0 s (not finished); "
        "ours/hand: wall 0.26x, CPU 0.77x; same ops and symbols")
    unfinished = {**BUILD_BENCH, "op_set": {"of": ["fused_adam"], "cut": False}, "cold_over_hand": None,
                  "same_ops_and_symbols": None,
                  "seconds": {"hand": {"wall": 200.0, "user": 1, "system": 1, "finished": False}}}
    assert gc.build_bench_reason(gc.summarize_build_bench(unfinished)) == "ops fused_adam; hand 200.0 s (not finished)"


def test_the_build_comparison_runs_bench_with_the_targets_python_offline_and_capped(gc: ModuleType,
                                                                                    tmp_path: Path) -> None:
    argv = gc.build_bench_command("/venv/bin/python", tmp_path / "deepspeed-0.19.5.tar.gz", 224.6,
                                  tmp_path / "b.json")
    assert argv == ["/venv/bin/python", str(REPO / "scripts" / "bench.py"), "build", "--python", "/venv/bin/python",
                    "--sdist", str(tmp_path / "deepspeed-0.19.5.tar.gz"), "--time-cap", "225",
                    "--json-out", str(tmp_path / "b.json")]
    assert gc.LIMITS["build-bench"] <= 240  # the GPU check's slot: about 4 minutes for this part


def test_the_build_comparison_can_be_left_out(gc: ModuleType, wheels: Path) -> None:
    assert gc.parse(["--wheels", str(wheels), "--skip-build-bench"]).skip_build_bench is True
    assert gc.parse(["--wheels", str(wheels)]).skip_build_bench is False
