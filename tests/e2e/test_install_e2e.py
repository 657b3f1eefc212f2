"""`mlstack-ds install` for real on this CPU machine: cold build, no-op, warm reinstall, interrupts."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from support.cli import readme_main_command, run_cli, run_wrapper, start_cli
from support.e2e import CPU_SKIPS, FIRST_USE, Target, processes_mentioning
from support.fakepkg import guard_bin

pytestmark = pytest.mark.slow

PLANNED_OPS = {"cpu_adam", "fused_adam", "deepspeed_shm_comm", "async_io", "pin_memory"}


def test_cold_install_prebuilds_exactly_the_planned_ops(installed_target: Target, tmp_path: Path) -> None:
    status = installed_target.status()
    assert status["intact"] is True
    receipt = status["receipt"]
    assert set(receipt["ops"]) == PLANNED_OPS == set(status["installed"]["prebuilt_ops"])
    assert receipt["platform"] == "cpu" and receipt["deepspeed_version"] == "0.19.5"
    assert receipt["torch_version"] == "2.13.0+cpu" and receipt["previous"]["deepspeed_version"] is None
    assert Path(receipt["wheel"]).is_file() and len(receipt["wheel_sha256"]) == 64
    blocker = tmp_path / "no-jit"
    blocker.write_text("JIT would have to create a directory here")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(blocker)}
    loaded = subprocess.run([installed_target.python, "-c", FIRST_USE, *sorted(PLANNED_OPS)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert set(json.loads(loaded.stdout.strip().splitlines()[-1])) == PLANNED_OPS


def test_second_install_is_a_no_op(installed_target: Target) -> None:
    result = installed_target.install("--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["action"] == "up-to-date"


COUNT_STARTS = "MLSTACK_COUNT_STARTS"
# One line of a .pth file: run at every start of the interpreter (once: a venv's lib64 symlink makes site
# read its site-packages twice), it appends argv[:2] to the file $MLSTACK_COUNT_STARTS names, when set.
COUNTER_PTH = ("import os, sys; p = os.environ.get('MLSTACK_COUNT_STARTS'); p and not hasattr(sys, "
               "'_mlstack_counted') and (setattr(sys, '_mlstack_counted', 1) or print(repr(sys.argv[:2])[:100], "
               "file=open(p, 'a')))\n")


def count_starts(target: Target, *args: str, log: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`mlstack-ds install ARGS` with every start of the target interpreter logged. A `--python` wrapper
    script would miss most: after the probe, pip and verify run `plan.target_python` (the real path)."""
    pth = next((target.venv / "lib").glob("python3*/site-packages")) / "zz-mlstack-count-starts.pth"
    pth.write_text(COUNTER_PTH)
    try:
        result = target.install(*args, env={COUNT_STARTS: str(log)})
    finally:
        pth.unlink()
    return result, log.read_text().splitlines() if log.exists() else []


def test_a_no_op_install_starts_the_target_interpreter_once(installed_target: Target, tmp_path: Path) -> None:
    """Issue 13: detect's one probe answers everything a no-op install needs (before: 2 starts, the
    install asked the interpreter again for what it has installed)."""
    result, starts = count_starts(installed_target, "--json", log=tmp_path / "starts.log")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["action"] == "up-to-date"
    assert len(starts) == 1, starts


def test_force_reinstalls_from_the_warm_cache(installed_target: Target) -> None:
    logs_before = set((installed_target.cache / "logs").glob("*.log"))
    result = installed_target.install("--force", "--no-verify")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "reusing cached wheel" in result.stderr
    assert set((installed_target.cache / "logs").glob("*.log")) == logs_before  # nothing was compiled
    assert installed_target.status()["intact"] is True


def test_build_stops_after_the_wheel_and_copies_it(installed_target: Target, tmp_path: Path) -> None:
    """`mlstack-ds build` (image and login-node builds): the plan's wheel, from the warm cache, into
    --wheel-dir; the environment is not touched."""
    before = installed_target.status()
    logs_before = set((installed_target.cache / "logs").glob("*.log"))
    result = installed_target.cli("build", "--python", installed_target.python, "--cache-dir",
                                  str(installed_target.cache), "--wheel-dir", str(tmp_path / "wheels"), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["action"] == "cached"
    copied = Path(document["copied_to"])
    assert copied.parent == tmp_path / "wheels" and copied.name.startswith("deepspeed-0.19.5")
    assert hashlib.sha256(copied.read_bytes()).hexdigest() == document["sha256"] == before["receipt"]["wheel_sha256"]
    assert [p.name for p in copied.parent.iterdir()] == [copied.name]  # no partial file left
    assert set((installed_target.cache / "logs").glob("*.log")) == logs_before
    assert installed_target.status() == before
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    refused = installed_target.cli("build", "--python", installed_target.python, "--cache-dir",
                                   str(installed_target.cache), "--wheel-dir", str(not_a_dir))
    assert refused.returncode == 2 and "not a directory" in refused.stderr


def test_dry_run_json_changes_nothing(installed_target: Target) -> None:
    before = installed_target.status()
    result = installed_target.install("--dry-run", "--json")
    assert result.returncode == 0
    plan = json.loads(result.stdout)["plan"]
    assert plan["env"]["DS_ACCELERATOR"] == "cpu" and plan["env"]["DS_BUILD_OPS"] == "0"
    assert set(plan["built_ops"]) == PLANNED_OPS
    assert installed_target.status() == before


def test_killed_build_leaves_the_old_install_working(installed_target: Target) -> None:
    before = installed_target.status()
    proc = start_cli("install", "--python", installed_target.python, "--cache-dir", installed_target.cache,
                     "--rebuild", stderr=subprocess.STDOUT)
    logs = installed_target.cache / "logs"
    known = set(logs.glob("*.log"))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # wait until the compiler is really running
        new = set(logs.glob("*.log")) - known
        if new and "building '" in next(iter(new)).read_text(errors="replace"):
            break
        time.sleep(1)
    else:
        proc.kill()
        pytest.fail("the build never started compiling")
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output[-2000:]
    assert "interrupted: the build was stopped before anything was installed" in output
    time.sleep(1)
    assert processes_mentioning(str(installed_target.cache / "tmp")) == []  # no compiler left behind
    assert not list((installed_target.cache / "tmp").iterdir())  # staging removed
    assert installed_target.status() == before
    imported = subprocess.run([installed_target.python, "-c", "import deepspeed; print(deepspeed.__version__)"],
                              capture_output=True, text=True, timeout=300)
    assert imported.stdout.strip().splitlines()[-1] == "0.19.5", imported.stderr[-2000:]


def test_disk_full_build_fails_cleanly(installed_target: Target, tmp_path: Path) -> None:
    """RLIMIT_FSIZE (8 MiB) makes every write past 8 MiB fail, as on a full disk: the op libraries are
    ~16 MiB, so the build fails at link time. The error is one line with the log path; nothing changes."""
    before = installed_target.status()
    cache = tmp_path / "cache"
    limit = 8 * 2**20

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = run_cli("install", "--python", installed_target.python, "--cache-dir", cache, "--rebuild",
                     timeout=3600, preexec_fn=limit_file_size, columns=200)
    assert result.returncode == 6, result.stderr[-2000:]
    assert "error: building DeepSpeed failed" in result.stderr and "full log:" in result.stderr
    assert "Traceback" not in result.stderr
    assert installed_target.status() == before
    # Ops build at once (patch 0019): the first op to fail is named, with its own log, and the build
    # stops there: no op links after it, no compiler is left running.
    failed = re.search(r"failed in op (\w+): .*\n.*the op's log: (\S+);", result.stderr)
    assert failed, result.stderr[-2000:]
    op_log = Path(failed.group(2))
    assert op_log.name == f"{failed.group(1)}.log" and f"{failed.group(1)}_op" in op_log.read_text()
    full_log = op_log.parent.with_suffix(".log").read_text()
    assert "extension failed" in full_log.rstrip().splitlines()[-1]  # the build was stopped right there
    assert processes_mentioning(str(cache / "tmp")) == []


def test_rollback_then_reinstall_from_cache(installed_target: Target) -> None:
    result = installed_target.cli("rollback", "--python", installed_target.python, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["action"] == "rolled-back" and "there was none before" in document["summary"]
    assert document["installed"]["deepspeed_version"] is None
    assert installed_target.status()["receipt"] is None
    gone = subprocess.run([installed_target.python, "-c", "import deepspeed"], capture_output=True, timeout=300)
    assert gone.returncode != 0
    again = installed_target.install("--json", "--no-verify")  # the wheel cache spares the build
    assert again.returncode == 0 and json.loads(again.stdout)["action"] == "installed"
    assert installed_target.status()["intact"] is True


def test_uninstall_removes_ours_then_skips(installed_target: Target) -> None:
    result = installed_target.cli("uninstall", "--python", installed_target.python, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["action"] == "uninstalled" and document["installed"]["deepspeed_version"] is None
    assert installed_target.status()["receipt"] is None
    twice = installed_target.cli("uninstall", "--python", installed_target.python)
    assert twice.returncode == 0, twice.stderr  # like `pip uninstall` of something not installed
    assert "Skipping: nothing installed by mlstack-ds" in twice.stderr
    again = installed_target.install("--json", "--no-verify")  # later tests use the install
    assert again.returncode == 0 and installed_target.status()["intact"] is True


def test_bad_inputs_fail_with_one_line_and_code(installed_target: Target, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    cases = [
        (["--arch", "gfx9999"], 2, "is not a known GPU target"),
        (["--jobs", "0"], 2, "--jobs 0"),
        (["--cache-dir", str(not_a_dir / "cache")], 4, "not writable"),
    ]
    for args, code, message in cases:
        result = installed_target.cli("install", "--python", installed_target.python, *args)
        assert result.returncode == code, (args, result.stderr[-1000:])
        assert message in result.stderr and "Traceback" not in result.stderr
    no_compiler = installed_target.cli("install", "--python", installed_target.python, "--dry-run",
                                       env={"PATH": str(tmp_path), "CXX": ""})
    assert no_compiler.returncode == 3 and "no C++ compiler" in no_compiler.stderr


def test_torch_missing_is_refused_with_the_fix(bare_python: Path) -> None:
    result = run_cli("install", "--python", bare_python, "--dry-run", timeout=300)
    assert result.returncode == 3
    assert "PyTorch is not installed" in result.stderr and "--with-torch cpu" in result.stderr



# What verify cannot have on this platform whatever is installed (support/e2e.py says why each).
CPU_PLATFORM_SKIPS = CPU_SKIPS


def verify_failures(stdout: str) -> object:
    """The failed verify checks' reasons and the launches' ends in the JSON on stdout (what a failure shows)."""
    try:
        verify = json.loads(stdout).get("verify") or {}
    except ValueError:
        return stdout[-2000:]
    return {"checks": {c["name"]: c["reason"] for c in verify.get("checks", []) if c["status"] == "fail"},
            "launches": [{k: launch.get(k) for k in ("returncode", "duration_s", "timed_out", "log_tail")}
                         for launch in verify.get("launches", [])]}


@pytest.mark.reads_target  # into a venv of its own: reads only the target's wheel cache
def test_wrapper_installs_end_to_end_with_cpu_torch(installed_target: Target, tmp_path: Path) -> None:
    """The README's main command on a machine without torch (the system packages are there: scripts/test.sh
    installs them; a package manager call would fail the run); the shared wheel cache spares a rebuild.
    Verify then skips only what the CPU platform cannot have."""
    venv = tmp_path / "venv"
    guard = guard_bin(tmp_path / "guard")
    readme_args = readme_main_command()
    result = run_wrapper(*readme_args, "--venv", venv, "--", "--cache-dir", installed_target.cache, "--json",
                         timeout=3600, env={"PATH": f"{guard}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, (result.stderr[-3000:], verify_failures(result.stdout))
    document = json.loads(result.stdout)
    assert document["action"] == "installed" and document["receipt"]["torch_version"] == "2.13.0+cpu"
    skipped = {c["name"]: c["reason"] for c in document["verify"]["checks"] if c["status"] == "skip"}
    assert set(skipped) == CPU_PLATFORM_SKIPS, skipped
    assert "reusing cached wheel" in result.stderr
    assert not (guard / "calls.log").exists(), (guard / "calls.log").read_text()  # nothing needed installing
    assert result.stderr.splitlines()[-1].startswith("==> nothing left out that this script can add")
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import deepspeed; print(deepspeed.__version__)"],
                           capture_output=True, text=True, timeout=300)
    assert check.stdout.strip().splitlines()[-1] == "0.19.5", check.stderr[-2000:]


def test_conflicting_patch_stops_before_the_build(installed_target: Target, deepspeed_sdist: Path,
                                                  tmp_path: Path) -> None:
    """A local tree (say, a user's edited copy) where 0001's hunk no longer fits: exit 5, named patch and
    file, nothing built or installed."""
    with tarfile.open(deepspeed_sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    tree = tmp_path / "deepspeed-0.19.5"
    target = tree / "deepspeed" / "runtime" / "zero" / "partition_parameters.py"
    target.write_text(target.read_text().replace("launch_handles[-1].wait()", "launch_handles[-1].wait()  # edited"))
    before = installed_target.status()
    logs_before = set((installed_target.cache / "logs").glob("*.log"))
    result = installed_target.install("--source", str(tree))
    assert result.returncode == 5, result.stderr[-2000:]
    assert "0001-zero3-wait-for-every-async-all-gather.patch" in result.stderr
    assert "partition_parameters.py" in result.stderr and "Traceback" not in result.stderr
    assert set((installed_target.cache / "logs").glob("*.log")) == logs_before  # no build started
    assert installed_target.status() == before
