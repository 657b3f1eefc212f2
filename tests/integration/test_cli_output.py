"""Piped or narrow output never cuts data: no `…`, nothing split mid-word, no trailing padding.

Each command runs for real with stdout captured (a pipe) and COLUMNS=40; the long values a user copies
(paths, patch names, fix commands, commits) are taken from the same command's `--json` and must each
appear whole on one line. A pseudo-terminal shows the other side of the rule: a table when it fits.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest
from support.cli import CliResult, run_cli, start_cli
from support.doctor_machine import DoctorMachine
from support.target_env import bare_venv

from mlstack_ds.installed.receipt import PreviousInstall, Receipt, receipt_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MASK_ERROR = FIXTURES / "doctor-logs" / "mask-64bit_ds-7565.txt"
LONG_DIR = "a-directory-name-much-longer-than-forty-columns-to-copy-whole"


def cli(*args: str, columns: str = "40") -> CliResult:
    return run_cli(*args, columns=columns, timeout=300)


def assert_whole(stdout: str, values: list[str], excerpts: tuple[str, ...] = ()) -> None:
    """Every value on one line of `stdout`, and no line cut short or padded. `excerpts`: data that carries
    its own `…` (doctor quotes at most a log line's first characters as evidence; the JSON has the same)."""
    uncut = stdout
    for excerpt in excerpts:
        uncut = uncut.replace(excerpt, "")
    assert "…" not in uncut
    lines = stdout.splitlines()
    assert not [line for line in lines if line != line.rstrip()], "trailing spaces"
    for value in values:
        assert any(value in line for line in lines), f"{value!r} is not whole on any line:\n{stdout}"


@pytest.fixture(scope="module")
def long_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (no pip) at a path far wider than 40 columns."""
    return bare_venv(tmp_path_factory.mktemp("out") / LONG_DIR / "venv") / "bin" / "python"


def test_detect(long_python: Path) -> None:
    result = cli("detect", "--python", str(long_python))
    assert result.returncode == 0, result.stderr
    assert_whole(result.stdout, [f"({long_python})", "platform: "])


def test_doctor_fix_commands_are_whole(tmp_path: Path) -> None:
    """On the tests' fake machine (no GPU, a JIT cache and /dev, /proc, /sys of its own): the two calls see the
    same machine. On this machine's own state they did not: CI's run found a stale JIT lock in the real
    ~/.cache/torch_extensions whose age went from "7 min old" to "8 min old" between them."""
    machine = DoctorMachine(tmp_path, None)
    document = json.loads(machine.run("--log", str(MASK_ERROR), "--json", columns="40").stdout)
    fixes = [step for finding in document["findings"] for step in finding["fix"]]
    assert fixes and max(len(f) for f in fixes) > 40
    result = machine.run("--log", str(MASK_ERROR), columns="40")
    assert result.returncode in (0, 3), result.stderr
    evidence = tuple(f["evidence"] for f in document["findings"])
    assert_whole(result.stdout, fixes + [f["docs"] for f in document["findings"]] + list(evidence), evidence)


def test_install_dry_run_plan() -> None:
    plan = json.loads(cli("install", "--dry-run", "--json").stdout)["plan"]
    result = cli("install", "--dry-run")
    assert result.returncode == 0, result.stderr
    names = [p["name"] for p in plan["patches"]]
    assert max(len(n) for n in names) > 40
    assert_whole(result.stdout, [f"patches: {n}" for n in names] + [plan["cache_key"]]
                 + [f"{k}={v}" for k, v in plan["env"].items()])


def test_patches_list() -> None:
    listed = json.loads(cli("patches", "list", "--json").stdout)["patches"]
    result = cli("patches", "list")
    assert result.returncode == 0, result.stderr
    assert_whole(result.stdout, [p["name"] for p in listed] + [p["subject"] for p in listed]
                 + [f for p in listed for f in p["files"]])


def test_recipes_list_and_show() -> None:
    (recipe,) = [r for r in json.loads(cli("recipes", "list", "--json").stdout) if r["name"] == "deepspeed-0.19.5"]
    listed = cli("recipes", "list")
    assert listed.returncode == 0, listed.stderr
    assert_whole(listed.stdout, [f"commit: {recipe['git']['commit']}", "recipe: deepspeed-0.19.5"])
    shown = cli("recipes", "show", "deepspeed-0.19.5")
    assert shown.returncode == 0, shown.stderr
    assert_whole(shown.stdout, [f"path: {recipe['path']}", f"sdist.sha256: {recipe['sdist']['sha256']}"])


def test_status_of_a_receipt(long_python: Path) -> None:
    prefix = long_python.parent.parent
    wheel = prefix / "wheels" / "deepspeed-0.19.5+mlstack.0123456789abcdef-cp311-cp311-linux_x86_64.whl"
    patch = "0013-zero-config-smaller-default-buckets-on-ROCm-GPUs-under-64-GiB.patch"
    receipt = Receipt(
        deepspeed_version="0.19.5", recipe="deepspeed-0.19.5", source="pypi", source_commit="c" * 40,
        source_pin="8" * 64, patches=[{"name": patch, "sha256": "0" * 64}], tree_hash="t" * 40, platform="cpu",
        accelerator="cpu", archs=[], ops=["cpu_adam"], flags={}, wheel=str(wheel), wheel_sha256="1" * 64,
        torch_version="2.13.0", python=str(long_python), cache_key="k" * 64, installed_at="2026-01-01T00:00:00Z",
        previous=PreviousInstall(None),
    )
    path = receipt_path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(receipt.to_dict()))
    document = json.loads(cli("status", "--python", str(long_python), "--json").stdout)
    assert document["problems"]  # no DeepSpeed in that venv: the problems are listed, each whole
    result = cli("status", "--python", str(long_python))
    assert result.returncode == 0, result.stderr
    assert_whole(result.stdout, [f"wheel: {wheel}", f"patches: {patch}", "state: changed since install"]
                 + [f"problem: {p}" for p in document["problems"]])


def on_a_terminal(columns: int, *args: str) -> str:
    """The command's stdout as a terminal `columns` wide shows it."""
    leader, follower = pty.openpty()
    with start_cli(*args, columns=columns, env={"TERM": "xterm", "NO_COLOR": "1"}, stdout=follower,
                   stderr=subprocess.DEVNULL, text=False) as proc:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        proc.wait(timeout=120)
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_a_terminal_gets_a_table_only_when_it_fits() -> None:
    commit = json.loads(cli("recipes", "list", "--json").stdout)[0]["git"]["commit"]
    wide = on_a_terminal(200, "recipes", "list")
    assert "┃" in wide and commit in wide and "…" not in wide
    narrow = on_a_terminal(40, "recipes", "list")
    assert "┃" not in narrow and "…" not in narrow and f"commit: {commit}" in narrow
