"""`mlstack-ds build` / `install --dry-run` on a ROCm build host without a GPU (login node, image build).

The host is the build rehearsal's fake one (mlstack_ds/rehearsal/machine.py): the test venv's torch
reports a ROCm 6.4 build (start-up shim), rocminfo replays this CI machine's own "no GPU" output, and the
ROCm root is a directory. The CLI runs as a real subprocess; nothing is built (dry runs and refusals).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support.cli import CliResult, run_cli

from mlstack_ds.rehearsal.machine import FakeTorch, make_fake_host
from mlstack_ds.rehearsal.matrix import NO_GPU as NO_GPU_CAPTURE
from mlstack_ds.rehearsal.matrix import TORCH_WHEEL_ARCHS

NO_GPU = Path(__file__).resolve().parents[1] / "patches" / "fixtures" / NO_GPU_CAPTURE
WHEEL_ARCHS = " ".join(TORCH_WHEEL_ARCHS)


@pytest.fixture
def build_host(tmp_path: Path):
    def run(*args: str, **env: str) -> CliResult:
        host = make_fake_host(tmp_path / "host", rocminfo=NO_GPU.read_text(), rocminfo_exit=1, rocm_version="6.4.1",
                              hip_version="6.4.43482-0f2d60242", layout="opt",
                              torch=FakeTorch("2.13.0+rocm6.4", "6.4.43482-0f2d60242", WHEEL_ARCHS),
                              tree_mark=tmp_path / "nothing-is-built", user_env=env, base_environ=dict(os.environ))
        return run_cli(*args, "--python", sys.executable, base_env=host.environ, columns=200)
    return run


def test_build_plans_from_pytorch_rocm_arch_without_a_gpu(build_host) -> None:
    result = build_host("build", "--dry-run", "--json", PYTORCH_ROCM_ARCH="gfx90a;gfx942")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert (plan["platform"], plan["archs"], plan["wavefront"]) == ("rocm", ["gfx90a", "gfx942"], 64)
    assert plan["targets_source"] == "environment"
    assert plan["env"]["PYTORCH_ROCM_ARCH"] == "gfx90a;gfx942" and plan["env"]["DS_ROCM_WAVEFRONT_SIZE"] == "64"


def test_install_arch_flag_plans_without_a_gpu_and_says_where_targets_came_from(build_host) -> None:
    result = build_host("install", "--dry-run", "--arch", "gfx1100")
    assert result.returncode == 0, result.stderr
    assert "gfx1100 (wave32), from --arch" in result.stdout


@pytest.mark.parametrize(("args", "env", "code", "message"), [
    (("--arch", "gfx90a,gfx1100"), {}, 2, "targets mix wave32 and wave64 GPUs"),
    ((), {"PYTORCH_ROCM_ARCH": "sm_80"}, 2, "PYTORCH_ROCM_ARCH='sm_80': 'sm_80' is not a known GPU target"),
    (("--arch", "gfx1036"), {}, 3, "target gfx1036 is not in torch 2.13.0+rocm6.4's arch list"),
    ((), {}, 3, "no AMD GPU visible to build for"),
])
def test_bad_targets_get_one_line_and_their_exit_code(build_host, args, env, code, message) -> None:
    result = build_host("build", "--dry-run", *args, **env)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and message in lines[0], lines
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.stderr
