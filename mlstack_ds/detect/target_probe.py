"""The one probe of the *target* interpreter (`--python`): one script, one parser, one `TargetFacts`.

Why one probe: detect, doctor, install/status and verify used to start the interpreter each with its
own script and parser, so an install started it again and again to be told the same things. Now every
question is answered by one script, target_side/mlstack_probe_target.py run by path in the target, in
two marked JSON lines:

1. `MLSTACK_TARGET_BASE:`, printed and flushed before torch is imported: the interpreter (executable,
   version, prefix, include dir), the installed DeepSpeed (version, location, package directory, RECORD),
   torch's *distribution* version and the `nvidia-*` packages, all from `importlib.metadata`. It is all
   that install, status and doctor's facts need, and it arrives even when torch's import hangs (a broken
   driver) or crashes: the caller keeps it after the time-out kills the process, or after it dies.
2. `MLSTACK_TARGET_TORCH:`, after `import torch`: version, HIP/CUDA, the build's arch list, devices.

`quick` (argv `quick`) stops after the first line: commands that need no torch facts (status, rollback,
uninstall, the check after pip installed) never pay for torch's import.

Why a subprocess: the target is often another venv, importing torch costs seconds and hundreds of MB,
and a broken torch must not take the CLI down with it. Why no module-level cache: the project keeps no
global state; a command that has the answer passes its `TargetFacts` on (`detect_with_target`,
`pipeline.Prepared.target`, `VerifyOptions.target`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.detect.marked import marked_object
from mlstack_ds.detect.model import DeepSpeedInfo, PythonInfo, RocmWheels, TorchDevice, TorchInfo
from mlstack_ds.errors import ToolError, ToolTimedOut
from mlstack_ds.patience import WAITS, Patience
from mlstack_ds.runner import Background, run_in_background
from mlstack_ds.target_side import mlstack_probe_target as probe_module
from mlstack_ds.target_side import script

BASE_MARKER, TORCH_MARKER = probe_module.BASE_MARKER, probe_module.TORCH_MARKER


@dataclass(frozen=True)
class TargetFacts:
    """Everything known about the target interpreter after one probe. Unknowns are `None`/empty and the
    reason is in `problem` (the interpreter did not answer) or `torch_error` (torch's facts are missing or
    incomplete): callers decide whether that is a warning (detect, doctor) or an error (install)."""

    python: PythonInfo
    answered: bool = False  # the first line arrived: this is a working Python interpreter
    problem: str | None = None  # why it did not answer (its last line of output, or the start failure)
    deepspeed: DeepSpeedInfo | None = None  # its distribution: version, location (site-packages)
    deepspeed_package: str | None = None  # where `import deepspeed` loads from (the package directory)
    deepspeed_record: str | None = None  # the installed DeepSpeed's *.dist-info/RECORD
    torch_version: str | None = None  # torch's distribution version (metadata: no import)
    nvidia_packages: tuple[str, ...] = ()
    rocm_wheels: RocmWheels | None = None  # TheRock's ROCm wheels (rocm_sdk) in the target
    clients: tuple[tuple[str, str], ...] = ()  # (distribution, version) of the probe's CLIENT_PACKAGES installed
    torch_probed: bool = False  # the second line arrived (torch imported, or known to be absent)
    torch: TorchInfo | None = None  # None: not installed, not importable, hung, or not asked (quick)
    torch_error: str | None = None

    @property
    def warnings(self) -> list[str]:
        return [w for w in (self.problem, self.torch_error) if w]


def unanswered(python: Path, problem: str) -> TargetFacts:
    """The facts of an interpreter that said nothing usable."""
    return TargetFacts(PythonInfo(executable=str(python), version="unknown"), problem=problem)


def parse_target_output(stdout: str, python: Path, *, torch_expected: bool = True,
                        interrupted: str | None = None) -> TargetFacts:
    """The probe's marked lines as `TargetFacts`; junk and missing lines give reasons, not exceptions.
    `interrupted`: why the process stopped early (time-out, exit code), said when a line is missing."""
    try:
        base = marked_object(stdout, BASE_MARKER)
        if base is None:
            return unanswered(python, interrupted or f"{python}: the target probe printed no result")
        facts = _parse_base(base)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return unanswered(python, f"{python}: unreadable target probe result ({exc})")
    if not torch_expected:
        return facts
    try:
        data = marked_object(stdout, TORCH_MARKER)
        if data is None:
            reason = interrupted or f"{python} printed no torch facts"
            return _replace(facts, torch_error=f"torch probe: {reason}")
        torch = _parse_torch(data.get("torch"))
        error = str(data["error"]) if data.get("error") else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return _replace(facts, torch_error=f"{python}: unreadable torch probe result ({exc})")
    return _replace(facts, torch_probed=True, torch=torch, torch_error=error)


def _parse_base(data: dict[str, Any]) -> TargetFacts:
    py = data["python"]
    ds = data.get("deepspeed")
    return TargetFacts(
        python=PythonInfo(executable=str(py["executable"]), version=str(py["version"]),
                          prefix=py.get("prefix") or None, include_dir=py.get("include_dir") or None,
                          site_packages=tuple(str(p) for p in py.get("site_packages") or () if p),
                          setuptools=py.get("setuptools") or None,
                          wheel_package=bool(py["wheel_package"]) if "wheel_package" in py else None),
        answered=True,
        deepspeed=DeepSpeedInfo(version=str(ds["version"]), location=ds.get("location")) if ds else None,
        deepspeed_package=data.get("deepspeed_package") or None,
        deepspeed_record=data.get("deepspeed_record") or None,
        torch_version=data.get("torch_version") or None,
        nvidia_packages=tuple(str(n) for n in data.get("nvidia") or ()),
        rocm_wheels=_parse_rocm_sdk(data.get("rocm_sdk")),
        clients=tuple(sorted((str(name), str(version)) for name, version in (data.get("clients") or {}).items())),
    )


def _parse_rocm_sdk(data: dict[str, Any] | None) -> RocmWheels | None:
    if not data:
        return None
    return RocmWheels(
        version=data.get("version") or None, version_source=data.get("version_source") or None,
        core=data.get("core") or None, devel_installed=bool(data.get("devel_installed")),
        devel_root=data.get("devel_root") or None, devel_expanded=bool(data.get("devel_expanded")),
        libraries=bool(data.get("libraries")), device_targets=tuple(str(d) for d in data.get("devices") or ()),
        scripts_dir=data.get("scripts") or None, problem=data.get("problem") or None,
    )


def _parse_torch(data: dict[str, Any] | None) -> TorchInfo | None:
    if not data:
        return None
    return TorchInfo(
        version=str(data["version"]),
        hip=data.get("hip") or None,
        cuda=data.get("cuda") or None,
        arch_list=[str(a) for a in data.get("arch_list") or []],
        device_count=int(data.get("device_count") or 0),
        devices=[TorchDevice(name=str(d.get("name", "")), gcn_arch_name=d.get("gcn_arch_name"))
                 for d in data.get("devices") or []],
        path=data.get("path") or None,
    )


def _replace(facts: TargetFacts, **changes: Any) -> TargetFacts:
    return TargetFacts(**{**facts.__dict__, **changes})


def start_target_probe(python: Path, environ: Mapping[str, str] | None = None, *, torch: bool = True,
                       patience: Patience | None = None) -> AbstractContextManager[Background]:
    """Start the probe in `python` (without torch's part when `torch` is false); collect the answer with
    `finish_target_probe` inside the block. `environ` None: this process's environment. `patience`:
    default patience.WAITS["target probe"] (the stall rule: a hung driver is stopped, a torch import
    thrashing under load keeps going)."""
    argv: list[str | os.PathLike[str]] = [python, script(probe_module), *(() if torch else ("quick",))]
    return run_in_background(argv, patience=patience if patience is not None else WAITS["target probe"],
                             env=dict(environ) if environ is not None else None)


def finish_target_probe(python: Path, pending: Background, *, torch: bool = True) -> TargetFacts:
    """The probe's answer. A missing or failing interpreter, or a torch import that hangs or crashes,
    never raises: whatever was printed before is kept (the first line survives a hung torch)."""
    try:
        result = pending.result()
    except ToolTimedOut as exc:
        return parse_target_output(pending.partial_stdout(), python, torch_expected=torch,
                                   interrupted=exc.message)
    except ToolError as exc:
        return unanswered(python, f"target probe: {exc.message}")
    interrupted = None
    if not result.ok:
        interrupted = f"{python} exited with {result.returncode}: {result.tail(3).replace(chr(10), ' | ')}"
    return parse_target_output(result.stdout, python, torch_expected=torch, interrupted=interrupted)


def probe_target(python: Path, environ: Mapping[str, str] | None = None, *, torch: bool = True,
                 patience: Patience | None = None) -> TargetFacts:
    """Start the probe and wait for its answer."""
    with start_target_probe(python, environ, torch=torch, patience=patience) as pending:
        return finish_target_probe(python, pending, torch=torch)
