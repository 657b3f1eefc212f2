"""`mlstack-ds verify` bad input: one-line error, hint, exit code 2, before anything is launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlstack_ds.cli.app import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["verify", *args])
    return int(info.value.code or 0), " ".join(capsys.readouterr().err.split())  # undo rich wrapping


def test_unknown_check(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["--only", "zero4"], capsys)
    assert code == 2 and "unknown check(s) zero4" in err and "hint:" in err and "Traceback" not in err


def test_missing_python(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_cli(["--python", str(tmp_path / "nope")], capsys)
    assert code == 2 and "no such file" in err


def test_python_that_is_not_executable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plain = tmp_path / "python"
    plain.write_text("")
    code, err = run_cli(["--python", str(plain)], capsys)
    assert code == 2 and "not executable" in err


@pytest.mark.parametrize(("option", "value"), [("--timeout", "0"), ("--world-size", "0")])
def test_non_positive_numbers(capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    code, err = run_cli([option, value], capsys)
    assert code == 2 and option in err


def test_bad_hostfile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("just-a-name\n")
    code, err = run_cli(["--hostfile", str(hostfile)], capsys)
    assert code == 2 and "slots=N" in err


def test_world_size_with_hostfile_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=2\n")
    code, err = run_cli(["--hostfile", str(hostfile), "--world-size", "4"], capsys)
    assert code == 2 and "cannot be combined with --hostfile" in err
