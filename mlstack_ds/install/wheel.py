"""Install stage: put a built wheel into the target environment, record a receipt, undo on request.

Why `--no-deps` plus a torch constraint: pip must never replace the user's ROCm torch with a CUDA
wheel from PyPI. DeepSpeed's other requirements are installed first, with torch pinned to the
installed version; then the wheel itself without dependencies; then torch is checked unchanged.
The environment is only touched here, after the wheel exists.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from mlstack_ds import __version__
from mlstack_ds.build.wheel import BuiltWheel
from mlstack_ds.errors import InstallError, Interrupted, MlstackError, ToolError
from mlstack_ds.install.repack import RepackError, repack_installed
from mlstack_ds.installed.health import InstalledState, probe_installed
from mlstack_ds.installed.integrity import check_files
from mlstack_ds.installed.journal import Journal, begin_change, end_change, lift_guard, now, read_journal
from mlstack_ds.installed.lock import TargetLock, target_lock
from mlstack_ds.installed.receipt import (
    PreviousInstall,
    Receipt,
    ReceiptError,
    kept_dir,
    read_receipt,
    receipt_path,
    remove_receipt,
    write_receipt,
)
from mlstack_ds.patience import WAITS
from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.runner import run
from mlstack_ds.source.cache import sha256_of

# Never installed or upgraded as a side effect: the user's accelerator stack.
PROTECTED = frozenset({"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm"})

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


def _pip(python: str, *args: str, what: str, lock: TargetLock | None = None,
         env: Mapping[str, str] | None = None) -> None:
    """pip in the target; it inherits the environment's lock, which so outlives a killed tool until pip ends.
    `env`: pip's whole environment when it must see nothing but a bundle (`install --offline`). No version
    check: its notice would be pip's last line, the one a failure quotes, in place of pip's error."""
    try:
        result = run([python, "-m", "pip", "--disable-pip-version-check", *args], patience=WAITS["pip install"],
                     pass_fds=(lock.fd,) if lock else (), env=env)
    except ToolError as exc:
        raise InstallError(f"{what}: {exc.message}", hint=exc.hint) from exc
    if not result.ok:
        raise InstallError(f"{what} failed: {result.tail(1)}", hint="see pip's message above; nothing was changed"
                           if "install" in args else "")


def install_wheel(
    plan: BuildPlan,
    built: BuiltWheel,
    prefix: str,
    *,
    status: Callable[[str], None] = lambda _msg: None,
    warn: Callable[[str], None] = lambda _msg: None,
    replace_bad_receipt: bool = False,
    before: InstalledState | None = None,
    lock: TargetLock | None = None,
    interrupted: Journal | None = None,
    origin: str | None = None,
    pip_source: tuple[tuple[str, ...], Mapping[str, str]] | None = None,
) -> Receipt:
    """Install `built` into the plan's interpreter and write the receipt. Torch is left untouched.
    A DeepSpeed we did not install is packed into a wheel first, so `rollback` can put it back.
    `replace_bad_receipt` (--force): an unusable receipt is replaced instead of stopping the install.
    `before`: what the environment holds, when the caller already probed it in this command (nothing
    but this function changes the environment, and the build in between never touches it).
    `lock`: the environment's lock the caller holds (pip inherits it). `interrupted`: the journal of an
    earlier change that was killed (this install repairs it: what was there before *that* change stays
    the previous install). The journal is written before pip swaps DeepSpeed and removed after the receipt.
    `origin`: where the wheel came from when it was not built here (an index wheel's URL, kept in the receipt).
    `pip_source`: pip's options and environment when it may use nothing but a bundle (`install --offline`:
    `--no-index`, the bundle's directories, no configuration); None: pip's own configuration."""
    python = plan.target_python
    if before is None:
        before = probe_installed(python)
    try:
        old_receipt = read_receipt(prefix)
    except ReceiptError as exc:
        if not replace_bad_receipt:
            raise
        warn(f"{exc.message}; it will be replaced")
        old_receipt = None
    ours = old_receipt is not None and old_receipt.deepspeed_version == before.deepspeed_version
    if interrupted is not None:
        previous = _previous_of_interrupted(interrupted, old_receipt, plan.cache_key)
    elif before.deepspeed_version is not None and not ours:
        note = (f" (the receipt describes DeepSpeed {old_receipt.deepspeed_version})" if old_receipt
                else " (no usable receipt)" if receipt_path(prefix).exists() else "")
        previous = _keep_foreign(before, prefix, note, warn)
    else:
        previous = _previous(before, old_receipt, plan.cache_key)
    requirements = wheel_requirements(built.wheel)
    source_args, source_env = pip_source if pip_source is not None else ((), None)
    with tempfile.TemporaryDirectory(prefix="mlstack-ds-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"torch=={before.torch_version}\n" if before.torch_version else "")
        if requirements:
            status(f"installing DeepSpeed's requirements ({len(requirements)}), torch held at {before.torch_version}")
            _pip(python, "install", "--quiet", *source_args, "--constraint", str(constraints), *requirements,
                 what="installing DeepSpeed's requirements", lock=lock, env=source_env)
    status(f"installing {built.wheel.name}")
    with signals_deferred(f"DeepSpeed {plan.deepspeed_version} was installed and its receipt written"):
        journal = begin_change(prefix, before.site_packages, Journal(
            "install", os.getpid(), now(), interrupted.from_version if interrupted else before.deepspeed_version,
            plan.deepspeed_version, python, asdict(previous)))
        try:
            _pip(python, "install", "--quiet", *source_args, "--no-deps", "--force-reinstall", str(built.wheel),
                 what="installing the DeepSpeed wheel", lock=lock, env=source_env)
        except InstallError:  # pip put the old files back itself
            end_change(prefix, journal)
            _prune_kept(prefix, keep=old_receipt.previous.wheel if old_receipt else None)
            raise
        lift_guard(journal)  # the files are complete: the check below finds DeepSpeed the way imports do
        try:
            receipt = _checked_receipt(plan, built, before, previous, origin)
        except MlstackError:  # a complete install, not the planned one: reported, not interrupted
            end_change(prefix, journal)
            raise
        write_receipt(prefix, receipt)
        end_change(prefix, journal)
    _prune_kept(prefix, keep=receipt.previous.wheel)
    return receipt


def _previous_of_interrupted(journal: Journal, old: Receipt | None, cache_key: str) -> PreviousInstall:
    """The previous install when repairing: the interrupted change never wrote its receipt, so the receipt
    in place is the one from before it; reinstalling that plan keeps its previous (as `_previous` does),
    anything else records what the interrupted change had recorded."""
    if old is not None and old.cache_key == cache_key:
        return old.previous
    if journal.previous is not None:
        try:
            return PreviousInstall(**journal.previous)
        except TypeError:
            pass
    return PreviousInstall(journal.from_version)


def _checked_receipt(plan: BuildPlan, built: BuiltWheel, before: InstalledState, previous: PreviousInstall,
                     origin: str | None = None) -> Receipt:
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
        previous=previous, tool_version=__version__, origin=origin,
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


def _keep_foreign(before: InstalledState, prefix: str, note: str, warn: Callable[[str], None]) -> PreviousInstall:
    """A DeepSpeed someone else installed is about to be replaced: say so, and keep an exact copy (its
    installed files packed into a wheel in the environment) so `rollback` restores it offline."""
    what = f"DeepSpeed {before.deepspeed_version} in {prefix} was not installed by mlstack-ds{note}"
    if before.record is None:
        warn(f"{what} and has no RECORD to copy it from; replacing it anyway: rollback cannot restore it "
             f"(reinstall it yourself: pip install deepspeed=={before.deepspeed_version})")
        return PreviousInstall(before.deepspeed_version)
    found = check_files(before.record)
    try:
        wheel = repack_installed(before.record, prefix, kept_dir(prefix))
    except RepackError as exc:
        warn(f"{what}; cannot keep a copy of it ({exc}); replacing it anyway: rollback cannot restore it "
             f"(reinstall it yourself: pip install deepspeed=={before.deepspeed_version})")
        return PreviousInstall(before.deepspeed_version)
    warn(f"{what}: replacing it; `mlstack-ds rollback` restores it from the copy kept in {wheel}"
         + ("" if found.ok else f" (copied as found: {found.summary()})"))
    return PreviousInstall(before.deepspeed_version, str(wheel), None, sha256_of(wheel))


def _prune_kept(prefix: str, keep: str | None) -> None:
    """Remove kept copies no receipt refers to any more (the directory holds only what rollback needs)."""
    directory = kept_dir(prefix)
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if keep is None or path.resolve() != Path(keep).resolve():
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when empty


@contextlib.contextmanager
def locked_for_change(state: InstalledState, python: str, what: str, *, lock_timeout: float | None = None,
                      waiting: Callable[[str], None] = lambda _msg: None
                      ) -> Iterator[tuple[TargetLock, InstalledState]]:
    """For rollback and uninstall: hold the environment's lock (re-probing when another change ran
    meanwhile) and refuse to act on an interrupted change: `install` repairs it."""
    with target_lock(state.prefix, python, timeout_s=lock_timeout, waiting=waiting) as lock:
        if lock.waited:
            state = probe_installed(python)
        interrupted = read_journal(state.prefix)
        if interrupted is not None:
            raise InstallError(f"{interrupted.describe()} was interrupted in {state.prefix}; not {what} over it",
                               hint=f"`mlstack-ds install --python {python}` repairs it first (with the options of "
                               "the install you want)")
        yield lock, state


@contextlib.contextmanager
def journaled(state: InstalledState, python: str, action: str, to_version: str | None) -> Iterator[None]:
    """The journal and import guard around a pip call that swaps DeepSpeed (rollback, uninstall), removed
    when the block ends (after the receipt is in its new state) or fails (pip put things back)."""
    journal = begin_change(state.prefix, state.site_packages, Journal(
        action, os.getpid(), now(), state.deepspeed_version, to_version, python))
    try:
        yield
    finally:
        end_change(state.prefix, journal)


def rollback(python: str, probed: InstalledState, status: Callable[[str], None] = lambda _msg: None,
             lock_timeout: float | None = None, waiting: Callable[[str], None] = lambda _msg: None) -> str:
    """Restore what was there before our last install; returns a one-line summary. Holds the environment's
    lock (`lock_timeout`, `waiting` as for install); `probed`: the caller's probe."""
    with locked_for_change(probed, python, "rolling back", lock_timeout=lock_timeout, waiting=waiting) as (
            lock, state):
        return _rollback(python, state, lock, status)


def _rollback(python: str, state: InstalledState, lock: TargetLock, status: Callable[[str], None]) -> str:
    prefix = state.prefix
    receipt = read_receipt(prefix)
    if receipt is None:
        raise InstallError(f"no mlstack-ds receipt in {prefix}", hint="nothing to roll back")
    previous = receipt.previous
    if previous.deepspeed_version is None:
        status("the environment had no DeepSpeed before: uninstalling ours")
        with signals_deferred(), journaled(state, python, "rollback", None):
            _pip(python, "uninstall", "--yes", "deepspeed", what="uninstalling DeepSpeed", lock=lock)
            remove_receipt(prefix)
        _prune_kept(prefix, keep=None)
        return "rolled back: DeepSpeed removed (there was none before)"
    if not previous.wheel or not Path(previous.wheel).is_file():
        raise InstallError(
            f"the previous DeepSpeed {previous.deepspeed_version} was not built by mlstack-ds or its wheel "
            "is no longer cached",
            hint=f"reinstall it yourself: pip install deepspeed=={previous.deepspeed_version}",
        )
    # The kept copy's hash, or the cached build's (recorded in its receipt when it was installed).
    expected = previous.wheel_sha256 or (previous.receipt or {}).get("wheel_sha256")
    if expected and sha256_of(Path(previous.wheel)) != expected:
        what = "cached wheel" if previous.receipt else "kept copy"
        raise InstallError(f"the {what} of DeepSpeed {previous.deepspeed_version} ({previous.wheel}) was "
                           "modified since it was made; not installing it",
                           hint=f"reinstall it yourself: pip install deepspeed=={previous.deepspeed_version}"
                           if not previous.receipt else "`mlstack-ds install --rebuild` with that version's "
                           "options builds it again")
    status(f"reinstalling {Path(previous.wheel).name}")
    with signals_deferred(), journaled(state, python, "rollback", previous.deepspeed_version):
        _pip(python, "install", "--quiet", "--no-deps", "--force-reinstall", previous.wheel,
             what="reinstalling the previous DeepSpeed", lock=lock)
        if previous.receipt:
            write_receipt(prefix, Receipt.from_dict({**previous.receipt, "previous": None}))
        else:
            remove_receipt(prefix)
    _prune_kept(prefix, keep=None)
    origin = "" if previous.receipt else " (the one mlstack-ds had replaced, from the copy it kept)"
    return f"rolled back to DeepSpeed {previous.deepspeed_version}{origin}"


def uninstall(python: str, probed: InstalledState, lock_timeout: float | None = None,
              waiting: Callable[[str], None] = lambda _msg: None) -> tuple[str, str]:
    """Remove the DeepSpeed our receipt describes; returns (action, summary). Like `pip uninstall` of
    something not installed, nothing of ours to remove is not an error: ("skipped", why). `probed`: what
    the caller's probe found (the command asks the interpreter once). Holds the environment's lock."""
    with locked_for_change(probed, python, "uninstalling", lock_timeout=lock_timeout, waiting=waiting) as (
            lock, state):
        prefix = state.prefix
        receipt = read_receipt(prefix)
        if receipt is None:
            other = (f"; DeepSpeed {state.deepspeed_version} there was installed by something else "
                     "(pip uninstall deepspeed removes it)" if state.deepspeed_version else "")
            return "skipped", f"Skipping: nothing installed by mlstack-ds in {prefix}{other}"
        if state.deepspeed_version != receipt.deepspeed_version:
            with signals_deferred():
                remove_receipt(prefix)
                _prune_kept(prefix, keep=None)
            now_there = (f"DeepSpeed {state.deepspeed_version} there now is not ours and was left alone"
                         if state.deepspeed_version else "DeepSpeed was already removed")
            return "uninstalled", f"removed the receipt of DeepSpeed {receipt.deepspeed_version}: {now_there}"
        with signals_deferred(), journaled(state, python, "uninstall", None):
            _pip(python, "uninstall", "--yes", "deepspeed", what="uninstalling DeepSpeed", lock=lock)
            remove_receipt(prefix)
        _prune_kept(prefix, keep=None)
    return "uninstalled", "DeepSpeed uninstalled"
