"""The test run's own HOME (tests/support/isolated_home.py, set up by tests/conftest.py): nothing a test starts
reads this machine's per-user state, and what the run needs from it (pip's index and cache) still works."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from support.isolated_home import MARKER, isolated_environment

from mlstack_ds.doctor.jitlocks import extensions_root


def test_this_run_has_its_own_home_and_torch_extensions_under_it() -> None:
    home = Path(os.environ["HOME"])
    assert os.environ[MARKER] == str(home)
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert "TORCH_EXTENSIONS_DIR" not in os.environ
    assert home.resolve() in extensions_root(os.environ).parents  # where doctor looks for stale JIT locks


def test_pip_reads_the_same_configuration_as_in_the_real_home() -> None:
    real = {name: value for name, value in os.environ.items()
            if name not in ("PIP_CONFIG_FILE", "XDG_CONFIG_HOME", MARKER)}
    real["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
    listed = [subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             env=env, timeout=120, check=True).stdout for env in (real, dict(os.environ))]
    from_files = [[line for line in text.splitlines() if not line.startswith(":env:")] for text in listed]
    assert from_files[0] == from_files[1]


def test_per_user_directories_move_and_what_is_kept_is_named(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / ".config" / "pip").mkdir(parents=True)
    (real / ".config" / "pip" / "pip.conf").write_text("[global]\n")
    (real / ".pyenv").mkdir()
    before = {"HOME": str(real), "XDG_CACHE_HOME": str(real / "xdg-cache"), "TORCH_EXTENSIONS_DIR": str(real / "ext"),
              "CCACHE_DIR": "/ccache/of/the/run", "PATH": "/usr/bin"}
    home = tmp_path / "home"

    after = isolated_environment(before, home)

    assert after["HOME"] == str(home) and after["PATH"] == "/usr/bin"
    assert all(Path(after[name]).is_relative_to(home) for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                                                                   "XDG_DATA_HOME", "XDG_STATE_HOME"))
    assert "TORCH_EXTENSIONS_DIR" not in after
    assert after["PIP_CONFIG_FILE"] == str(real / ".config" / "pip" / "pip.conf")
    assert after["PIP_CACHE_DIR"] == str(real / "xdg-cache" / "pip")
    assert after["PYENV_ROOT"] == str(real / ".pyenv")
    assert after["CCACHE_DIR"] == "/ccache/of/the/run"  # already chosen (scripts/test.sh): kept as it was
