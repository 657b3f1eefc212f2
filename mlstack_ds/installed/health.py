"""What is installed now, judged against a receipt: the one answer `status`, `install` and `doctor` share.

Why here and not in the install stage: doctor needs this judgement, and must never import the builder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.detect.target_probe import TargetFacts, probe_target
from mlstack_ds.errors import UsageError
from mlstack_ds.installed.build_record import read_deepspeed_build
from mlstack_ds.installed.integrity import FileCheck, check_files
from mlstack_ds.installed.receipt import Receipt


@dataclass(frozen=True)
class InstalledState:
    prefix: str  # the environment (sys.prefix): where the receipt lives
    deepspeed_version: str | None
    deepspeed_location: str | None
    prebuilt_ops: tuple[str, ...]
    torch_version: str | None
    record: str | None = None  # the installed DeepSpeed's *.dist-info/RECORD (what pip installed)
    site_packages: tuple[str, ...] = ()  # where pip puts DeepSpeed (the change journal's guard goes there)


@dataclass(frozen=True)
class Health:
    """Whether the environment still holds what a receipt describes; if not, why (one line each)."""

    problems: tuple[str, ...]
    files: FileCheck | None = None

    @property
    def intact(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"intact": self.intact, "problems": list(self.problems),
                "files": self.files.to_dict() if self.files else None}


def check_health(receipt: Receipt, state: InstalledState) -> Health:
    """The one judgement `status`, `install` and `doctor` share: version, ops and torch as recorded, and
    every installed file as pip's RECORD lists it (a deleted op library changes neither version nor
    DeepSpeed's build record)."""
    if state.deepspeed_version is None:
        return Health((f"DeepSpeed {receipt.deepspeed_version} (the receipt's) is not installed any more: "
                       "removed with pip?",))
    problems = []
    if state.deepspeed_version != receipt.deepspeed_version:
        problems.append(f"DeepSpeed {state.deepspeed_version} is installed, the receipt says "
                        f"{receipt.deepspeed_version}: it was replaced by something else")
    if set(state.prebuilt_ops) != set(receipt.ops):
        problems.append(f"prebuilt ops are {', '.join(sorted(state.prebuilt_ops)) or 'none'}; the receipt says "
                        f"{', '.join(sorted(receipt.ops)) or 'none'}")
    if state.torch_version != receipt.torch_version:
        problems.append(f"torch is {state.torch_version or 'not installed'}; DeepSpeed's ops were built for "
                        f"torch {receipt.torch_version}")
    files = check_files(state.record) if state.record else None
    if files is None:
        problems.append("the installed DeepSpeed has no RECORD: it is not the wheel mlstack-ds installed")
    elif not files.ok:
        problems.append(f"installed files changed: {files.summary()}")
    return Health(tuple(problems), files)


def probe_installed(python: str) -> InstalledState:
    """What the target has now, read without importing deepspeed or torch (fast, side-effect free): the
    target probe's first line (`quick`) says where its packages are, DeepSpeed's build record which ops."""
    return installed_state(probe_target(Path(python), torch=False), python)


def installed_state(facts: TargetFacts, python: str) -> InstalledState:
    """`InstalledState` from a probe's answer, fresh or one the command already has (install reuses
    detect's). An interpreter that did not answer is a usage error: an empty prefix would mean "the
    current directory" to callers."""
    if not facts.answered or not facts.python.prefix:
        raise UsageError(f"--python {python}: not a working Python interpreter"
                         + (f" ({facts.problem})" if facts.problem else ""),
                         hint="pass a venv's bin/python (or the venv directory)")
    location = facts.deepspeed_package  # where `import deepspeed` loads from: its build record is there
    build = read_deepspeed_build(Path(location), warnings=[]) if location else None
    return InstalledState(
        prefix=facts.python.prefix,
        deepspeed_version=facts.deepspeed.version if location and facts.deepspeed else None,
        deepspeed_location=location,
        prebuilt_ops=tuple(build.prebuilt_ops) if build else (),
        torch_version=facts.torch_version,
        record=facts.deepspeed_record if location else None,
        site_packages=facts.python.site_packages,
    )
