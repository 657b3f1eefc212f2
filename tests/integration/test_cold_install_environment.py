"""The session's background installs (tests/support/cold_install.py) run while other tests change os.environ.

CI's run of 72dc275 lost all eight second-pin tests this way: the second pin's venv was made while
tests/integration/test_source_fetch.py had PIP_NO_INDEX=1 and PIP_FIND_LINKS=<a mirror holding only DeepSpeed> in
os.environ, and pip, run from the install's thread, saw them: "Cannot install torch==2.13.0 because these package
versions have conflicting dependencies". Here a real pip and the real CLI, started after the change, must not see it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cold_install import BackgroundInstall


def test_an_install_started_later_uses_the_environment_it_was_made_in(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    install = BackgroundInstall(tmp_path / "venv", tmp_path / "cache", install_args=("--deepspeed-version", "0.0.1"),
                                requirements=("packaging",))
    (tmp_path / "empty-mirror").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # what a test running meanwhile does (test_source_fetch's local_index)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty-mirror"))

    result = install.start().wait(timeout=600)  # raises "making the target venv failed" if pip saw the change

    assert list((tmp_path / "venv").glob("lib/python3*/site-packages/packaging")), "pip did not install into the venv"
    # The CLI ran too, in that environment, and refused the unknown pin the usual way (exit 2, a hint).
    assert result.returncode == 2, result.stderr
    assert "no recipe named '0.0.1'" in result.stderr and "hint: available recipes" in result.stderr
