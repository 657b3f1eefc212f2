"""What the recording stand-ins saw, grouped by op: the compile lines a real ROCm build would run.

Why by link line: setuptools links each extension from its objects into
`.../deepspeed/ops/<group>/<NAME>_op.<abi>.so`, so the link names the op (DeepSpeed's builders call
every extension `<NAME>_op`) and lists the objects, and each object's compile line is the one whose
`-o` wrote it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_STD_RE = re.compile(r"^-std=(.+)$")
_OFFLOAD_RE = re.compile(r"^--offload-arch=(.+)$")
_WAVEFRONT_RE = re.compile(r"^-DROCM_WAVEFRONT_SIZE=(\d+)$")


@dataclass(frozen=True)
class Record:
    tool: str  # "hipcc", "gcc", "g++", "c++", "cc"
    kind: str  # "compile" | "link"
    argv: tuple[str, ...]
    output: str  # absolute
    cwd: str
    time_ns: int = 0
    syntax: dict[str, Any] | None = None  # Debian hipcc's -fsyntax-only verdict, when it was asked for

    @property
    def source(self) -> str | None:
        """The translation unit: the first operand after `-c`. setuptools puts it right there; torch's ninja
        rule writes `-c -c <source>` (its cflags carry a `-c` of their own)."""
        args = list(self.argv)
        after_c = args[args.index("-c") + 1:] if "-c" in args else []
        return next((a for a in after_c if not a.startswith("-")), None)

    @property
    def is_hip(self) -> bool:
        return self.tool == "hipcc"

    @property
    def std(self) -> tuple[str, ...]:
        return tuple(m.group(1) for a in self.argv if (m := _STD_RE.match(a)))

    @property
    def offload_archs(self) -> tuple[str, ...]:
        return tuple(m.group(1) for a in self.argv if (m := _OFFLOAD_RE.match(a)))

    @property
    def wavefront_defines(self) -> tuple[int, ...]:
        return tuple(int(m.group(1)) for a in self.argv if (m := _WAVEFRONT_RE.match(a)))


@dataclass
class OpBuild:
    name: str
    extension: str  # the shared object's file name
    compiles: list[Record] = field(default_factory=list)
    link: Record | None = None


def load_records(directory: Path) -> list[Record]:
    records = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        records.append(Record(str(data["tool"]), str(data["kind"]), tuple(data["argv"]), str(data["output"]),
                              str(data["cwd"]), int(data.get("time_ns", 0)), data.get("syntax")))
    return sorted(records, key=lambda r: r.time_ns)


def op_name_of_extension(shared_object: str) -> str:
    """`fused_adam_op.cpython-311-x86_64-linux-gnu.so` -> `fused_adam` (DeepSpeed's op NAME)."""
    return Path(shared_object).name.split(".", 1)[0].removesuffix("_op")


def group_by_op(records: Iterable[Record]) -> tuple[dict[str, OpBuild], list[Record]]:
    """Per-op builds, and the compile lines no link used (which would be a rehearsal defect).

    Records must be in time order: two ops may compile the same source to the same object path
    (transformer and stochastic_transformer do, with different defines), and each link takes the
    object as it was last compiled before it.
    """
    latest: dict[str, Record] = {}
    used: set[int] = set()
    ops: dict[str, OpBuild] = {}
    for record in records:
        if record.kind == "compile":
            latest[record.output] = record
            continue
        name = op_name_of_extension(record.output)
        build = ops.setdefault(name, OpBuild(name, Path(record.output).name))
        build.link = record
        for arg in record.argv:
            compiled = latest.get(os.path.normpath(os.path.join(record.cwd, arg)))
            if compiled is not None:
                build.compiles.append(compiled)
                used.add(id(compiled))
    orphans = [r for r in records if r.kind == "compile" and id(r) not in used]
    return dict(sorted(ops.items())), orphans
