"""Patch 0014: the `amd_specific` config section.

Config parsing runs DeepSpeed's real DeepSpeedConfig on both trees; the engine test runs
deepspeed.initialize and one training step on the CPU accelerator (1 process, gloo), where the section
is accepted and ignored with one info line. The ROCm branches (stream priority, pool reservation) need a
GPU; their decisions are pure functions, checked here with fake ROCm facts.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from support.ds_patch import run_python_in_tree

PROBES = Path(__file__).resolve().parent / "probes"
CASES = {
    "valid": {"rocm_mem_pool_init": True, "rocm_stream_priority": True},
    "empty": {},
    "typo": {"rocm_stream_priorty": True},
    "wrong-type": {"rocm_mem_pool_init": "yes"},
}
IGNORED_LINE = "amd_specific config section ignored: DeepSpeed is not running on ROCm (accelerator cpu)"


def probe_output(stdout: str, tag: str):
    line = next(ln for ln in stdout.splitlines() if ln.startswith(tag + " "))
    return json.loads(line.removeprefix(tag + " "))


@pytest.fixture(scope="module")
def parsed(ds_tree: tuple[str, Path]) -> tuple[str, dict, dict | None]:
    kind, tree = ds_tree
    result = run_python_in_tree(tree, PROBES / "amd_config_probe.py", json.dumps(CASES))
    assert result.ok, result.tail(40)
    return kind, probe_output(result.stdout, "RESULTS"), probe_output(result.stdout, "HELPERS")


def test_section_is_parsed_with_false_defaults(parsed):
    kind, results, _ = parsed
    if kind == "pristine":  # the section is not known at all
        assert results["valid"] == {"amd_config": None}
    else:
        assert results["valid"]["amd_config"] == {"rocm_mem_pool_init": True, "rocm_stream_priority": True}
        assert results["empty"]["amd_config"] == {"rocm_mem_pool_init": False, "rocm_stream_priority": False}


@pytest.mark.parametrize(("case", "key", "message"), [
    ("typo", "rocm_stream_priorty", "Extra inputs are not permitted"),
    ("wrong-type", "rocm_mem_pool_init", "Input should be a valid boolean"),
])
def test_bad_section_raises_config_error_naming_the_key(parsed, case, key, message):
    kind, results, _ = parsed
    if kind == "pristine":  # the bug: silently accepted, the user believes the option is on
        assert results[case] == {"amd_config": None}
    else:
        error = results[case]["error"]
        assert error.startswith("ValidationError: 1 validation error for DeepSpeedAMDConfig")
        assert f"\n{key}\n" in error
        assert message in error


def test_rocm_decisions_on_fake_facts(parsed):
    kind, _, helpers = parsed
    if kind == "pristine":
        assert helpers is None
        return
    assert helpers == {
        "rocm_on_cuda_accelerator": True,
        "cuda_torch": False,
        "rocm_torch_on_cpu_accelerator": False,
        "highest_priority": -1,
        "highest_priority_wide": -5,
        "reservation_overlap_bf16": 2 * (2 * 100_000_000 + 100_000_000),
        "reservation_no_overlap_fp32": 4 * (500_000_000 + 500_000_000),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_engine_on_cpu_accepts_section_and_logs_once(patched_tree, tmp_path_factory):
    """deepspeed.initialize + one ZeRO-2 step. The assertions fail on 0.19.5 (no info line; the typo is
    accepted), which test_bad_section_raises_config_error_naming_the_key shows without an engine."""
    cases = {"valid": CASES["valid"], "typo": CASES["typo"], "absent": None}
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()),
           # nothing is JIT-built (the probe turns the shm op off); a private cache in case that ever changes
           "TORCH_EXTENSIONS_DIR": str(tmp_path_factory.mktemp("torch-extensions"))}
    result = run_python_in_tree(patched_tree, PROBES / "amd_specific_probe.py", json.dumps(cases), env=env,
                                timeout=900)
    assert result.ok, result.tail(40)
    sections = result.stdout.split("CASE ")[1:]
    outcome = {section.split("\n", 1)[0]: section for section in sections}
    assert "\nINITIALIZED" in outcome["valid"]
    assert outcome["valid"].count(IGNORED_LINE) == 1
    assert "ERROR ValidationError: 1 validation error for DeepSpeedAMDConfig | rocm_stream_priorty" \
        in outcome["typo"]
    assert "\nINITIALIZED" in outcome["absent"]
    assert IGNORED_LINE not in outcome["absent"]
