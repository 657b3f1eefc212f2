"""The pieces behind issue 28's fixes, on real files and real processes: the cache entry's hash check, the
environment's lock across processes, the import guard, and what a repair clears (the end-to-end runs are in
tests/e2e/test_install_faults_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from mlstack_ds.build.wheel import checked_entry
from mlstack_ds.errors import BuildError, InstallError
from mlstack_ds.install.repair import is_pip_stash, scrub_interrupted
from mlstack_ds.installed.journal import Journal, begin_change, end_change, read_journal
from mlstack_ds.installed.lock import is_locked, target_lock
from mlstack_ds.source.cache import sha256_of


def _entry(tmp_path: Path, content: bytes = b"print('hi')\n", record: bool = True) -> Path:
    entry = tmp_path / "wheels" / "key"
    entry.mkdir(parents=True)
    wheel = entry / "deepspeed-0.19.5-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("deepspeed/__init__.py", content * 200)
    meta = {"source_commit": "c" * 40, "tree_hash": "t" * 40, "plan": {}, "log": ""}
    if record:
        meta["wheel_sha256"] = sha256_of(wheel)
    (entry / "build.json").write_text(json.dumps(meta))
    return wheel


def test_a_cached_wheel_is_checked_against_the_hash_recorded_at_build_time(tmp_path: Path) -> None:
    wheel = _entry(tmp_path)
    meta, digest = checked_entry(wheel)
    assert digest == meta["wheel_sha256"] == sha256_of(wheel)
    recorded = digest
    with zipfile.ZipFile(wheel, "w") as archive:  # still a valid zip, but not the wheel that was built
        archive.writestr("deepspeed/__init__.py", "print('changed')\n")
    with pytest.raises(BuildError) as raised:
        checked_entry(wheel)
    assert f"cached wheel {wheel} is corrupt (sha256 {sha256_of(wheel)} != {recorded}" in raised.value.message
    assert "--rebuild" in raised.value.hint


def test_an_entry_made_before_hashes_were_recorded_is_checked_by_its_crcs_then_recorded(tmp_path: Path) -> None:
    wheel = _entry(tmp_path, record=False)
    _, digest = checked_entry(wheel)
    assert json.loads((wheel.parent / "build.json").read_text())["wheel_sha256"] == digest
    other = _entry(tmp_path / "other", record=False)
    data = bytearray(other.read_bytes())
    data[60] ^= 0x01  # inside the compressed member
    other.write_bytes(bytes(data))
    with pytest.raises(BuildError, match="is corrupt"):
        checked_entry(other)
    assert "wheel_sha256" not in json.loads((other.parent / "build.json").read_text())


def test_an_unreadable_build_record_is_a_corrupt_entry_not_a_traceback(tmp_path: Path) -> None:
    wheel = _entry(tmp_path)
    (wheel.parent / "build.json").write_text("{trunc")
    with pytest.raises(BuildError, match=r"build record build\.json is unreadable"):
        checked_entry(wheel)


HOLDER = """
import sys, time
from mlstack_ds.installed.lock import target_lock
with target_lock(sys.argv[1], "python"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_the_lock_is_held_across_processes_and_refused_or_waited_for(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert is_locked(tmp_path)
        with pytest.raises(InstallError) as refused, target_lock(tmp_path, "/env/bin/python", timeout_s=0):
            pass
        assert f"another mlstack-ds install into /env/bin/python (pid {holder.pid}) is still running" in (
            refused.value.message)
        said: list[str] = []
        started = time.monotonic()
        with pytest.raises(InstallError), target_lock(tmp_path, "/env/bin/python", timeout_s=0.5, waiting=said.append):
            pass
        assert time.monotonic() - started >= 0.5
        assert said == [f"waiting for another mlstack-ds install into /env/bin/python (pid {holder.pid}) to finish "
                        "(at most 0.5 s: --lock-timeout)"]
    finally:
        holder.kill()
        holder.wait()
    with target_lock(tmp_path, "python", timeout_s=0) as lock:  # released by the kernel when the holder died
        assert not lock.waited
    assert not is_locked(tmp_path)


def test_the_guard_refuses_import_deepspeed_until_the_change_ends(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "deepspeed").mkdir(parents=True)
    (site / "deepspeed" / "__init__.py").write_text("__version__ = 'x'\n")
    journal = begin_change(tmp_path, [str(site)], Journal("install", 1234, "now", "0.19.5", "0.19.8", "py"))
    assert read_journal(tmp_path) == journal
    probe = ("import site, sys; site.addsitedir(sys.argv[1]); import json\n"
             "try:\n import deepspeed; print('imported')\nexcept ImportError as e: print(e)")
    guarded = subprocess.run([sys.executable, "-c", probe, str(site)], capture_output=True, text=True, check=True)
    assert "is being changed by `mlstack-ds install` (pid 1234" in guarded.stdout
    assert "DeepSpeed 0.19.5 -> 0.19.8" in guarded.stdout
    end_change(tmp_path, journal)
    assert read_journal(tmp_path) is None
    free = subprocess.run([sys.executable, "-c", probe, str(site)], capture_output=True, text=True, check=True)
    assert free.stdout.strip() == "imported"


def test_a_repair_clears_pips_stash_and_files_no_record_owns(tmp_path: Path) -> None:
    assert is_pip_stash("~eepspeed") and is_pip_stash("~eepspeed-0.19.5.dist-info") and is_pip_stash("~-epspeed")
    assert not is_pip_stash("~orch") and not is_pip_stash("deepspeed") and not is_pip_stash("~d")
    for name in ("~eepspeed/x.py", "~eepspeed-0.19.5.dist-info/RECORD", "deepspeed/__init__.py",
                 "deepspeed-0.19.8.dist-info/METADATA", "~orch/keep.py", "torch/keep.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    removed = scrub_interrupted([str(tmp_path)])
    assert sorted(removed) == ["deepspeed", "deepspeed-0.19.8.dist-info", "~eepspeed", "~eepspeed-0.19.5.dist-info"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torch", "~orch"]
