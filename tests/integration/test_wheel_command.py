"""The build stage's wheel command: one run of a legacy setup.py, pip for trees that declare a build system.

DeepSpeed's setup.py is slow to start (torch, compiler probes, py-cpuinfo per CPU op), and pip runs a
tree without pyproject.toml twice (metadata, then wheel). Real pip and setuptools, on small trees whose
setup.py counts its runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mlstack_ds.build.wheel import wheel_command

COUNTING_SETUP = """\
import os
from setuptools import setup
with open(os.environ["SETUP_RUNS"], "a") as runs:
    runs.write("run\\n")
if os.environ.get("SETUP_FAILS"):
    raise SystemExit("error: building 'tiny.ops.broken_op' extension failed: on purpose")
setup(name="tiny", version="1.0", py_modules=["tiny"])
"""


def tree(tmp_path: Path, *, pyproject: bool) -> Path:
    """A small project whose setup.py counts its runs, and the empty output directory `tmp_path/out`."""
    (tmp_path / "out").mkdir()
    root = tmp_path / "tree"
    root.mkdir()
    (root / "setup.py").write_text(COUNTING_SETUP)
    (root / "tiny.py").write_text("ANSWER = 42\n")
    if pyproject:
        (root / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    return root


def build(argv: list[str], root: Path, runs: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SETUP_RUNS": str(runs), **env})


def test_a_tree_without_pyproject_runs_its_setup_py_once(tmp_path: Path) -> None:
    root, out, runs = tree(tmp_path, pyproject=False), tmp_path / "out", tmp_path / "runs.txt"
    result = build(wheel_command(sys.executable, root, out), root, runs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert runs.read_text().count("run") == 1
    (wheel,) = out.glob("tiny-1.0-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("tiny.py") == b"ANSWER = 42\n"
        assert "tiny-1.0.dist-info/METADATA" in archive.namelist()


def test_pip_runs_the_same_setup_py_twice(tmp_path: Path) -> None:
    """What the command replaces, measured the same way: pip wheel runs setup.py for the metadata first."""
    root, out, runs = tree(tmp_path, pyproject=False), tmp_path / "out", tmp_path / "runs.txt"
    result = build([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(out),
                    str(root)], root, runs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert runs.read_text().count("run") == 2


def test_a_tree_with_pyproject_is_built_by_pip(tmp_path: Path) -> None:
    root, out, runs = tree(tmp_path, pyproject=True), tmp_path / "out", tmp_path / "runs.txt"
    argv = wheel_command(sys.executable, root, out)
    assert argv[1:4] == ["-m", "pip", "wheel"]
    result = build(argv, root, runs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(out.glob("tiny-1.0-*.whl"))) == 1


@pytest.mark.parametrize("pyproject", [False, True])
def test_a_failing_setup_py_fails_the_command_with_its_message(tmp_path: Path, pyproject: bool) -> None:
    root, out, runs = tree(tmp_path, pyproject=pyproject), tmp_path / "out", tmp_path / "runs.txt"
    result = build(wheel_command(sys.executable, root, out), root, runs, SETUP_FAILS="1")
    assert result.returncode != 0
    assert "error: building 'tiny.ops.broken_op' extension failed: on purpose" in result.stdout + result.stderr
    assert not list(out.glob("*.whl"))
