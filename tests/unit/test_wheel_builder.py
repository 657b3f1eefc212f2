"""Which interpreters can build DeepSpeed's wheel (setuptools' bdist_wheel), and what the fix installs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlstack_ds.detect.wheel_builder import fix_package, wheel_build_problem


@pytest.mark.parametrize(("setuptools", "wheel_package", "problem", "fix"), [
    ("65.5.0", False, "its setuptools 65.5.0 has no bdist_wheel", "wheel"),  # a Python 3.11 venv's own
    ("66.1.1", False, "its setuptools 66.1.1 has no bdist_wheel", "wheel"),  # Debian 12's
    ("70.0.0", False, "its setuptools 70.0.0 has no bdist_wheel", "wheel"),
    (None, False, "it has no setuptools", "setuptools"),  # a Python 3.12+ venv
    ("65.5.0", True, None, "wheel"),  # the `wheel` package adds bdist_wheel
    ("70.1.0", False, None, "wheel"),  # setuptools has its own from 70.1
    ("84.2.1", False, None, "wheel"),
    ("not-a-version", False, None, "wheel"),  # unknown: not refused on a guess
])
def test_the_rule(setuptools: str | None, wheel_package: bool, problem: str | None, fix: str) -> None:
    found = wheel_build_problem(setuptools, wheel_package)
    assert found == problem if problem is None else (found or "").startswith(problem)
    assert fix_package(setuptools) == fix


def test_this_interpreter_is_read_as_import_finds_it() -> None:
    """The test venv (torch 2.13.0 brought setuptools 84, which has bdist_wheel), asked in a child so that
    its sys.path is the interpreter's own, not pytest's."""
    script = ("import importlib.util, json, setuptools\n"
              "from mlstack_ds.detect.wheel_builder import main, this_interpreter\n"
              "print(json.dumps([this_interpreter(), [setuptools.__version__, "
              "importlib.util.find_spec('wheel') is not None]]))\n"
              "main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    read, imported = json.loads(done.stdout.splitlines()[0])
    assert read == imported
    assert done.stdout.splitlines()[1:] == []  # main(): nothing to install
