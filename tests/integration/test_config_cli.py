"""`mlstack-ds config` end to end: the CLI as a subprocess on a replayed RX 7900 XTX, DeepSpeed for real.

The machine is `rocminfo_gfx1100_rocm-issue-3949.txt`, a real capture of ONE RX 7900 XTX (gfx1100,
24 GiB): no 2× capture exists in tests/fixtures/real, so the guide's 2-GPU setup is that card with
`--gpus 2` (the VRAM and the arch still come from the capture). The target is `no_ops_venv`: DeepSpeed
0.19.5 from its sdist, whose estimators and config parser answer for real.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import start_cli
from support.fakemachine import FakeMachine
from support.target_env import TargetVenv

import mlstack_ds
from mlstack_ds.config.model import PRESETS

GiB = 2**30
CAPTURE = "rocminfo_gfx1100_rocm-issue-3949.txt"
GUIDE_SIZES = ("350m", "1.3b", "6.7b", "13b")
# The guide's setup: 2 cards; host RAM given so the plan does not depend on the test machine's.
GUIDE_ARGS = ("--gpus", "2", "--ram", "256GiB")
PACKAGE_PARENT = str(Path(mlstack_ds.__file__).resolve().parents[1])


def rx_7900_xtx(root: Path) -> FakeMachine:
    machine = FakeMachine(root)
    machine.tool("rocminfo", CAPTURE)
    machine.extra_env["PYTHONPATH"] = PACKAGE_PARENT  # the mlstack_ds under test, whichever checkout
    return machine


@pytest.fixture(scope="session")
def guide_plans(tmp_path_factory: pytest.TempPathFactory, no_ops_venv: TargetVenv) -> dict[str, dict]:
    """`config SIZE --gpus 2 --json` for the guide's four sizes, run once for the module's tests."""
    machine = rx_7900_xtx(tmp_path_factory.mktemp("rx7900xtx"))
    # Started together: each is one interpreter start importing DeepSpeed (seconds of CPU, mostly waiting
    # for imports), so two cores finish four in about the time of two.
    running = {size: start_cli("config", size, *GUIDE_ARGS, "--python", no_ops_venv.python, "--json",
                               base_env=machine.environ())
               for size in GUIDE_SIZES}
    plans = {}
    for size, proc in running.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode in (0, 9), stderr
        assert "Traceback" not in stderr
        plans[size] = {"rc": proc.returncode, **json.loads(stdout)}
    return plans


def deepspeed_tables(python: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """What DeepSpeed prints to users for each guide size on 1 node × 2 GPUs (its `_all_cold` functions):
    options -> (per CPU GiB, per GPU GiB), as printed (two decimals)."""
    script = "\n".join(
        ["from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold as z2",
         "from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold as z3"]
        + [f"print('SIZE {name}'); z2({m.params}, 2, 1); z3({m.params}, {m.largest_layer_params}, 2, 1)"
           for name, m in PRESETS.items()])
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=True,
                         env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"}).stdout
    tables: dict[str, dict[str, tuple[float, float]]] = {}
    size = ""
    for line in out.splitlines():
        if line.startswith("SIZE "):
            size = line.split()[1]
            tables[size] = {}
        row = re.match(r"\s*([0-9.]+)GB \|\s*([0-9.]+)GB \| (.*)", line)
        if row:
            # Python 3.11+ formats DeepSpeed's f"{OffloadDeviceEnum.cpu:4}" as the member's name.
            options = " ".join(row.group(3).replace("OffloadDeviceEnum.cpu", "cpu").split()).replace(" ,", ",")
            tables[size].setdefault(options, (float(row.group(1)), float(row.group(2))))
    return tables


def options_of(candidate: dict) -> str:
    """DeepSpeed's printed `Options` for one of our placements (ZeRO-3 rows with zero_init=1)."""
    cpu = lambda on: "cpu" if on else "none"  # noqa: E731
    if candidate["stage"] == 2:
        return f"offload_optimizer={cpu(candidate['offload_optimizer'])}"
    return (f"offload_param={cpu(candidate['offload_param'])}, "
            f"offload_optimizer={cpu(candidate['offload_optimizer'])}, zero_init=1")


def test_guide_sizes_follow_deepspeeds_estimators(guide_plans: dict[str, dict], no_ops_venv: TargetVenv) -> None:
    tables = deepspeed_tables(no_ops_venv.python)
    for size, plan in guide_plans.items():
        candidates = plan["candidates"] if plan["rc"] == 0 else plan["error"]["candidates"]
        for candidate in candidates:
            cpu, gpu = tables[size][options_of(candidate)]
            assert round(candidate["model_states_bytes"] / GiB, 2) == gpu, (size, candidate)
            assert round(candidate["cpu_bytes"] / GiB, 2) == cpu, (size, candidate)
        # The choice is the first placement that fits, in the documented order.
        fitting = [c for c in candidates if c["gpu_bytes"] <= c["gpu_limit_bytes"] and c["cpu_bytes"] <= c[
            "ram_limit_bytes"]]
        if plan["rc"] == 0:
            zero = plan["config"]["zero_optimization"]
            first = fitting[0]
            assert (zero["stage"], "offload_optimizer" in zero, "offload_param" in zero) == (
                first["stage"], first["offload_optimizer"], first["offload_param"]), size
        else:
            assert not fitting, size


def test_guide_sizes_choices_on_two_rx_7900_xtx(guide_plans: dict[str, dict]) -> None:
    """What the numbers give for the guide's table (docs/config.md sets them beside it)."""
    def placement(size: str) -> tuple | int:
        plan = guide_plans[size]
        if plan["rc"]:
            return plan["rc"]
        zero = plan["config"]["zero_optimization"]
        return zero["stage"], "offload_optimizer" in zero, "offload_param" in zero

    assert placement("350m") == (2, False, False)
    assert placement("1.3b") == (2, False, False)
    assert placement("6.7b") == (3, True, False)  # the guide: ZeRO-2 without offload; ≈ 78 GiB per GPU
    assert placement("13b") == 9  # the guide: ZeRO-3 in 24.8 GB; DeepSpeed: ≥ 289 GiB of host RAM to offload
    for size in GUIDE_SIZES[:3]:
        plan = guide_plans[size]
        assert plan["hardware"]["arch"] == "gfx1100"
        assert plan["hardware"]["vram_bytes"] == 25_753_026_560  # the capture's 25149440 KB pool
        assert plan["hardware"]["world_size"] == 2 and plan["validated"] is True
        assert plan["config"]["bf16"] == {"enabled": True}  # RDNA3 computes bf16
        assert plan["config"]["zero_optimization"]["reduce_bucket_size"] == 100_000_000  # patch 0013's rule
        assert plan["config"]["train_batch_size"] == 2
        assert "amd_specific" not in plan["config"]  # no_ops_venv is unpatched upstream DeepSpeed
    refusal = guide_plans["13b"]["error"]
    assert refusal["exit_code"] == 9 and "does not fit on 2 × 24.0 GiB" in refusal["message"]
    assert refusal["inputs"]["ram_bytes"] == {"value": 256 * GiB, "source": "--ram"}  # a refusal says its inputs too
    assert refusal["inputs"]["vram_bytes"]["source"] == "detected (the smallest GPU's)"


def test_13b_on_one_16_gib_card_gets_offload_and_explain_says_why(tmp_path: Path, no_ops_venv: TargetVenv) -> None:
    """13B on one 16 GiB card: at 2048 tokens its activations alone (≈ 14 GiB) refuse it, like 13B on two
    cards in the guide's table (guide_plans); at 512 tokens with enough host RAM, ZeRO-3 with everything
    offloaded fits, and what is written is what fits. Also: --out writes the file, --explain goes to stderr."""
    machine = rx_7900_xtx(tmp_path / "m")
    out = tmp_path / "ds_config.json"
    result = machine.run_cli("config", "13b", "--gpus", "1", "--vram", "16GiB", "--seq-len", "512", "--ram", "1TiB",
                             "--out", str(out), "--explain", "--json", "--python", str(no_ops_venv.python))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    chosen = next(c for c in document["candidates"] if c["fits"])
    assert chosen["gpu_bytes"] <= 16 * GiB * 0.85
    assert not any(c["fits"] for c in document["candidates"][:4])
    zero = document["config"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    assert json.loads(out.read_text()) == document["config"]
    assert "zero_optimization.stage = 3: ZeRO-3, optimizer and parameters offloaded" in result.stderr
    assert "bf16.enabled = true: gfx1100 (RDNA3) computes bf16 natively" in result.stderr
    assert f"wrote {out}" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("{model}",), "not JSON"),
    (("{dir}",), "cannot read it"),
    (("350m", "--vram", "0"), "--vram 0: must be greater than zero"),
    (("350m", "--ram", "-16GB"), "--ram -16GB: must be greater than zero"),
    (("350m", "--gpus", "0"), "--gpus 0: must be greater than zero"),
    (("350m", "--micro-batch", "0"), "--micro-batch 0"),
    (("--params", "-7e9", "--hidden", "4096", "--layers", "32"), "--params -7e9"),
    (("350m",), "no GPU visible"),
])
def test_bad_input_is_one_error_line_with_a_hint(tmp_path: Path, bare_python: Path, args: tuple[str, ...],
                                                  message: str) -> None:
    machine = FakeMachine(tmp_path / "no-gpu")  # no ROCm tools at all
    machine.extra_env["PYTHONPATH"] = PACKAGE_PARENT
    model = tmp_path / "config.json"
    model.write_text('{"hidden_size": 4096,')
    (tmp_path / "model-dir").mkdir()
    (tmp_path / "model-dir" / "config.json").mkdir()
    argv = [a.format(model=model, dir=tmp_path / "model-dir") for a in args]
    result = machine.run_cli("config", *argv, "--python", str(bare_python))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error:") and lines[1].startswith("hint:"), result.stderr
    assert message in lines[0]
    assert result.stdout == ""


def test_a_target_without_deepspeed_is_an_environment_error(tmp_path: Path, bare_python: Path) -> None:
    machine = rx_7900_xtx(tmp_path)
    result = machine.run_cli("config", "350m", "--gpus", "2", "--python", str(bare_python), "--json")
    assert result.returncode == 3, result.stderr
    assert result.stderr.splitlines()[-2].startswith(f"error: DeepSpeed cannot be imported in {bare_python}")
    assert "mlstack-ds install" in result.stderr.splitlines()[-1]
    assert json.loads(result.stdout)["error"]["exit_code"] == 3


def test_hf_config_is_written_as_validated_by_a_target_without_transformers(tmp_path: Path,
                                                                           no_ops_venv: TargetVenv) -> None:
    """Issue 28's command: `--hf` on a target without transformers. The target parses the "auto" values as
    DeepSpeed's defaults on its own copy; what is written keeps every "auto" and is the config validated."""
    machine = rx_7900_xtx(tmp_path / "m")
    out = tmp_path / "ds_config.json"
    result = machine.run_cli("config", "1.3b", "--gpus", "2", "--vram", "24GiB", "--hf", "--out", str(out), "--json",
                             "--python", str(no_ops_venv.python))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    config = json.loads(out.read_text())
    assert config == document["config"]
    assert config["bf16"]["enabled"] == "auto" and config["zero_optimization"]["reduce_bucket_size"] == "auto"
    assert set(config["optimizer"]["params"].values()) == {"auto"}
    assert "transformers is not installed" in document["hf"]


# Memory and CPU load for a bounded time (argv[1] seconds, or until killed): allocates and frees 1 GiB in
# 256 MiB blocks (each page written, so MemAvailable really moves) and spins a core meanwhile; prints
# the lowest and highest MemAvailable it saw, proof that the load was there.
LOAD = r"""
import json, signal, sys, time
def available():
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
end, seen, blocks = time.monotonic() + float(sys.argv[1]), [available()], []
try:
    while time.monotonic() < end:
        blocks.append(b"\x01" * (256 << 20))
        sum(range(200_000))
        if len(blocks) == 4:
            seen.append(available())
            blocks.clear()
            seen.append(available())
finally:
    print(json.dumps([min(seen), max(seen)]), flush=True)
"""


def test_same_inputs_same_answer_under_memory_and_cpu_load(tmp_path: Path, no_ops_venv: TargetVenv) -> None:
    """Issue 28: the issue's command (host RAM measured: no --ram) run three times at once while another
    process allocates and frees 1 GiB and spins a core. MemAvailable moves; the plan reads MemTotal, once,
    so every run writes the same config and reports the same inputs."""
    machine = rx_7900_xtx(tmp_path / "m")
    load = subprocess.Popen([sys.executable, "-c", LOAD, "60"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1)  # the first gigabyte is in place before the first run reads anything
        runs = [start_cli("config", "1.3b", "--gpus", "2", "--vram", "24GiB", "--hf", "--out", tmp_path / f"{n}.json",
                          "--json", "--python", no_ops_venv.python, base_env=machine.environ())
                for n in range(3)]
        results = [(proc.communicate(timeout=300), proc.returncode) for proc in runs]
    finally:
        load.terminate()  # bounded anyway: the loader stops itself after 60 s
        low, high = json.loads(load.communicate(timeout=30)[0])
    assert high - low >= 512 << 20, (low, high)  # the load moved MemAvailable by half a gigabyte or more
    documents = []
    for n, ((stdout, stderr), rc) in enumerate(results):
        assert rc == 0, stderr
        document = json.loads(stdout)
        assert json.loads((tmp_path / f"{n}.json").read_text()) == document.pop("config")
        assert document.pop("out") == str(tmp_path / f"{n}.json")
        documents.append((document, [line for line in stderr.splitlines() if not line.startswith("wrote ")]))
    assert documents[1] == documents[0] and documents[2] == documents[0]
    inputs = documents[0][0]["inputs"]
    assert inputs["ram_measured"] is True and inputs["ram_bytes"]["source"] == "measured: /proc/meminfo MemTotal"
    assert inputs["vram_bytes"] == {"value": 24 * GiB, "source": "--vram"}
    assert inputs["amd_specific"]["value"] is False  # no_ops_venv is upstream DeepSpeed: no patch 0014
    assert any("without --ram the choice depends on this machine's RAM" in line for line in documents[0][1])
