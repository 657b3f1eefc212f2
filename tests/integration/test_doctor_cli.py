"""The real `mlstack-ds doctor` in a subprocess on a faked AMD machine: a fake `rocminfo` on PATH
printing a real capture, a temporary ROCM_PATH with `.info/version`, and a fake /dev, /proc, /sys
root (`--sys-root`). The target interpreter is the test venv's (a real CPU torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.cli import CliResult, run_cli
from support.doctor_machine import DoctorMachine

from mlstack_ds.rehearsal.therock import DevelState, make_therock_venv

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REAL = FIXTURES / "real"
RX7900 = REAL / "rocminfo_gfx1100_rocm-issue-3949.txt"
MI210X4 = REAL / "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt"
LUMI_DS_REPORT = REAL / "ds_report_rocm-6.0_torch-2.3.1_ds-0.14.0_lumi-container.txt"
MASK_ERROR = FIXTURES / "doctor-logs" / "mask-64bit_ds-7565.txt"
EXIT_ENVIRONMENT = 3


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def findings(result: CliResult) -> dict[str, dict]:
    return {f["rule_id"]: f for f in json.loads(result.stdout)["findings"]}


@pytest.fixture(scope="module")
def rx7900_json(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    machine = DoctorMachine(tmp_path_factory.mktemp("rx7900"), RX7900, kfd_targets=(110000,))
    return machine.run("--json")


def test_cpu_torch_on_an_rx7900_is_an_error(rx7900_json: CliResult) -> None:
    assert rx7900_json.returncode == EXIT_ENVIRONMENT, rx7900_json.stderr
    document = json.loads(rx7900_json.stdout)
    env = document["environment"]
    assert env["platform"] == "rocm"
    assert [g["arch"] for g in env["gpus"]] == ["gfx1100"]
    assert env["rocm"]["version"] == "6.2.2"
    found = findings(rx7900_json)
    assert found["MLS-TORCH-003"]["severity"] == "error"
    assert "gfx1100" in found["MLS-TORCH-003"]["evidence"]
    assert found["MLS-TORCH-003"]["docs"] == "docs/troubleshooting.md#mls-torch-003"
    # single GPU: no IOMMU warning; libaio present in the fake root; kfd present and accessible
    assert not {"MLS-NET-001", "MLS-BUILD-005", "MLS-DEV-001", "MLS-DEV-002", "MLS-GPU-001"} & set(found)


def test_table_output_and_exit_code(tmp_path: Path) -> None:
    result = DoctorMachine(tmp_path, RX7900, kfd_targets=(110000,)).run()
    assert result.returncode == EXIT_ENVIRONMENT
    assert "MLS-TORCH-003" in result.stdout
    assert "CPU-only PyTorch" in result.stdout
    assert "1 error(s)" in result.stderr


def test_forgotten_override_on_mi210s(tmp_path: Path) -> None:
    """ROCm/legacy-rocm-build#5238: HSA_OVERRIDE_GFX_VERSION=10.3.0 left set on MI210s
    (KFD still reports gfx90a)."""
    machine = DoctorMachine(tmp_path, MI210X4, kfd_targets=(90010,) * 4)
    result = machine.run("--json", HSA_OVERRIDE_GFX_VERSION="10.3.0", DS_ACCELERATOR="rocm")
    assert result.returncode == EXIT_ENVIRONMENT
    found = findings(result)
    assert "gfx90a (CDNA2, wave64)" in found["MLS-ENV-002"]["evidence"]
    assert "ValueError" in found["MLS-ENV-005"]["evidence"]  # rejected value: ENV-005, not ENV-003
    assert "MLS-ENV-003" not in found
    assert found["MLS-NET-001"]["severity"] == "warning"  # 4 GPUs, IOMMU on, no iommu=pt


def test_no_gpu_machine_with_a_log_and_a_report(tmp_path: Path) -> None:
    machine = DoctorMachine(tmp_path, None)
    result = machine.run("--report", "--log", str(LUMI_DS_REPORT))
    assert result.returncode == 0, result.stdout + result.stderr
    report = result.stdout
    assert report.startswith("### mlstack-ds doctor report")
    assert "- PyTorch: 2.13.0" in report
    assert "| info | MLS-LOG-004 |" in report
    assert "| warning | MLS-DS-001 |" in report
    assert "log line 47: deepspeed wheel compiled w. ...... torch 0.0, hip 0.0" in report


def test_an_error_in_the_log_sets_the_exit_code(tmp_path: Path) -> None:
    result = DoctorMachine(tmp_path, None).run("--json", "--log", str(MASK_ERROR))
    assert result.returncode == EXIT_ENVIRONMENT
    finding = findings(result)["MLS-LOG-001"]
    assert finding["origin"] == "log"
    assert "The mask must be a 64-bit integer" in finding["evidence"]


def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path) -> None:
    machine = DoctorMachine(tmp_path, None)
    missing = machine.run("--log", str(tmp_path / "absent.log"))
    assert missing.returncode == 2
    assert "error: --log" in missing.stderr and "Traceback" not in missing.stderr
    both = machine.run("--json", "--report")
    assert both.returncode == 2
    assert "choose one" in both.stderr


def test_missing_libaio_is_an_error_only_when_the_config_offloads_to_nvme(tmp_path: Path) -> None:
    machine = DoctorMachine(tmp_path, None)
    (machine.root / "usr" / "include" / "libaio.h").unlink()
    config = write(tmp_path / "ds_config.json",
                   json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}))
    result = machine.run("--json", "--ds-config", str(config), CPATH="", C_INCLUDE_PATH="", CFLAGS="")
    assert result.returncode == EXIT_ENVIRONMENT
    assert findings(result)["MLS-BUILD-005"]["severity"] == "error"


def test_log_from_stdin(tmp_path: Path) -> None:
    result = DoctorMachine(tmp_path, None).run("--json", "--log", "-", stdin=MASK_ERROR.read_text())
    assert result.returncode == EXIT_ENVIRONMENT, result.stderr
    assert findings(result)["MLS-LOG-001"]["evidence"].startswith("log line 1: ")


def test_log_from_a_fifo(tmp_path: Path) -> None:
    """A FIFO cannot be read twice or seeked: the log is matched as it streams by."""
    fifo = tmp_path / "build.fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        with fifo.open("wb") as stream:
            stream.write(b"noise\n" * 1000 + MASK_ERROR.read_bytes())

    thread = threading.Thread(target=writer)
    thread.start()
    result = DoctorMachine(tmp_path, None).run("--json", "--log", str(fifo))
    thread.join(timeout=60)
    assert result.returncode == EXIT_ENVIRONMENT, result.stderr
    assert findings(result)["MLS-LOG-001"]["evidence"].startswith("log line 1001: ")


def test_binary_log_and_directory_as_log(tmp_path: Path) -> None:
    binary = tmp_path / "core.bin"
    binary.write_bytes(bytes(range(256)) * 1000)
    machine = DoctorMachine(tmp_path, None)
    result = machine.run("--json", "--log", str(binary))
    assert result.returncode == 0, result.stderr
    assert not [f for f in findings(result).values() if f["origin"] == "log"]
    directory = machine.run("--log", str(tmp_path))
    assert directory.returncode == 2
    assert "error: --log" in directory.stderr and "hint:" in directory.stderr
    assert "Traceback" not in directory.stderr


def test_stale_jit_lock_found_and_its_fix_works(tmp_path: Path) -> None:
    """The issue's hour of confusion: a killed JIT build left cpu_adam/lock; nothing owns it."""
    machine = DoctorMachine(tmp_path, RX7900, kfd_targets=(110000,))
    lock = machine.extensions / "cpu_adam" / "lock"
    write(lock)
    finding = findings(machine.run("--json"))["MLS-BUILD-006"]
    assert finding["severity"] == "error"
    assert finding["evidence"].startswith(f"{lock} (op cpu_adam, ")
    assert finding["fix"][0] == f"rm -f {lock}"
    subprocess.run(finding["fix"][0].split(), check=True)  # the fix, as printed (no shell needed)
    assert "MLS-BUILD-006" not in findings(machine.run("--json"))


def test_leaked_deepspeed_shm_segment_found_and_one_in_use_left_alone(tmp_path: Path) -> None:
    """Named and sized as a real 2-rank run left them (fixtures/doctor-shm). The fake root's proc has no
    processes, so only the kernel (a write lease) can tell that a live process maps rank 1's segment."""
    machine = DoctorMachine(tmp_path, None)
    shm = machine.root / "dev" / "shm"
    leaked, in_use = (shm / f"deepspeed_allreduce_buffer_0_127.0.0.1_29517_{rank}" for rank in (0, 1))
    for path in (leaked, in_use):
        with path.open("wb") as handle:
            handle.truncate(69206024)
    hold = ("import mmap, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); m = mmap.mmap(fd, 0); "
            "os.close(fd); print('mapped', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(in_use)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mapped"
        finding = findings(machine.run("--json"))["MLS-SYS-003"]
        assert finding["severity"] == "warning"
        assert finding["evidence"].startswith(f"1 DeepSpeed all-reduce segment(s) in {shm}, 66 MiB of shared memory")
        assert finding["fix"][0] == f"rm -f {leaked}"
        subprocess.run(finding["fix"][0].split(), check=True)
        assert in_use.exists() and not leaked.exists()
        assert "MLS-SYS-003" not in findings(machine.run("--json"))
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_environment_variables_deepspeed_and_torch_cannot_use(tmp_path: Path) -> None:
    machine = DoctorMachine(tmp_path, MI210X4, kfd_targets=(90010,) * 4)
    result = machine.run("--json", DS_ACCELERATOR="hip", DS_BUILD_OPS="1", PYTORCH_ROCM_ARCH="gfx90a;gfx1100",
                         HIP_VISIBLE_DEVICES="-1", ROCM_HOME=str(tmp_path / "no-rocm"))
    assert result.returncode == EXIT_ENVIRONMENT
    found = findings(result)
    assert "Value \"hip\" is not supported" in found["MLS-ENV-005"]["evidence"]
    assert found["MLS-ENV-006"]["severity"] == "warning"
    assert found["MLS-ARCH-003"]["evidence"] == "targets mix wave32 and wave64 GPUs: wave32: gfx1100; wave64: gfx90a"
    assert found["MLS-GPU-003"]["evidence"].startswith("HIP_VISIBLE_DEVICES='-1' selects none of the detected")
    assert found["MLS-ROCM-004"]["evidence"] == f"ROCM_HOME={tmp_path / 'no-rocm'} is not a directory"


def test_ds_config_read_like_deepspeed(tmp_path: Path) -> None:
    """hjson (comments, trailing commas) is accepted, a JSON array is a usage error with a hint."""
    machine = DoctorMachine(tmp_path, None)
    (machine.root / "usr" / "include" / "libaio.h").unlink()
    config = write(tmp_path / "ds_config.json",
                   '{\n  // ZeRO-Infinity\n'
                   '  "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",},},\n}\n')
    result = machine.run("--json", "--ds-config", str(config), CPATH="", C_INCLUDE_PATH="", CFLAGS="")
    assert findings(result)["MLS-BUILD-005"]["severity"] == "error", result.stderr
    write(config, "[1, 2]")
    refused = machine.run("--ds-config", str(config))
    assert refused.returncode == 2
    assert f"error: --ds-config {config}: the top level is a list" in refused.stderr
    assert "hint: " in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize(("hostfile_text", "says"), [
    ("node1 slots = 8\n", "hostfile:1: bad entry 'node1 slots = 8'"),
    ("node1 slots=1\nnode1 slots=2\n", "host node1 is listed twice"),
    ("# nobody\n", "no hosts in it"),
    ("node1 slots=0\n", "every host has slots=0"),
])
def test_hostfile_deepspeed_would_reject_is_exit_2_before_any_ssh(tmp_path: Path, hostfile_text: str,
                                                                  says: str) -> None:
    hostfile = write(tmp_path / "hostfile", hostfile_text)
    result = run_cli("doctor", "--hostfile", hostfile)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "hint:" in result.stderr and "Traceback" not in result.stderr


def test_hostfile_with_an_option_about_this_machine_is_exit_2(tmp_path: Path) -> None:
    hostfile = write(tmp_path / "hostfile", "node1 slots=1\n")
    result = DoctorMachine(tmp_path, None).run("--hostfile", str(hostfile), "--log", str(hostfile))
    assert result.returncode == 2
    assert "error: --hostfile checks the nodes over ssh; --log is about this machine" in result.stderr


def therock_machine(tmp: Path, devel: DevelState) -> DoctorMachine:
    """An RX 7900 XTX whose target is a stand-in TheRock venv (ROCm 7.14.0 as wheels, torch 2.14.1+rocm7.14.0),
    not activated: doctor is only given its interpreter. The fake machine's system ROCm 6.2.2 stays beside it."""
    venv = make_therock_venv(tmp / "venv", rocm_version="7.14.0", torch_version="2.14.1+rocm7.14.0",
                             hip_version="7.14.0-stand-in", arch_flags="gfx1100", devices=["gfx1100"],
                             rocminfo=RX7900.read_text(), devel=devel)
    return DoctorMachine(tmp / "machine", RX7900, kfd_targets=(110000,), python=venv.python)


def test_therock_venv_without_rocm_devel(tmp_path: Path) -> None:
    result = therock_machine(tmp_path, "absent").run("--json")
    assert result.returncode == EXIT_ENVIRONMENT, result.stderr
    document = json.loads(result.stdout)
    assert document["environment"]["rocm"]["kind"] == "wheels"
    assert document["environment"]["rocm_wheels"]["devel_installed"] is False
    found = findings(result)
    finding = found["MLS-ROCM-005"]
    assert finding["severity"] == "error"
    assert any('"rocm[devel]==7.14.0"' in step for step in finding["fix"])
    assert f"{tmp_path / 'venv' / 'bin' / 'rocm-sdk'} init" in finding["fix"]
    assert "MLS-ROCM-006" not in found and "MLS-ROCM-009" not in found
    shadow = found["MLS-ROCM-008"]  # the fake machine's system ROCm 6.2.2, named by its ROCM_PATH
    assert shadow["severity"] == "warning"
    assert "ROCM_PATH point(s) at it" in shadow["evidence"]


def test_therock_venv_with_rocm_devel_not_expanded(tmp_path: Path) -> None:
    result = therock_machine(tmp_path, "tarball").run("--json")
    found = findings(result)
    finding = found["MLS-ROCM-006"]
    assert finding["severity"] == "warning"
    assert finding["fix"][0] == f"{tmp_path / 'venv' / 'bin' / 'rocm-sdk'} init"
    assert "MLS-ROCM-005" not in found
    assert not list((tmp_path / "venv").glob("lib/python*/site-packages/_rocm_sdk_devel"))  # doctor expanded nothing
