"""A HOME of the test run's own, so that no test reads this machine's per-user state.

Why: doctor reads `~/.cache/torch_extensions` (a stale JIT lock left there by an unrelated killed process
once made test_doctor_fix_commands_are_whole fail: its age went from "7 min old" to "8 min old" between the
test's two doctor calls), DeepSpeed's launcher reads `~/.deepspeed_env`, and mlstack-ds's default cache is
under `~/.cache`. What the run keeps from the real home is named here, because a fresh machine needs it
too: pip's configuration (where the package index is) and cache, ccache's cache, and pyenv's root (its
shims find the interpreters through it).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path

MARKER = "MLSTACK_TEST_HOME"  # set once by the first process of a run; xdist's workers inherit it
PER_USER_DIRS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
DROPPED = ("TORCH_EXTENSIONS_DIR",)  # the JIT cache follows HOME; a test that needs its own sets it


def real_home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)


def kept_from_home(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that keep pointing at the real home's pip, ccache and pyenv (unless already set)."""
    home = real_home(environ)
    config = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    cache = Path(environ.get("XDG_CACHE_HOME") or home / ".cache")
    kept = {"PIP_CACHE_DIR": str(cache / "pip"), "CCACHE_DIR": str(cache / "ccache")}
    pip_config = next((path for path in (config / "pip" / "pip.conf", home / ".pip" / "pip.conf") if path.exists()),
                      None)
    if pip_config is not None:
        kept["PIP_CONFIG_FILE"] = str(pip_config)
    if (home / ".pyenv").is_dir():
        kept["PYENV_ROOT"] = str(home / ".pyenv")
    return {name: value for name, value in kept.items() if name not in environ}


def isolated_environment(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """`environ` with HOME at `home` and every per-user directory inside it, plus what is kept."""
    changed = {name: value for name, value in environ.items() if name not in PER_USER_DIRS + DROPPED}
    changed.update(kept_from_home(environ))
    changed.update({"HOME": str(home), MARKER: str(home), "XDG_CACHE_HOME": str(home / ".cache"),
                    "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local" / "share"),
                    "XDG_STATE_HOME": str(home / ".local" / "state")})
    return changed
