"""Fake system package managers for scripts/install_deepspeed.sh's `--with-system-deps`: apt-get, dnf,
zypper, their package queries (dpkg-query, rpm), sudo and id, as executables on PATH that record their
argv. A test must never install system packages for real, so these are the one fake besides the hardware.

`FakePackageHost` is a host with one package manager and a given set of installed packages; its fake
installs add to that set, so the wrapper's checks after an install see the result. Only the fakes and a
few real tools (`REAL_TOOLS`, linked) are on its PATH: the real machine's apt-get stays out of reach.
`guard_bin` is the other use: real tools stay on PATH (a full end-to-end run) and any package manager
call fails the run loudly.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

MANAGERS = ("apt-get", "dnf", "zypper")
# What the wrapper runs besides the fakes, up to its first use of Python (the tests end it there).
REAL_TOOLS = ("bash", "dirname", "sed", "grep", "cat", "env", "mktemp", "rm", "true")

# Each fake appends "name argv..." to $FAKE_PKG_LOG. Installing adds the packages to $FAKE_PKG_STATE/installed.
_RECORD = 'printf "%s\\n" "$(/usr/bin/basename "$0") $*" >> "$FAKE_PKG_LOG"'
_INSTALL = ('for a in "$@"; do case $a in -*|install|in) ;; *) printf "%s\\n" "$a" >> "$FAKE_PKG_STATE/installed";; '
            "esac; done")
_IS_INSTALLED = '/bin/grep -qxF "$1" "$FAKE_PKG_STATE/installed"'
SCRIPTS = {
    "apt-get": f'{_RECORD}\n[ "$1" = update ] && exit 0\nshift\n{_INSTALL}\n',
    "dnf": f"{_RECORD}\nshift\n{_INSTALL}\n",
    "zypper": f"{_RECORD}\nshift\n{_INSTALL}\n",
    "dpkg-query": (f'{_RECORD}\nfor pkg; do :; done\nset -- "$pkg"\n'
                   f'{_IS_INSTALLED} && {{ printf "install ok installed"; exit 0; }}\n'
                   'echo "dpkg-query: no packages found matching $1" >&2; exit 1\n'),
    "rpm": (f'{_RECORD}\nfor pkg; do :; done\nset -- "$pkg"\n'
            f'{_IS_INSTALLED} && {{ echo "$1-1.0-1.x86_64"; exit 0; }}\necho "package $1 is not installed"; exit 1\n'),
    "id": f'{_RECORD}\n/bin/cat "$FAKE_PKG_STATE/uid"\n',
    # `sudo -n true` answers whether passwordless sudo works; `sudo -n CMD...` runs CMD (the fakes).
    "sudo": (f'{_RECORD}\n[ -f "$FAKE_PKG_STATE/sudo" ] || {{ echo "sudo: a password is required" >&2; exit 1; }}\n'
             '[ "$1" = -n ] && shift\nexec "$@"\n'),
}


@dataclass
class FakePackageHost:
    root: Path
    manager: str = "apt-get"
    installed: tuple[str, ...] = ()
    uid: int = 0
    sudo: bool = False
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.bin = self.root / "bin"
        self.state = self.root / "state"
        for directory in (self.bin, self.state):
            directory.mkdir(parents=True, exist_ok=True)
        self.log = self.root / "calls.log"
        self.log.write_text("")
        (self.state / "installed").write_text("".join(f"{p}\n" for p in self.installed))
        (self.state / "uid").write_text(f"{self.uid}\n")
        if self.sudo:
            (self.state / "sudo").write_text("")
        query = "dpkg-query" if self.manager == "apt-get" else "rpm"
        for name in (self.manager, query, "id", "sudo"):
            write_script(self.bin / name, SCRIPTS[name])
        for tool in REAL_TOOLS:
            real = shutil.which(tool)
            assert real is not None, f"{tool} is not installed on this machine"
            (self.bin / tool).symlink_to(real)

    def env(self, *, real_path: bool = False) -> dict[str, str]:
        """The wrapper's environment on this host: only the fakes (and REAL_TOOLS) on PATH, or with
        `real_path` the fakes before the real PATH (for a whole run; apt-get hosts only, as the fake
        apt-get then shadows a real one but a fake dnf would not)."""
        path = f"{self.bin}{os.pathsep}{os.environ['PATH']}" if real_path else str(self.bin)
        return {"PATH": path, "FAKE_PKG_LOG": str(self.log), "FAKE_PKG_STATE": str(self.state)}

    def calls(self, *names: str) -> list[list[str]]:
        """The recorded calls (argv split), only those of `names` when given."""
        lines = [shlex.split(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [argv for argv in lines if not names or argv[0] in names]

    def now_installed(self) -> list[str]:
        return (self.state / "installed").read_text().split()


def guard_bin(root: Path) -> Path:
    """A directory to put first on PATH: apt-get, dnf, zypper and sudo that record their call and fail
    (exit 100), so a run that would install system packages for real fails instead. Calls go to
    `root/calls.log`."""
    root.mkdir(parents=True, exist_ok=True)
    log = root / "calls.log"
    for name in (*MANAGERS, "sudo"):
        write_script(root / name, f'printf "%s\\n" "{name} $*" >> {shlex.quote(str(log))}\n'
                                  f'echo "{name}: a test must not change the system\'s packages" >&2\nexit 100\n')
    return root


def write_script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
