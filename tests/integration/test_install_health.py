"""Install health without a DeepSpeed build: the RECORD check and the repacked copy on a small wheel that
real pip installs into a real venv, and the CLI's answers for unusable receipts and nothing to uninstall.
(The same on the real DeepSpeed: tests/e2e/test_install_health_e2e.py.)"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import zipfile
from functools import partial
from pathlib import Path

import pytest
from support.cli import run_cli
from support.installs import synthetic_install
from support.target_env import bare_venv

from mlstack_ds.install.repack import repack_installed
from mlstack_ds.installed.health import probe_installed
from mlstack_ds.installed.integrity import check_files, parse_record, record_digest
from mlstack_ds.installed.receipt import receipt_path

OP_BYTES = bytes(range(256)) * 400  # stands in for a compiled op library


def make_wheel(directory: Path, version: str = "1.0") -> Path:
    """tinyop-VERSION: a package with an op library, a data script and a console entry point."""
    stem = f"tinyop-{version}"
    files = {
        "tinyop/__init__.py": b"def main():\n    print('tinyop')\n",
        "tinyop/ops/tiny_op.cpython-312-x86_64-linux-gnu.so": OP_BYTES,
        f"{stem}.data/scripts/tinyop_tool": b"#!python\nprint('tool')\n",
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tinyop\nVersion: {version}\n".encode(),
        f"{stem}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{stem}.dist-info/entry_points.txt": b"[console_scripts]\ntinyop-cli = tinyop:main\n",
    }
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    wheel = directory / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
            writer.writerow([name, f"sha256={record_digest(data)}", len(data)])
        writer.writerow([f"{stem}.dist-info/RECORD", "", ""])
        archive.writestr(f"{stem}.dist-info/RECORD", rows.getvalue())
    return wheel


def pip_into(venv: Path, *args: str) -> None:
    """The test venv's real pip, acting on `venv` (which has no pip of its own)."""
    offline = ["--no-index"] if args[0] == "install" else []
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args, *offline,
                    "--quiet", "--disable-pip-version-check"], check=True, timeout=300)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    return bare_venv(tmp_path / "venv")  # its own: pip installs into it


@pytest.fixture
def tinyop_record(venv: Path, tmp_path: Path) -> Path:
    pip_into(venv, "install", "--no-deps", str(make_wheel(tmp_path)))
    (record,) = venv.glob("lib/python*/site-packages/tinyop-1.0.dist-info/RECORD")
    return record


cli = partial(run_cli, columns=200, timeout=300)  # the CLI as these tests run it


def test_untouched_install_matches_its_record(tinyop_record: Path) -> None:
    check = check_files(tinyop_record)
    assert check.ok and check.missing == check.modified == ()
    hashed = [e for e in parse_record(tinyop_record.read_text()) if e.digest]
    assert check.checked == len(hashed) >= 5  # package files, the script, the launcher pip generated
    assert "all" in check.summary() and str(tinyop_record) in check.summary()


def test_deleted_and_edited_files_are_named(tinyop_record: Path) -> None:
    site = tinyop_record.parent.parent
    (site / "tinyop/ops/tiny_op.cpython-312-x86_64-linux-gnu.so").unlink()
    init = site / "tinyop/__init__.py"
    init.write_text(init.read_text().replace("tinyop", "tinyOp"))  # same size, other bytes
    check = check_files(tinyop_record)
    assert not check.ok
    assert check.missing == ("tinyop/ops/tiny_op.cpython-312-x86_64-linux-gnu.so",)
    assert check.modified == ("tinyop/__init__.py",)
    assert check.summary().startswith("1 missing (tinyop/ops/tiny_op.cpython-312-x86_64-linux-gnu.so) and "
                                      "1 modified (tinyop/__init__.py) of the ")
    assert check.to_dict()["missing"] == list(check.missing)


def test_many_changes_are_counted_and_the_first_few_named(tinyop_record: Path) -> None:
    site = tinyop_record.parent.parent
    for entry in parse_record(tinyop_record.read_text()):
        if entry.digest and not entry.path.startswith(".."):
            (site / entry.path).unlink()
    check = check_files(tinyop_record)
    assert len(check.missing) >= 5
    assert f"{len(check.missing)} missing (" in check.summary() and f"and {len(check.missing) - 3} more)" in (
        check.summary())


def test_missing_or_garbled_record_is_reported_not_raised(tinyop_record: Path) -> None:
    tinyop_record.write_text("just,one\n")
    assert "unreadable" in (check_files(tinyop_record).unreadable or "")
    tinyop_record.unlink()
    check = check_files(tinyop_record)
    assert not check.ok and "is missing" in check.summary()


def test_probe_locates_the_record_through_the_target_interpreter(venv: Path, tinyop_record: Path) -> None:
    state = probe_installed(str(venv / "bin" / "python"))
    assert state.deepspeed_version is None and state.record is None  # no DeepSpeed here
    assert state.prefix == str(venv)


def test_repacked_copy_reinstalls_the_exact_files(venv: Path, tinyop_record: Path, tmp_path: Path) -> None:
    site = tinyop_record.parent.parent
    tool = venv / "bin" / "tinyop_tool"
    tool.chmod(0o755)  # as a build backend's wheel marks its scripts
    before = {e.path: e.digest for e in parse_record(tinyop_record.read_text()) if e.digest}
    wheel = repack_installed(tinyop_record, venv, tmp_path / "kept")
    assert wheel.name == "tinyop-1.0-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "tinyop-1.0.data/scripts/tinyop_tool" in names
    assert not any(n.endswith(("INSTALLER", "REQUESTED", "direct_url.json", ".pyc")) or "tinyop-cli" in n
                   for n in names)  # pip writes those itself
    pip_into(venv, "uninstall", "--yes", "tinyop")
    assert not (site / "tinyop").exists()
    pip_into(venv, "install", "--no-deps", str(wheel))
    after = {e.path: e.digest for e in parse_record(tinyop_record.read_text()) if e.digest}
    assert {p: d for p, d in after.items() if "dist-info" not in p} == {
        p: d for p, d in before.items() if "dist-info" not in p}
    assert check_files(tinyop_record).ok
    assert os.access(tool, os.X_OK)  # the mode travelled with the copy
    ran = subprocess.run([str(venv / "bin" / "tinyop-cli")], capture_output=True, text=True, timeout=60)
    assert ran.stdout == "tinyop\n"


def test_checking_a_large_install_reads_every_file(venv: Path, tmp_path: Path) -> None:
    """1,500 files and 30 MB, about DeepSpeed's size with its op libraries; one changed byte in the largest
    is found. How long it takes is measured by `scripts/bench.py integrity` (docs/benchmarks.md)."""
    site = next(venv.glob("lib/python*/site-packages"))
    record = synthetic_install(site)
    check = check_files(record)
    assert check.ok and check.checked == 1500
    largest = site / "big" / "m0.py"
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0x01
    largest.write_bytes(bytes(data))
    assert check_files(record).modified == ("big/m0.py",)


@pytest.mark.parametrize(("raw", "what"), [
    (b'{"schema": 99}', "schema 99 is not one this mlstack-ds knows"),
    (b'{"deepspeed_version": "0.19', "not valid JSON (truncated or damaged"),
    (b"\x00\xff\xfe\x01", "not text (binary or damaged)"),
])
@pytest.mark.parametrize("command", ["status", "rollback", "uninstall"])
def test_unusable_receipt_is_one_error_line_with_the_fix(venv: Path, command: str, raw: bytes, what: str) -> None:
    path = receipt_path(venv)
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    result = cli(command, "--python", str(venv / "bin" / "python"))
    assert result.returncode == 7, result.stderr
    error, hint = result.stderr.splitlines()
    assert error == f"error: receipt {path} is unusable: " + error.split(" is unusable: ", 1)[1]
    assert what in error and "Traceback" not in result.stderr and "__init__" not in error
    assert hint.startswith("hint: `mlstack-ds install --force` reinstalls") and f"rm {path}" in hint
    assert path.read_bytes() == raw  # nothing acted on it


def test_uninstall_with_nothing_of_ours_skips_like_pip(venv: Path, tinyop_record: Path) -> None:
    python = str(venv / "bin" / "python")
    result = cli("uninstall", "--python", python)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr.strip() == f"warning: Skipping: nothing installed by mlstack-ds in {venv}"
    as_json = cli("uninstall", "--python", python, "--json")
    assert as_json.returncode == 0
    document = json.loads(as_json.stdout)
    assert document["action"] == "skipped" and document["installed"]["deepspeed_version"] is None
