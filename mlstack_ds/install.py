"""Install stage: put a built wheel into the target environment, record a receipt, undo on request.

Why `--no-deps` plus a torch constraint: pip must never replace the user's ROCm torch with a CUDA
wheel from PyPI. DeepSpeed's other requirements are installed first, with torch pinned to the
installed version; then the wheel itself without dependencies; then torch is checked unchanged.
The environment is only touched here, after the wheel exists.
"""

from __future__ import annotations

import contextlib
import json
import signal
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from mlstack_ds import __version__
from mlstack_ds.build import BuiltWheel
from mlstack_ds.deepspeed_build import read_deepspeed_build
from mlstack_ds.errors import InstallError, Interrupted, ToolError, UsageError
from mlstack_ds.plan import BuildPlan
from mlstack_ds.receipt import PreviousInstall, Receipt, read_receipt, remove_receipt, write_receipt
from mlstack_ds.runner import run

# Never installed or upgraded as a side effect: the user's accelerator stack.
PROTECTED = frozenset({"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm"})
PIP_TIMEOUT_S = 1800.0

INSTALLED_PROBE = r"""
import importlib.util, json, sys
from importlib import metadata
out = {"prefix": sys.prefix, "deepspeed": None, "deepspeed_version": None, "torch": None}
for name, key in (("torch", "torch"), ("deepspeed", "deepspeed_version")):
    try:
        out[key] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
spec = importlib.util.find_spec("deepspeed")
if spec is not None and spec.submodule_search_locations:
    out["deepspeed"] = list(spec.submodule_search_locations)[0]
print("MLSTACK_INSTALLED:" + json.dumps(out))
"""


@dataclass(frozen=True)
class InstalledState:
    prefix: str  # the environment (sys.prefix): where the receipt lives
    deepspeed_version: str | None
    deepspeed_location: str | None
    prebuilt_ops: tuple[str, ...]
    torch_version: str | None


def probe_installed(python: str) -> InstalledState:
    """What the target has now, read without importing deepspeed or torch (fast, side-effect free):
    the interpreter says where its packages are, DeepSpeed's build record says which ops it has."""
    result = run([python, "-c", INSTALLED_PROBE], timeout=60)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("MLSTACK_INSTALLED:")), None)
    if not result.ok or line is None:  # an empty prefix would mean "the current directory" to callers
        raise UsageError(f"--python {python}: not a working Python interpreter"
                         + (f" ({result.tail(1)})" if result.tail(1) else ""),
                         hint="pass a venv's bin/python (or the venv directory)")
    data = json.loads(line.removeprefix("MLSTACK_INSTALLED:"))
    location = data.get("deepspeed")
    build = read_deepspeed_build(Path(location), warnings=[]) if location else None
    return InstalledState(
        prefix=data["prefix"],
        deepspeed_version=data.get("deepspeed_version") if location else None,
        deepspeed_location=location,
        prebuilt_ops=tuple(build.prebuilt_ops) if build else (),
        torch_version=data.get("torch"),
    )


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist, minus torch & co. and extras-only requirements."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode("utf-8", "replace")
    keep = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        text = line.split(":", 1)[1].strip()
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.name.lower() in PROTECTED or (requirement.marker and "extra" in str(requirement.marker)):
            continue
        keep.append(text)
    return keep


@contextlib.contextmanager
def signals_deferred(done: str = "the change was completed") -> Iterator[None]:
    """Hold Ctrl-C/SIGTERM during the few seconds pip swaps packages; act on them right after.

    An interrupt between pip's uninstall and install would leave no DeepSpeed at all, and one
    between the install and the receipt would leave a receipt that lies.
    """
    received: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise Interrupted(f"interrupted, after the step that was running finished: {done}",
                          hint="the environment is consistent; `mlstack-ds status` shows it")


def _pip(python: str, *args: str, what: str) -> None:
    try:
        result = run([python, "-m", "pip", *args], timeout=PIP_TIMEOUT_S)
    except ToolError as exc:
        raise InstallError(f"{what}: {exc.message}", hint=exc.hint) from exc
    if not result.ok:
        raise InstallError(f"{what} failed: {result.tail(1)}", hint="see pip's message above; nothing was changed"
                           if "install" in args else "")


def install_wheel(
    plan: BuildPlan,
    built: BuiltWheel,
    prefix: str,
    status: Callable[[str], None] = lambda _msg: None,
) -> Receipt:
    """Install `built` into the plan's interpreter and write the receipt. Torch is left untouched."""
    python = plan.target_python
    before = probe_installed(python)
    old_receipt = read_receipt(prefix)
    requirements = wheel_requirements(built.wheel)
    with tempfile.TemporaryDirectory(prefix="mlstack-ds-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"torch=={before.torch_version}\n" if before.torch_version else "")
        if requirements:
            status(f"installing DeepSpeed's requirements ({len(requirements)}), torch held at {before.torch_version}")
            _pip(python, "install", "--quiet", "--constraint", str(constraints), *requirements,
                 what="installing DeepSpeed's requirements")
    status(f"installing {built.wheel.name}")
    with signals_deferred(f"DeepSpeed {plan.deepspeed_version} was installed and its receipt written"):
        _pip(python, "install", "--quiet", "--no-deps", "--force-reinstall", str(built.wheel),
             what="installing the DeepSpeed wheel")
        receipt = _checked_receipt(plan, built, before, old_receipt)
        write_receipt(prefix, receipt)
    return receipt


def _checked_receipt(plan: BuildPlan, built: BuiltWheel, before: InstalledState, old_receipt: Receipt | None
                     ) -> Receipt:
    """Check what pip installed (torch untouched, the planned ops) and describe it."""
    python = plan.target_python
    after = probe_installed(python)
    if after.torch_version != before.torch_version:
        raise InstallError(f"torch changed from {before.torch_version} to {after.torch_version} during install",
                           hint="this is a bug; reinstall your PyTorch build and report it")
    if set(after.prebuilt_ops) != set(plan.built_ops):
        raise InstallError(
            f"installed DeepSpeed reports prebuilt ops {list(after.prebuilt_ops)}, the plan built "
            f"{list(plan.built_ops)}",
            hint="another DeepSpeed may shadow this one on sys.path; check `mlstack-ds status`",
        )
    receipt = Receipt(
        deepspeed_version=after.deepspeed_version or plan.deepspeed_version, recipe=plan.recipe,
        source=plan.source, source_commit=built.source_commit, source_pin=plan.source_pin,
        patches=[{"name": p.name, "sha256": p.sha256} for p in plan.patches], tree_hash=built.tree_hash,
        platform=plan.platform, accelerator=plan.accelerator, archs=list(plan.archs),
        ops=list(plan.built_ops), flags=dict(plan.env), wheel=str(built.wheel), wheel_sha256=built.sha256,
        torch_version=after.torch_version or "", python=python, cache_key=plan.cache_key,
        installed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        previous=_previous(before, old_receipt, plan.cache_key), tool_version=__version__,
    )
    return receipt


def _previous(before: InstalledState, old: Receipt | None, cache_key: str) -> PreviousInstall:
    """What rollback should restore: a reinstall of the same plan keeps the older 'previous'."""
    if old is not None and old.cache_key == cache_key:
        return old.previous
    if old is not None and old.deepspeed_version == before.deepspeed_version:
        trimmed: dict[str, Any] = {k: v for k, v in old.to_dict().items() if k != "previous"}
        return PreviousInstall(old.deepspeed_version, old.wheel, trimmed)
    return PreviousInstall(before.deepspeed_version)


def rollback(python: str, prefix: str, status: Callable[[str], None] = lambda _msg: None) -> str:
    """Restore what was there before our last install; returns a one-line summary."""
    receipt = read_receipt(prefix)
    if receipt is None:
        raise InstallError(f"no mlstack-ds receipt in {prefix}", hint="nothing to roll back")
    previous = receipt.previous
    if previous.deepspeed_version is None:
        status("the environment had no DeepSpeed before: uninstalling ours")
        with signals_deferred():
            _pip(python, "uninstall", "--yes", "deepspeed", what="uninstalling DeepSpeed")
        remove_receipt(prefix)
        return "rolled back: DeepSpeed removed (there was none before)"
    if not previous.wheel or not Path(previous.wheel).is_file():
        raise InstallError(
            f"the previous DeepSpeed {previous.deepspeed_version} was not built by mlstack-ds or its wheel "
            "is no longer cached",
            hint=f"reinstall it yourself: pip install deepspeed=={previous.deepspeed_version}",
        )
    status(f"reinstalling {Path(previous.wheel).name}")
    with signals_deferred():
        _pip(python, "install", "--quiet", "--no-deps", "--force-reinstall", previous.wheel,
             what="reinstalling the previous DeepSpeed")
    if previous.receipt:
        write_receipt(prefix, Receipt.from_dict({**previous.receipt, "previous": None}))
    else:
        remove_receipt(prefix)
    return f"rolled back to DeepSpeed {previous.deepspeed_version}"


def uninstall(python: str, prefix: str) -> str:
    if read_receipt(prefix) is None:
        raise InstallError(f"DeepSpeed in {prefix} was not installed by mlstack-ds (no receipt)",
                           hint="remove it with pip if you mean to: pip uninstall deepspeed")
    with signals_deferred():
        _pip(python, "uninstall", "--yes", "deepspeed", what="uninstalling DeepSpeed")
    remove_receipt(prefix)
    return "DeepSpeed uninstalled"
