"""DeepSpeed hostfiles: read with exactly DeepSpeed's grammar, and the ranks each node gets.

One reader for every command that takes `--hostfile` (doctor, install, verify), so that all of them refuse
up front what DeepSpeed's launcher would refuse after ssh-ing around, and accept all it accepts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import UsageError
from mlstack_ds.textfile import read_text


@dataclass(frozen=True)
class HostEntry:
    host: str
    slots: int


# DeepSpeed 0.19.5's own pattern (`deepspeed/launcher/runner.py: _parse_hostfile`), searched at the start
# of the stripped line: anything after `slots=N` is ignored there, so it is ignored here too.
_DS_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")
_HOSTFILE_HINT = ("DeepSpeed's hostfile format: one `hostname slots=N` line per node (no spaces around `=`), "
                  "`#` comments")


def parse_hostfile(path: Path) -> list[HostEntry]:
    """Read a hostfile with exactly DeepSpeed's grammar, so that `verify --hostfile` refuses up front what
    DeepSpeed's launcher would refuse after ssh-ing around (as a failed check), and accepts all it accepts.

    DeepSpeed (`fetch_hostfile`/`_parse_hostfile`): lines split like Python's text mode (`\\n`, `\\r\\n`,
    `\\r`), each stripped of whitespace; blank lines and lines *starting* with `#` are skipped; every other
    line must start with `host<whitespace>slots=<digits>` (what follows is ignored, so `node slots=8 # x`
    is fine, `node slots = 8` and `node` are not); `slots=0` is accepted; a host named twice and a file
    without hosts are refused. Each refusal here is one usage error naming the file, line and problem.
    One deliberate difference: DeepSpeed silently falls back to the local machine when the file does not
    exist (its default path is `/job/hostfile`); a hostfile the user named must exist.
    """
    text = read_text(path, error=UsageError, what="--hostfile",
                     hint="pass a DeepSpeed hostfile: one `hostname slots=N` line per node")
    entries: dict[str, HostEntry] = {}
    first_line: dict[str, int] = {}
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # universal newlines, as open()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _DS_HOSTFILE_LINE.search(line)
        if match is None:
            raise UsageError(f"--hostfile {path}:{number}: bad entry {line!r}: expected `hostname slots=N`",
                             hint=_HOSTFILE_HINT)
        host = match.group(1)
        try:
            slots = int(match.group(2))
        except ValueError as exc:  # more digits than Python converts (DeepSpeed fails the same way)
            raise UsageError(f"--hostfile {path}:{number}: slots= of {host} is not a usable number",
                             hint=_HOSTFILE_HINT) from exc
        if host in entries:
            raise UsageError(f"--hostfile {path}:{number}: host {host} is listed twice (first on line "
                             f"{first_line[host]})", hint="give each host one line, with all its slots")
        entries[host] = HostEntry(host, slots)
        first_line[host] = number
    if not entries:
        raise UsageError(f"--hostfile {path}: no hosts in it", hint="add `hostname slots=N` lines")
    return list(entries.values())


def hostfile_world_size(path: Path, hosts: Sequence[HostEntry]) -> int:
    """The ranks a hostfile asks for. DeepSpeed accepts `slots=0` on every line and then starts no rank;
    verify would then have nothing to check (and nothing to fail), so zero ranks is a usage error."""
    total = sum(h.slots for h in hosts)
    if total == 0:
        raise UsageError(f"--hostfile {path}: every host has slots=0, so no rank would run",
                         hint="give at least one host slots=N with N >= 1")
    return total


def rank_layout(hosts: Sequence[HostEntry]) -> dict[str, list[int]]:
    """{host: its global ranks}, as DeepSpeed's launcher numbers them: hosts in hostfile order, each
    taking `slots` consecutive ranks; a `slots=0` host runs none (and is left out)."""
    layout: dict[str, list[int]] = {}
    next_rank = 0
    for entry in hosts:
        if entry.slots:
            layout[entry.host] = list(range(next_rank, next_rank + entry.slots))
            next_rank += entry.slots
    return layout
