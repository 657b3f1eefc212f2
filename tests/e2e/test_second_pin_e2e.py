"""The second pin, DeepSpeed 0.19.8, installed and verified for real on this CPU machine: the same cold
`mlstack-ds install` as the default pin's, chosen by version (`--deepspeed-version 0.19.8`). Its series
drops the backports 0.19.8 already has (0001-0005), so the ZeRO-3 checks passing here is upstream's own
fix at work.

It is also the air-gapped install (issue 41): `mlstack-ds bundle` first, then `install --offline DIR`, built,
installed and verified in a network namespace with no route out (support/cold_install.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.bundles import ROUTES_LINE
from support.cold_install import BackgroundInstall
from support.e2e import FIRST_USE, NEXT_PIN_CPU_SKIPS, Target

from mlstack_ds.patches.series import read_series_names
from mlstack_ds.recipe import find_recipe

pytestmark = pytest.mark.slow

# 0.19.8's CPU accelerator has builders for cpu_adagrad and cpu_lion (recipes/deepspeed-0.19.8.toml).
NEXT_PLANNED_OPS = {"cpu_adam", "fused_adam", "deepspeed_shm_comm", "async_io", "pin_memory", "cpu_adagrad",
                    "cpu_lion"}
# What the CPU platform does not build, so verify skips it (with the receipt as the reason), and untested_ops.
NOT_BUILT_ON_CPU = NEXT_PIN_CPU_SKIPS


def test_second_pin_installs_its_own_series_and_prebuilds_its_ops(installed_next_target: tuple[Target, dict],
                                                                  tmp_path: Path) -> None:
    target, document = installed_next_target
    assert document["action"] == "installed"
    status = target.status()
    assert status["intact"] is True
    receipt = status["receipt"]
    recipe = find_recipe("deepspeed-0.19.8")
    assert receipt["recipe"] == "deepspeed-0.19.8" and receipt["deepspeed_version"] == "0.19.8"
    assert receipt["source_pin"] == recipe.sdist.sha256  # type: ignore[union-attr]
    assert [patch["name"] for patch in receipt["patches"]] == read_series_names(recipe.series_path)
    assert not any(patch["name"].startswith(("0001", "0002", "0003")) for patch in receipt["patches"])
    assert set(receipt["ops"]) == NEXT_PLANNED_OPS == set(status["installed"]["prebuilt_ops"])
    blocker = tmp_path / "no-jit"
    blocker.write_text("JIT would have to create a directory here")
    loaded = subprocess.run([target.python, "-c", FIRST_USE, *sorted(NEXT_PLANNED_OPS)], capture_output=True,
                            text=True, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(blocker)}, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert set(json.loads(loaded.stdout.strip().splitlines()[-1])) == NEXT_PLANNED_OPS


def test_second_pin_passes_the_whole_verify_suite(installed_next_target: tuple[Target, dict]) -> None:
    _, document = installed_next_target
    report = document["verify"]
    assert report["ok"] is True and report["world_size"] == 2
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    skipped = {name for name, status in statuses.items() if status == "skip"}
    assert skipped == NOT_BUILT_ON_CPU, statuses
    # The checks users rely on most, by name: a suite that lost them would still be "ok".
    for name in ("zero1", "zero2", "zero3", "zero3_offload", "checkpoint", "nvme_offload", "pipeline",
                 "activation_checkpointing", "hf_trainer", "accelerate_deepspeed", "lora_zero3", "lora_zero3_peft",
                 "amd_specific"):
        assert statuses[name] == "pass", (name, statuses)


def test_second_pin_was_built_installed_and_verified_from_its_bundle_with_no_network(
        air_gapped_next_install: BackgroundInstall, installed_next_target: tuple[Target, dict]) -> None:
    """The air-gapped machine's whole install: the bundle is the only source (pip held to it), the build ran
    from the bundle's sdist (a cold build, not a cached wheel), and it all happened where no route leads out."""
    install = air_gapped_next_install
    assert install.air_gap is not None and install.bundle is not None
    bundle = install.air_gap.directory
    manifest = install.bundle.json["manifest"]
    recipe = find_recipe("deepspeed-0.19.8")
    assert manifest["recipe"] == recipe.name and manifest["sdist_sha256"] == recipe.sdist.sha256
    _, document = installed_next_target
    assert document["plan"]["source"] == f"offline:{bundle}"
    assert document["receipt"]["source"] == f"offline:{bundle}"
    assert document["verify"]["ok"] is True
    stderr = install.wait().stderr
    # Built here from the bundle's sdist (a cold cache), not a cached wheel; a local run that reuses its cache
    # (MLSTACK_E2E_CACHE) may find the wheel of an earlier run instead.
    assert "built in " in stderr or os.environ.get("MLSTACK_E2E_CACHE"), stderr[-3000:]
    if not install.isolated:
        pytest.skip("this machine cannot make a network namespace (unshare -n): the install ran --offline "
                    "with the network there")
    assert f"{ROUTES_LINE} 0" in stderr.splitlines(), stderr[:2000]
