"""scripts/install_deepspeed.sh --offline BUNDLE: the wrapper on an air-gapped machine (issue 41). The tool itself,
and everything pip installs, comes from the bundle; the run is made in a network namespace with no network
(`unshare -n`), so anything that reached for the index, the repository's build backend or a URL would fail.
No DeepSpeed is built (`-- --dry-run`: the plan, from the bundle's sdist)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.bundles import no_network
from support.cli import WRAPPER, run_wrapper
from support.fakepkg import FakePackageHost
from support.target_env import overlay_venv

Bundle = tuple[Path, dict[str, Any]]


def ensurepip_setuptools() -> Path | None:
    """The setuptools this Python's ensurepip puts into a new venv (65.5 on 3.11: no bdist_wheel without the
    `wheel` package); None from 3.12, whose ensurepip has none."""
    import ensurepip

    found = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("setuptools-*.whl"))
    return found[0] if found else None


def tool_entry(manifest: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [f for f in manifest["files"] if f["kind"] == "tool" and f["project"] == "mlstack-ds"]
    return entry


@pytest.mark.slow
def test_offline_installs_the_tool_from_the_bundle_with_no_network(made_bundle: Bundle, tmp_path: Path) -> None:
    to, manifest = made_bundle
    venv = overlay_venv(tmp_path / "venv", pip=False)  # sees the test venv's CPU torch
    entry = tool_entry(manifest)
    # mlstack-ds of the same version installed from elsewhere (pip would keep it); and the venv's own setuptools
    # as ensurepip leaves it on 3.11 (65.5: the wrapper must add `wheel`).
    (tmp_path / "elsewhere").mkdir()
    elsewhere_wheel = Path(shutil.copy2(to / entry["path"], tmp_path / "elsewhere"))
    old_setuptools = ensurepip_setuptools()
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    elsewhere_wheel, *([old_setuptools] if old_setuptools else [])], check=True, capture_output=True,
                   timeout=300)
    pip_target = tmp_path / "pip-target"
    # The user's pip settings are dropped: PIP_TARGET would put the tool outside the venv.
    done = subprocess.run([*no_network(), "bash", str(WRAPPER), "--venv", str(venv), "--offline", str(to), "--",
                           "--dry-run", "--json"], capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "COLUMNS": "200", "PIP_TARGET": str(pip_target)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not pip_target.exists()
    assert json.loads(done.stdout)["plan"]["source"] == f"offline:{to}"
    (dist_info,) = venv.glob("lib/python3*/site-packages/mlstack_ds-*.dist-info")
    origin = json.loads((dist_info / "direct_url.json").read_text())
    assert origin["url"] == (to / entry["path"]).as_uri(), origin
    assert origin["archive_info"]["hashes"]["sha256"] == entry["sha256"], origin
    assert not list(venv.glob("lib/python3*/site-packages/torch*")), "torch is the test venv's, never installed"
    if old_setuptools is not None:  # from the bundle: nothing else was reachable
        assert f"==> installing wheel into {venv} from {to}" in done.stderr, done.stderr[-3000:]
        assert list(venv.glob("lib/python3*/site-packages/wheel-*.dist-info"))


@pytest.mark.slow
def test_offline_refuses_a_bundle_that_lacks_what_the_run_needs(made_bundle: Bundle, tmp_path: Path) -> None:
    """Read before any venv is made (by the Python that makes it): the clients of a bundle made without them, the
    tool's wheel altered, a bundle for another Python."""
    to, manifest = made_bundle
    venv = tmp_path / "venv"
    python = {"PYTHON": sys.executable}
    clients = run_wrapper("--venv", venv, "--offline", to, "--with-clients", "--", "--dry-run", env=python,
                          timeout=300)
    assert clients.returncode == 7, clients.stderr[-2000:]
    error, hint = clients.one_error()
    assert f"--with-clients: the bundle in {to} was made without verify's clients" in error
    assert f"mlstack-ds bundle --to {to} --python-version" in hint and "--with-clients" in hint
    assert not venv.exists()

    altered = tmp_path / "altered"
    entry = tool_entry(manifest)
    (altered / entry["path"]).parent.mkdir(parents=True)
    shutil.copy2(to / "bundle.json", altered / "bundle.json")
    (altered / entry["path"]).write_bytes((to / entry["path"]).read_bytes() + b"\0")
    modified = run_wrapper("--venv", venv, "--offline", altered, "--", "--dry-run", env=python, timeout=300)
    assert modified.returncode == 7, modified.stderr[-2000:]
    error, hint = modified.one_error()
    assert f"holds a modified {Path(entry['path']).name}" in error and f"mlstack-ds bundle --to {altered}" in hint
    assert not venv.exists()

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    other = "3.12" if here != "3.12" else "3.11"
    document = json.loads((to / "bundle.json").read_text())
    document["target"]["python_version"] = other
    (altered / "bundle.json").write_text(json.dumps(document))
    another = run_wrapper("--venv", venv, "--offline", altered, "--", "--dry-run", env=python, timeout=300)
    assert another.returncode == 7, another.stderr[-2000:]
    error, hint = another.one_error()
    assert f"was made for Python {other}; this venv has Python {here}" in error
    assert f"mlstack-ds bundle --to {altered}-py{here} --python-version {here}" in hint
    assert not venv.exists()


@pytest.mark.parametrize(("args", "code", "message"), [
    ([], 2, "is not a bundle (no bundle.json)"),
    (["--with-torch", "cpu"], 2, "--with-torch cpu cannot be used with --offline: a bundle never holds PyTorch"),
])
def test_offline_refuses_before_anything_is_installed(tmp_path: Path, args: list[str], code: int,
                                                      message: str) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    if args:
        (bundle / "bundle.json").write_text("{}\n")
    result = run_wrapper("--venv", tmp_path / "venv", "--offline", bundle, *args, "--", "--dry-run", timeout=120)
    assert result.returncode == code, result.stderr[-2000:]
    error, hint = result.one_error()
    assert message in error and "hint: " in hint
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("args", [["--offline"], ["--offline="], ["--offline", ""]])
def test_offline_needs_a_directory(args: list[str]) -> None:
    result = run_wrapper(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.one_error()[0] == "error: --offline needs a bundle directory"


def test_offline_with_system_deps_names_the_command_and_runs_no_package_manager(tmp_path: Path) -> None:
    """Root on Debian, libaio headers missing: without --offline apt-get would run (test_install_wrapper.py); with
    it, nothing runs (a package manager needs its repositories) and the command is named. The fake host has no
    Python, so the run stops there (exit 3), after the system packages."""
    host = FakePackageHost(tmp_path / "host", "apt-get", ("build-essential", "python3-dev", "ninja-build"))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.json").write_text("{}\n")
    result = run_wrapper("--venv", host.root / "venv", "--with-system-deps", "--offline", bundle,
                         env={**host.env(), "PYTHON": "python3"}, timeout=120)
    assert result.returncode == 3 and "error: python3 not found" in result.stderr, result.stderr[-2000:]
    assert host.calls("apt-get", "sudo") == []
    assert "not done: --offline installs no system packages (libaio-dev python3-venv)" in result.stderr
    assert "sudo apt-get update && sudo apt-get install -y libaio-dev python3-venv" in result.stderr
