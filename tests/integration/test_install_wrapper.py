"""scripts/install_deepspeed.sh: the one command users run, on a fresh venv (no build here; see e2e)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import WRAPPER, CliResult, run_wrapper
from support.fakepkg import FakePackageHost
from support.pins import CLIENT_PACKAGES, TORCH_VERSION
from support.target_env import bare_venv, overlay_venv


@pytest.mark.slow
def test_fresh_venv_without_torch_stops_with_the_fix(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    first = run_wrapper("--venv", str(venv), "--with-clients", "--", "--dry-run")
    assert first.returncode == 3, first.stderr[-2000:]
    assert "PyTorch is not installed" in first.stderr and "--with-torch cpu" in first.stderr
    # no torch to hold: accelerate would pull an unpinned (CUDA) torch, so nothing of it is installed
    assert ("not done: verify's clients (transformers, accelerate, peft, lightning) need the venv's PyTorch first"
            in first.stderr)
    assert not list(venv.glob("lib/python3*/site-packages/torch*"))
    assert not list(venv.glob("lib/python3*/site-packages/accelerate*"))
    assert "Traceback" not in first.stderr
    assert (venv / "bin" / "mlstack-ds").exists()  # the tool itself is installed
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    # its own setuptools (ensurepip's: 65.5 on 3.11, none from 3.12) was made able to build DeepSpeed's wheel
    ask = "from mlstack_ds.detect.wheel_builder import main; main()"
    builder = subprocess.run([venv / "bin" / "python", "-c", ask], capture_output=True, text=True, check=True,
                             timeout=120)
    assert builder.stdout == "", first.stderr[-2000:]
    second = run_wrapper("--venv", str(venv), "--", "--dry-run")  # re-run reuses the venv
    assert second.returncode == 3 and "creating" not in second.stderr


@pytest.mark.slow
def test_sigterm_to_the_wrapper_stops_the_tool_and_its_probe(tmp_path: Path) -> None:
    """The wrapper runs the tool as a child (its summary comes after): a SIGTERM sent to the wrapper (a job
    controller, `timeout`) must reach the tool, which kills what it started; the wrapper waits for that."""
    pid_file = tmp_path / "probe.pid"
    hanging = tmp_path / "python"
    hanging.write_text(f"#!/bin/sh\necho $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}\nexec sleep 300\n")
    hanging.chmod(0o755)
    wrapper = subprocess.Popen(["bash", str(WRAPPER), "--venv", str(tmp_path / "venv"), "--", "--python",
                                str(hanging), "--dry-run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 900  # the wrapper first makes the venv and installs the tool
    while not pid_file.exists() and time.monotonic() < deadline and wrapper.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), wrapper.communicate(timeout=60)[1][-3000:]
    probe = int(pid_file.read_text())
    wrapper.send_signal(signal.SIGTERM)
    _, stderr = wrapper.communicate(timeout=120)
    assert wrapper.returncode == 130, stderr[-3000:]
    assert "error: interrupted" in stderr and "left out" not in stderr
    assert not Path(f"/proc/{probe}").exists(), "the probe outlived the wrapper"
    tools = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(hanging).encode() in _cmdline(p)]
    assert tools == [], "the tool (or its probe) outlived the wrapper"


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize(("args", "message"), [
    (["--with-torch", "rocm"], "only 'cpu' can be installed"),
    (["--venv"], "--venv needs a directory"),
])
def test_bad_arguments(args: list[str], message: str) -> None:
    result = run_wrapper(*args)
    assert result.returncode == 2 and message in result.stderr


def test_with_torch_cpu_refuses_to_shadow_a_rocm_torch(tmp_path: Path) -> None:
    """A ROCm PyTorch cannot be installed here (no GPU build on this machine's index), so a stand-in
    package with ROCm's `torch.version` attributes plays it; the wrapper must stop before installing."""
    venv = bare_venv(tmp_path / "venv", "python3")  # the wrapper's own python3, as the README runs it
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        '__version__ = "2.5.1+rocm6.2"\n\nclass version:\n    hip = "6.2.41133"\n    cuda = None\n')
    result = run_wrapper("--venv", str(venv), "--with-torch", "cpu", "--", "--dry-run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "already sees a rocm PyTorch (2.5.1+rocm6.2)" in result.stderr and "hint:" in result.stderr
    assert not (venv / "bin" / "mlstack-ds").exists()  # nothing was installed


APT = ("build-essential", "python3-dev", "ninja-build", "libaio-dev")
APT_NEW_VENV = (*APT, "python3-venv")  # Debian's `python3 -m venv` needs it; asked for while the venv is to be made
DNF = ("gcc-c++", "python3-devel", "ninja-build", "libaio-devel")
ZYPPER = ("gcc-c++", "python3-devel", "ninja", "libaio-devel")


def run_on_host(host: FakePackageHost, *args: str) -> CliResult:
    """The wrapper on a fake host whose PATH has no Python: it does the system packages, then stops (exit 3)
    where it first needs Python, before any venv (one still to be made, in the host's directory)."""
    result = run_wrapper("--venv", str(host.root / "venv"), *args, env={**host.env(), "PYTHON": "python3"},
                         timeout=120)
    assert result.returncode == 3 and "error: python3 not found" in result.stderr, result.stderr[-2000:]
    return result


PACKAGES = {"apt-get": APT_NEW_VENV, "dnf": DNF, "zypper": ZYPPER}


@pytest.mark.parametrize(("host", "expected"), [
    # root on Debian, libaio headers and venv missing: apt-get update, then only what is missing
    ({"manager": "apt-get", "installed": APT[:3]},
     [["apt-get", "update", "-qq"],
      ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "libaio-dev", "python3-venv"]]),
    # a user with passwordless sudo on Fedora, nothing there yet
    ({"manager": "dnf", "uid": 1000, "sudo": True},
     [["sudo", "-n", "true"], ["sudo", "-n", "dnf", "install", "-y", *DNF], ["dnf", "install", "-y", *DNF]]),
    # root on openSUSE, Python headers missing
    ({"manager": "zypper", "installed": ("gcc-c++", "ninja", "libaio-devel")},
     [["zypper", "--non-interactive", "install", "python3-devel"]]),
])
def test_with_system_deps_installs_what_is_missing(tmp_path: Path, host: dict, expected: list[list[str]]) -> None:
    fake = FakePackageHost(tmp_path, **host)
    names = PACKAGES[fake.manager]
    result = run_on_host(fake, "--with-system-deps")
    missing = [n for n in names if n not in fake.installed]
    assert f"installing system packages with {fake.manager}: {' '.join(missing)}" in result.stderr
    assert fake.calls(fake.manager, "sudo") == expected
    queried = [argv[-1] for argv in fake.calls("dpkg-query" if fake.manager == "apt-get" else "rpm")]
    assert queried == list(names)  # every package asked about, by the manager's own query tool
    assert set(fake.now_installed()) == set(names)


def test_with_system_deps_without_root_prints_the_command(tmp_path: Path) -> None:
    """Not root and sudo wants a password: nothing is installed; the exact command is printed, and what
    could not be done; the run goes on."""
    host = FakePackageHost(tmp_path, "apt-get", APT[:3], uid=1000, sudo=False)
    result = run_on_host(host, "--with-system-deps")
    assert host.calls("apt-get") == [] and host.now_installed() == list(APT[:3])
    assert ("not done: installing system packages libaio-dev python3-venv needs root, and sudo asks for a password"
            in result.stderr)
    assert "run: sudo apt-get update && sudo apt-get install -y libaio-dev python3-venv" in result.stderr


def test_with_system_deps_when_all_are_there_installs_nothing(tmp_path: Path) -> None:
    host = FakePackageHost(tmp_path, "apt-get", APT_NEW_VENV)
    result = run_on_host(host, "--with-system-deps")
    assert host.calls("apt-get", "sudo") == [] and "system packages: all there" in result.stderr


def test_without_the_option_no_package_manager_runs(tmp_path: Path) -> None:
    host = FakePackageHost(tmp_path, "apt-get", ())
    run_on_host(host)
    assert host.calls() == []


def test_help_documents_the_opt_ins() -> None:
    result = run_wrapper("--help")
    assert result.returncode == 0
    for option in ("--with-torch cpu", "--with-system-deps", "--with-clients", "--venv DIR", "--offline BUNDLE"):
        assert f"\n{option}" in result.stdout, result.stdout


# Each package's version and where it is imported from, as the venv sees them.
PROBE_CLIENTS = ("import importlib, importlib.metadata as m, json; print(json.dumps({n: (m.version(n), "
                 "importlib.import_module(n).__file__) for n in ('torch', 'transformers', 'accelerate', 'peft', "
                 "'lightning')}))")


def test_summary_names_what_is_left_out_and_with_clients_installs_them_with_torch_held(
        tmp_path: Path, torch_only_python: Path) -> None:
    """Real pip, real package index: the clients (requirements/clients.txt) go into a scratch venv that sees the test
    venv's torch 2.13.0 (support/target_env.py: overlay_venv); torch is held, not upgraded or copied in.
    The host is a fake Debian without libaio-dev. A dry-run install ends each run (nothing is built)."""
    venv = overlay_venv(tmp_path / "venv", torch_only_python)
    root_host = FakePackageHost(tmp_path / "root-host", "apt-get", APT[:3], uid=0)
    first = run_wrapper("--venv", venv, "--", "--dry-run", timeout=1800, env=root_host.env(real_path=True))
    assert first.returncode == 0, first.stderr[-3000:]
    assert root_host.calls("apt-get") == []  # not asked to
    wrapper = str(WRAPPER)
    lines = first.stderr.splitlines()
    assert lines[-2:] == [
        "==> left out: libaio headers for async_io and verify's nvme_offload (system package(s) libaio-dev); "
        f"add with: {wrapper} --with-system-deps --venv {venv} -- --dry-run",
        "==> left out: verify's client checks (not all of transformers, accelerate, peft, lightning); "
        f"add with: {wrapper} --with-clients --venv {venv} -- --dry-run --force"], first.stderr[-3000:]

    user_host = FakePackageHost(tmp_path / "user-host", "apt-get", APT[:3], uid=1000, sudo=False)
    result = run_wrapper("--venv", venv, "--with-system-deps", "--with-clients", "--", "--dry-run", timeout=1800,
                         env=user_host.env(real_path=True))
    assert result.returncode == 0, result.stderr[-3000:]
    assert user_host.calls("apt-get") == [] and "not done: installing system packages libaio-dev" in result.stderr
    assert f"torch held at {TORCH_VERSION}+cpu" in result.stderr
    (site,) = venv.glob("lib/python3*/site-packages")
    # torch itself, not torchmetrics (Lightning's, which does belong in the venv)
    held = [*site.glob("torch"), *site.glob("torch-*.dist-info")]
    assert not held, "torch was installed into the venv instead of held"
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE_CLIENTS], capture_output=True, text=True,
                           timeout=300, check=False)
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout)
    clients = ("transformers", "accelerate", "peft", "lightning")
    assert {f"{name}=={found[name][0]}" for name in clients} == set(CLIENT_PACKAGES)
    assert all(found[name][1].startswith(str(site)) for name in clients), found
    assert found["torch"][0] == f"{TORCH_VERSION}+cpu" and not found["torch"][1].startswith(str(venv)), found
    assert result.stderr.splitlines()[-1] == (  # clients are in; libaio-dev needs root: the command, then again
        "==> left out: libaio headers for async_io and verify's nvme_offload (system package(s) libaio-dev); "
        "add with: sudo apt-get update && sudo apt-get install -y libaio-dev && "
        f"{wrapper} --venv {venv} --with-system-deps --with-clients -- --dry-run")


DEBIAN_PYTHON = Path("/usr/bin/python3")  # Debian's own, whose venv names python3-venv when ensurepip is missing


def python_without_ensurepip(root: Path) -> Path:
    """Debian's Python as a fresh Debian has it without python3-venv: the same interpreter and standard
    library, minus `ensurepip` (the part python3-venv holds). Its `-m venv` then fails as it does there."""
    binary = DEBIAN_PYTHON.resolve()
    stdlib = Path(subprocess.run([binary, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                 capture_output=True, text=True, check=True, timeout=120).stdout.strip())
    (root / "bin").mkdir(parents=True)
    (root / "lib" / stdlib.name).mkdir(parents=True)
    python = root / "bin" / binary.name
    shutil.copy2(binary, python)
    for entry in stdlib.iterdir():
        if entry.name != "ensurepip":
            (root / "lib" / stdlib.name / entry.name).symlink_to(entry)
    return python


def test_a_python_without_ensurepip_gets_the_fix_and_leaves_no_half_made_venv(tmp_path: Path) -> None:
    """A fresh Debian lacks python3-venv: `python3 -m venv` stops after making bin/python, and the next run
    took that half-made venv and failed with "No module named pip". Now: exit 3 with the fix, nothing left."""
    venv_module = subprocess.run([DEBIAN_PYTHON, "-c", "import venv; print(venv.__file__)"], capture_output=True,
                                 text=True, check=False, timeout=120).stdout.strip()
    if not venv_module or "ensurepip is not" not in Path(venv_module).read_text():
        pytest.skip(f"no Debian Python at {DEBIAN_PYTHON} (its venv names python3-venv)")
    python = python_without_ensurepip(tmp_path / "python")
    venv = tmp_path / "venv"
    for _ in range(2):  # the second run meets the same, not a venv without pip
        result = run_wrapper("--venv", str(venv), "--", "--dry-run", env={"PYTHON": str(python)}, timeout=300)
        assert result.returncode == 3, result.stderr[-2000:]
        assert result.stderr.splitlines()[-2:] == [
            f"error: {python} cannot make a venv: its ensurepip is missing (Debian and Ubuntu ship it in python3-venv)",
            "hint: run this command again with --with-system-deps, or: sudo apt-get install -y python3-venv"]
        assert not venv.exists() and "No module named pip" not in result.stderr


def test_a_venv_without_pip_is_named_not_used(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    result = run_wrapper("--venv", str(venv), "--", "--dry-run", env={"PYTHON": sys.executable}, timeout=300)
    assert result.returncode == 3 and result.stderr.splitlines()[-2:] == [
        f"error: {venv} has no pip (a venv made half-way, e.g. while python3-venv was missing)",
        f"hint: remove it (rm -rf {venv}) and run this command again; it will be made anew"], result.stderr[-2000:]
