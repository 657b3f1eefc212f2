"""`install --cached-wheel KEY` (what `install --hostfile` runs on each node): the head's wheel or nothing.

The target is the test venv's own interpreter (torch 2.13.0 CPU, no DeepSpeed): every refusal here comes
before the environment is touched, which the last assertion checks.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import pytest
from support.cli import run_cli

cli = partial(run_cli, columns=200)  # the CLI as these tests run it


@pytest.fixture(scope="module")
def plan() -> dict:
    result = cli("install", "--python", sys.executable, "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["plan"]


def test_a_node_without_the_heads_wheel_refuses_to_build(plan: dict, tmp_path: Path) -> None:
    result = cli("install", "--python", sys.executable, "--cache-dir", tmp_path, "--cached-wheel",
                 plan["cache_key"], "--no-verify", "--json")
    assert result.returncode == 7, result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["message"] == f"no cached wheel for plan {plan['cache_key']} in {tmp_path}"
    assert not (tmp_path / "logs").exists()  # no build was started


def test_a_node_whose_plan_differs_names_the_difference(plan: dict, tmp_path: Path) -> None:
    head_key = "f" * 24
    head_plan = {**plan, "cache_key": head_key, "torch_version": "2.12.0",
                 "env": {**plan["env"], "DS_BUILD_CPU_ADAM": "0", "MAX_JOBS": "96"}}
    entry = tmp_path / "wheels" / head_key
    entry.mkdir(parents=True)
    (entry / "build.json").write_text(json.dumps({"plan": head_plan}))
    (entry / "deepspeed-0.19.5-cp311-cp311-linux_x86_64.whl").write_bytes(b"not used")
    result = cli("install", "--python", sys.executable, "--cache-dir", tmp_path, "--cached-wheel", head_key,
                 "--no-verify", "--json")
    assert result.returncode == 7, result.stderr
    message = json.loads(result.stdout)["error"]["message"]
    assert message == (f"this node plans another build than the head ({plan['cache_key']}, not {head_key}): "
                       f'env DS_BUILD_CPU_ADAM: "1" here, "0" on the head; '
                       f'torch_version: "{plan["torch_version"]}" here, "2.12.0" on the head')
    status = json.loads(cli("status", "--python", sys.executable, "--json").stdout)
    assert status["receipt"] is None and status["installed"]["deepspeed_version"] is None


def test_cached_wheel_is_not_for_the_user_with_a_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\n")
    result = cli("install", "--hostfile", hostfile, "--cached-wheel", "k", "--json")
    assert result.returncode == 2
    message = json.loads(result.stdout)["error"]["message"]
    assert message == "--cached-wheel is what install --hostfile passes to each node"
