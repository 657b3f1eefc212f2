"""`mlstack-ds detect` end to end on replayed machines: real subprocesses, fake ROCm tools on PATH."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from support.fakemachine import REAL, FakeMachine


def gpu_summary(report: dict) -> list[tuple]:
    return [(g["arch"], g["wavefront_size"], g["integrated"], g["source"]) for g in report["gpus"]]


def test_rx_7900_xtx(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", "rocminfo_gfx1100_rocm-issue-3949.txt")
    fake_machine.rocm_root({".info/version": "6.2.2-76\n"})
    report = fake_machine.detect_json("--python", str(bare_python))
    assert report["platform"] == "rocm"
    assert gpu_summary(report) == [("gfx1100", 32, False, "rocminfo")]
    assert report["gpus"][0]["name"] == "Radeon RX 7900 XTX"
    assert report["rocm"]["version"] == "6.2.2"
    assert report["rocm"]["version_source"].endswith(".info/version")
    assert report["torch"] is None
    assert "PyTorch is not installed in the target Python" in report["warnings"]


def test_rx_6900_xt_with_stray_libdrm_line(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", "rocminfo_gfx1030_rocm-issue-2773.txt")
    report = fake_machine.detect_json("--python", str(bare_python))
    assert gpu_summary(report) == [("gfx1030", 32, False, "rocminfo")]
    assert report["gpus"][0]["family"] == "RDNA2"


def test_four_mi210(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt")
    report = fake_machine.detect_json("--python", str(bare_python))
    assert gpu_summary(report) == [("gfx90a", 64, False, "rocminfo")] * 4
    assert {g["target_id"] for g in report["gpus"]} == {"gfx90a:sramecc+:xnack-"}
    assert [g["node"] for g in report["gpus"]] == [1, 2, 3, 4]


def test_780m_apu_only(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", "rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt")
    report = fake_machine.detect_json("--python", str(bare_python))
    assert gpu_summary(report) == [("gfx1103", 32, True, "rocminfo")]
    assert not any("integrated GPU visible" in w for w in report["warnings"])  # nothing to hide it for


def test_dgpu_next_to_igpu_warns_with_the_fix(fake_machine: FakeMachine, bare_python: Path) -> None:
    # Splice of two real captures: the RX 7900 XTX machine's agents plus the 780M APU's GPU agent, as
    # rocminfo lists them on a box with both (agent blocks are independent).
    dgpu = (REAL / "rocminfo_gfx1100_rocm-issue-3949.txt").read_text()
    apu = (REAL / "rocminfo_gfx1103-apu-780M_rocm-issue-3207.txt").read_text()
    igpu_block = "*******\nAgent 3" + apu.split("Agent 2", 1)[1]
    fake_machine.tool("rocminfo", text=dgpu + igpu_block)
    report = fake_machine.detect_json("--python", str(bare_python))
    assert [(g["arch"], g["integrated"]) for g in report["gpus"]] == [("gfx1100", False), ("gfx1103", True)]
    (warning,) = [w for w in report["warnings"] if "integrated GPU visible" in w]
    assert "HIP_VISIBLE_DEVICES=0" in warning and "ROCR_VISIBLE_DEVICES=0" in warning


def test_hsa_override_is_reported_as_spoofed(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", "rocminfo_680M-igpu_HSA_OVERRIDE-10.3.0-reports-gfx1030_rocm-issue-5225.txt")
    fake_machine.extra_env["HSA_OVERRIDE_GFX_VERSION"] = "10.3.0"
    report = fake_machine.detect_json("--python", str(bare_python))
    (gpu,) = report["gpus"]
    assert (gpu["arch"], gpu["spoofed"], gpu["integrated"]) == ("gfx1030", True, True)
    assert report["env"]["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"
    assert any("HSA_OVERRIDE_GFX_VERSION=10.3.0" in w and "spoofed" in w for w in report["warnings"])


def test_old_enumerator_with_gfx000_when_rocminfo_missing(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocm_agent_enumerator", "rocm_agent_enumerator_gfx1010-rx5700_rocm-4.2_fedora-blog.txt")
    report = fake_machine.detect_json("--python", str(bare_python))
    assert gpu_summary(report) == [("gfx1010", 32, False, "rocm_agent_enumerator")]


def test_amd_smi_fallback_when_rocminfo_fails(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", exit_code=1, stderr="hsa api call failure at: rocminfo.cc:1306")
    fake_machine.tool("amd-smi", "amd-smi_list_2xMI210_rocm-6.3.3_rocm-issue-5480.txt")
    fake_machine.tool("rocm-smi", "rocm-smi_showproductname_2xMI210-gfx90a_rocm-6.3.3_rocm-issue-5480.txt")
    report = fake_machine.detect_json("--python", str(bare_python))
    assert gpu_summary(report) == [("gfx90a", 64, False, "amd-smi+rocm-smi")] * 2
    assert [g["name"] for g in report["gpus"]] == ["Instinct MI210"] * 2
    assert any(w.startswith("rocminfo exited with 1: hsa api call failure") for w in report["warnings"])


def test_hanging_rocminfo_is_a_warning_not_a_hang(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", hang=True)
    enumerator_capture = "rocm_agent_enumerator_MI300X-gfx941-with-gfx000_rocminfo-docs-c6f7a17.txt"
    fake_machine.tool("rocm_agent_enumerator", enumerator_capture)
    report = fake_machine.detect_json("--python", str(bare_python), "--tool-timeout", "1")
    assert [g["arch"] for g in report["gpus"]] == ["gfx941"]
    # --tool-timeout is the stall time: a hung tool (no CPU, no reads) is stopped after it, not at the ceiling
    assert any("rocminfo made no progress for 1 s" in w for w in report["warnings"])


def test_garbage_output_gives_no_gpus_and_no_traceback(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", text="\x00\x01 Segmentation fault\nAgent \n: : :\n")
    result = fake_machine.run_cli("detect", "--json", "--python", str(bare_python))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert json.loads(result.stdout)["gpus"] == []


def test_rocm_version_sources_in_order(fake_machine: FakeMachine, bare_python: Path) -> None:
    # .info/version absent (as on some ROCm 7 installs): version-dev answers, then rocm_version.h.
    root = fake_machine.rocm_root({".info/version-dev": "6.3.3-74\n",
                                   "include/rocm-core/rocm_version.h": "#define ROCM_VERSION_MAJOR 6\n"
                                   "#define ROCM_VERSION_MINOR 4\n#define ROCM_VERSION_PATCH 1\n"})
    assert fake_machine.detect_json("--python", str(bare_python))["rocm"] == {
        "root": str(root), "version": "6.3.3", "version_source": f"{root}/.info/version-dev",
        "raw_version": "6.3.3", "kind": "system"}
    (root / ".info" / "version-dev").unlink()
    assert fake_machine.detect_json("--python", str(bare_python))["rocm"]["version"] == "6.4.1"


def test_hipconfig_under_rocm_root_bin(fake_machine: FakeMachine, bare_python: Path) -> None:
    root = fake_machine.rocm_root()
    hip_version = (REAL / "hipconfig_rocm-6.1.1_gfx1103-apu_rocm-issue-3207.txt").read_text().split(":")[1].split()[0]
    (root / "bin").mkdir()
    fake = fake_machine.tool("hipconfig", text=hip_version)
    fake.rename(root / "bin" / "hipconfig")  # not on PATH: found under $ROCM_PATH/bin
    rocm = fake_machine.detect_json("--python", str(bare_python))["rocm"]
    assert (rocm["version"], rocm["version_source"], rocm["raw_version"]) == (
        "6.1", "hipconfig --version", "6.1.40092-038397aaa")


def test_no_rocm_at_all_and_cpu_torch(fake_machine: FakeMachine) -> None:
    """This machine: no ROCm, no GPU; the test interpreter has the CPU torch."""
    report = fake_machine.detect_json("--python", sys.executable)
    assert report["platform"] == "cpu"
    assert report["rocm"] is None and report["gpus"] == []
    torch = report["torch"]
    assert torch["build"] == "cpu" and torch["hip"] is None and torch["cuda"] is None
    assert re.match(r"2\.13\.0", torch["version"]), torch["version"]
    assert report["python"]["executable"] == sys.executable
    assert set(report) >= {"platform", "rocm", "gpus", "torch", "python", "env", "warnings"}


def test_nvidia_smi_gives_cuda(fake_machine: FakeMachine, bare_python: Path) -> None:
    # Output format of `nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader,nounits`.
    fake_machine.tool("nvidia-smi", text="NVIDIA H100 80GB HBM3, 9.0, 81559\n")
    report = fake_machine.detect_json("--python", str(bare_python))
    assert report["platform"] == "cuda"
    assert [(g["vendor"], g["arch"]) for g in report["gpus"]] == [("nvidia", "sm_90")]


def test_human_output_lists_gpus(fake_machine: FakeMachine, bare_python: Path) -> None:
    fake_machine.tool("rocminfo", "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt")
    result = fake_machine.run_cli("detect", "--python", str(bare_python))
    assert result.returncode == 0
    assert result.stdout.count("AMD Instinct MI210") == 4 and "platform: rocm" in result.stdout


@pytest.mark.parametrize("bad", ["/nonexistent/python", "/etc"])
def test_bad_python_is_a_usage_error(fake_machine: FakeMachine, bad: str) -> None:
    result = fake_machine.run_cli("detect", "--python", bad)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: --python") and "hint:" in result.stderr


def test_a_hip_version_past_rocm_7_2_is_not_reported_as_the_rocm_release(fake_machine: FakeMachine,
                                                                       bare_python: Path) -> None:
    """ROCm 10.1's hipconfig says HIP 7.16: reporting "ROCm 7.16" would gate builds on a release that never was."""
    fake_machine.tool("hipconfig", text="7.16.26321-abcdef012")
    report = fake_machine.detect_json("--python", str(bare_python))
    assert report["rocm"] == {"root": None, "version": None, "version_source": "hipconfig --version",
                              "raw_version": "7.16.26321-abcdef012", "kind": "system"}
    assert any("HIP 7.16, which does not name the ROCm release" in w for w in report["warnings"])


@pytest.mark.parametrize("torch_body", ["raise ImportError('libamdhip64.so.6: cannot open shared object file')",
                                        "import os\nos.kill(os.getpid(), 9)"])
def test_a_torch_that_is_there_but_does_not_import_is_not_called_missing(
        fake_machine: FakeMachine, tmp_path: Path, torch_body: str) -> None:
    """A failed or stopped import is not "PyTorch is not installed" (what install said when a busy machine
    made the probe's import outlast its limit): detect, install and doctor say what happened instead."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(torch_body + "\n")
    fake_machine.extra_env["PYTHONPATH"] = str(tmp_path)
    report = fake_machine.detect_json("--python", sys.executable)
    assert report["torch"] is None and report["torch_problem"]
    assert "PyTorch is not installed in the target Python" not in report["warnings"]
    assert report["torch_problem"] in report["warnings"]
    planned = fake_machine.run_cli("install", "--dry-run", "--python", sys.executable)
    assert planned.returncode == 3
    assert planned.stderr.startswith(f"error: PyTorch could not be imported in {sys.executable}: "), planned.stderr
    assert "not installed" not in planned.stderr
    doctor = fake_machine.run_cli("doctor", "--python", sys.executable, "--json")
    (finding,) = [f for f in doctor.json["findings"] if f["rule_id"] == "MLS-TORCH-001"]
    assert report["torch_problem"] in finding["evidence"]
