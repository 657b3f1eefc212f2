"""Nothing reported healthy that isn't, on the real installed DeepSpeed: a deleted op library, a pip-uninstalled
DeepSpeed, an unusable receipt; and a DeepSpeed someone else installed, replaced and then restored by rollback.
Every test leaves `installed_target` installed and intact for the tests after it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.e2e import Target
from support.target_env import DEEPSPEED_RUNTIME_DEPS, NO_OPS_FLAGS, TORCH_PIN, built_wheel, make_venv
from support.target_env import test_cache_dir as shared_test_cache  # not named test_*: pytest would collect it

from mlstack_ds.installed.integrity import check_files, parse_record
from mlstack_ds.installed.receipt import receipt_path

pytestmark = pytest.mark.slow

PLANNED_OPS = {"cpu_adam", "fused_adam", "deepspeed_shm_comm", "async_io", "pin_memory"}


def flat(text: str) -> str:
    """stderr with the console's line wrapping undone (long warnings wrap at the terminal width)."""
    return " ".join(text.split())


def doctor_findings(target: Target) -> tuple[int, dict[str, dict]]:
    result = target.cli("doctor", "--python", target.python, "--json")
    return result.returncode, {f["rule_id"]: f for f in json.loads(result.stdout)["findings"]}


def reinstall_says_why(target: Target, why: str) -> None:
    """Plain `install` (no --force) must not call the damaged install up to date: it reinstalls, says why."""
    result = target.install("--json", "--no-verify")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["action"] == "installed"
    assert "the installed DeepSpeed is not what was installed" in flat(result.stderr) and why in flat(result.stderr)
    assert target.status()["intact"] is True


def test_deleted_op_library_is_found_by_status_doctor_and_install(installed_target: Target) -> None:
    package = Path(installed_target.status()["installed"]["deepspeed_location"])
    (library,) = package.glob("ops/adam/cpu_adam_op*.so")
    library.unlink()
    edited = package / "runtime" / "engine.py"
    edited.write_text(edited.read_text() + "\n# edited after install\n")
    status = installed_target.status()
    assert status["intact"] is False
    files = status["files"]
    relative = str(library.relative_to(package.parent))
    assert files["missing"] == [relative] and files["modified"] == ["deepspeed/runtime/engine.py"]
    assert files["checked"] > 1000
    again = check_files(files["record"])  # the same check in this process (its time: scripts/bench.py integrity)
    assert again.missing == (relative,) and again.modified == ("deepspeed/runtime/engine.py",)
    (problem,) = status["problems"]
    assert problem.startswith(f"installed files changed: 1 missing ({relative}) and 1 modified "
                              "(deepspeed/runtime/engine.py) of the ")
    text = installed_target.cli("status", "--python", installed_target.python)
    assert text.returncode == 0 and "changed since install" in text.stdout and relative in text.stdout
    assert "mlstack-ds install --force" in flat(text.stderr)
    code, findings = doctor_findings(installed_target)
    assert code == 3 and relative in findings["MLS-DS-006"]["evidence"]
    assert findings["MLS-DS-006"]["fix"][0].startswith("mlstack-ds install --force")
    reinstall_says_why(installed_target, relative)
    assert library.is_file()
    assert "MLS-DS-006" not in doctor_findings(installed_target)[1]


def test_pip_uninstalled_deepspeed_under_the_receipt(installed_target: Target) -> None:
    removed = subprocess.run([installed_target.python, "-m", "pip", "uninstall", "--yes", "deepspeed"],
                             capture_output=True, text=True, timeout=600)
    assert removed.returncode == 0, removed.stderr
    status = installed_target.status()
    assert status["intact"] is False and status["receipt"] is not None
    assert status["problems"] == ["DeepSpeed 0.19.5 (the receipt's) is not installed any more: removed with pip?"]
    code, findings = doctor_findings(installed_target)
    assert code == 3 and "not installed any more" in findings["MLS-DS-006"]["evidence"]
    reinstall_says_why(installed_target, "not installed any more")


def test_unusable_receipt_is_refused_then_replaced_by_force(installed_target: Target) -> None:
    path = receipt_path(installed_target.venv)
    path.write_text('{"schema": 99}')
    for command in (["status"], ["rollback"], ["uninstall"], ["install", "--cache-dir", str(installed_target.cache)]):
        result = installed_target.cli(*command, "--python", installed_target.python)
        assert result.returncode == 7, (command, result.stderr[-2000:])
        assert f"error: receipt {path} is unusable: " in result.stderr and "schema 99" in result.stderr  # one line
        assert "Traceback" not in result.stderr and "hint: `mlstack-ds install --force`" in result.stderr
    code, findings = doctor_findings(installed_target)
    assert code == 3 and "schema 99" in findings["MLS-DS-006"]["evidence"]
    forced = installed_target.install("--force", "--no-verify")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert "is unusable" in flat(forced.stderr) and "it will be replaced" in flat(forced.stderr)
    assert installed_target.status()["intact"] is True
    # The environment's DeepSpeed had no usable receipt, so it was kept like a foreign one: rollback works.
    assert installed_target.status()["receipt"]["previous"]["deepspeed_version"] == "0.19.5"


def installed_files(python: Path) -> dict[str, str]:
    """path -> RECORD digest of the DeepSpeed installed in `python`'s environment, dist-info left out."""
    found = subprocess.run([str(python), "-c", "from importlib import metadata; d = metadata.distribution("
                            "'deepspeed'); print(next(d.locate_file(f) for f in d.files if f.name == 'RECORD'))"],
                           capture_output=True, text=True, timeout=300, check=True)
    record = Path(found.stdout.strip())
    return {e.path: e.digest or "" for e in parse_record(record.read_text())
            if e.digest and ".dist-info/" not in e.path}


def test_foreign_deepspeed_is_kept_and_restored_by_rollback(installed_target: Target, deepspeed_sdist: Path,
                                                            tmp_path: Path) -> None:
    """Plain `pip install --no-deps` of DeepSpeed 0.19.5 as pip builds it from the PyPI sdist
    (DS_BUILD_OPS=0; the wheel the no-ops target is made from), replaced by our install, then put back by
    `rollback` byte for byte, without the package index."""
    venv = make_venv(tmp_path / "foreign", TORCH_PIN, *DEEPSPEED_RUNTIME_DEPS)
    python = venv / "bin" / "python"
    wheel = built_wheel(deepspeed_sdist, NO_OPS_FLAGS, shared_test_cache())
    pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                         capture_output=True, text=True, timeout=1800)
    assert pip.returncode == 0, pip.stderr[-3000:]
    theirs = installed_files(python)
    target = Target(venv, installed_target.cache)
    assert target.status()["receipt"] is None

    result = target.install("--json", "--no-verify")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reusing cached wheel" in result.stderr  # same plan as installed_target
    warned = flat(result.stderr)
    assert f"DeepSpeed 0.19.5 in {venv} was not installed by mlstack-ds: replacing it" in warned
    assert "`mlstack-ds rollback` restores it from the copy kept in" in warned
    previous = json.loads(result.stdout)["receipt"]["previous"]
    kept = Path(previous["wheel"])
    assert previous["deepspeed_version"] == "0.19.5" and previous["receipt"] is None
    assert kept.parent == receipt_path(venv).parent / "previous" and kept.is_file()
    assert len(previous["wheel_sha256"]) == 64
    status = target.status()
    assert status["intact"] is True and set(status["installed"]["prebuilt_ops"]) == PLANNED_OPS
    assert installed_files(python) != theirs

    rolled = target.cli("rollback", "--python", str(python), "--json")
    assert rolled.returncode == 0, rolled.stderr[-3000:]
    document = json.loads(rolled.stdout)
    assert document["summary"].startswith("rolled back to DeepSpeed 0.19.5 (the one mlstack-ds had replaced")
    assert document["installed"]["deepspeed_version"] == "0.19.5" and document["installed"]["prebuilt_ops"] == []
    assert installed_files(python) == theirs  # every file as pip had installed it
    assert target.status()["receipt"] is None and not kept.parent.exists()
    imported = subprocess.run([str(python), "-c", "import deepspeed; print(deepspeed.__version__)"],
                              capture_output=True, text=True, timeout=300)
    assert imported.stdout.strip().splitlines()[-1] == "0.19.5", imported.stderr[-2000:]

    skipped = target.cli("uninstall", "--python", str(python))
    assert skipped.returncode == 0 and "Skipping: nothing installed by mlstack-ds" in flat(skipped.stderr)
    assert "DeepSpeed 0.19.5 there was installed by something else" in flat(skipped.stderr)
    assert installed_files(python) == theirs  # not ours: left alone

