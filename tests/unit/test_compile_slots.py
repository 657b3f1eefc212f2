"""Compile slots (build/compile_slots.py, target_side/mlstack_compile_slot.py): with the real ccache, the
compiles it runs take a slot each, so no more than the slots run at once (issue 43)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlstack_ds.build.compile_slots import compile_slot_env, slot_count
from mlstack_ds.build.wheel import build_time_env
from mlstack_ds.plan.buildjobs import BuildConcurrency
from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.target_side import mlstack_compile_slot

TWO_OPS_TWO_JOBS = BuildConcurrency(jobs=2, ops_at_once=2, jobs_per_op=2, archs_at_once=1, limit="cpus")


def plan(concurrency: BuildConcurrency | None = TWO_OPS_TWO_JOBS, ccache_dir: str = "/usr/lib/ccache") -> BuildPlan:
    return BuildPlan(schema=1, recipe="deepspeed-0.19.5", deepspeed_version="0.19.5", source="pypi",
                     source_pin="p" * 64, patches=(), platform="cpu", accelerator="cpu", archs=(), wavefront=None,
                     ops=(), env={}, path_prepend=(ccache_dir,) if ccache_dir else (), target_python=sys.executable,
                     python_version="3.11", torch_version="2.13.0+cpu", cache_key="k" * 24, concurrency=concurrency)


def test_slots_only_where_the_plan_runs_more_compilers_than_its_budget() -> None:
    assert slot_count(plan()) == 2  # four compilers may exist, two compile
    assert slot_count(plan(BuildConcurrency(1, 1, 1, 1, "--jobs"))) == 0
    assert slot_count(plan(BuildConcurrency(2, 1, 2, 1, "cpus"))) == 0  # one op at once: never more than 2
    assert slot_count(plan(None)) == 0
    rocm = BuildConcurrency(jobs=16, ops_at_once=5, jobs_per_op=3, archs_at_once=2, limit="cpus")
    assert slot_count(plan(rocm)) == 8  # each compile runs two archs' processes


def test_the_build_names_the_prefix_and_its_slots(tmp_path: Path) -> None:
    env = build_time_env(plan(), tmp_path / "tree", tmp_path, {})
    prefix = Path(env["CCACHE_PREFIX"])
    assert env["CCACHE_PREFIX_CPP"] == str(prefix) and os.access(prefix, os.X_OK)
    assert prefix.read_text().startswith(f"#!{sys.executable}\n")
    slots = Path(env[mlstack_compile_slot.SLOTS])
    assert sorted(p.name for p in slots.iterdir()) == ["slot-0", "slot-1"]
    assert build_time_env(plan(), tmp_path / "tree", tmp_path, {}) == env  # the build computes it twice


def test_a_users_prefix_or_no_ccache_gets_no_slots(tmp_path: Path) -> None:
    assert compile_slot_env(plan(), tmp_path, {"CCACHE_PREFIX": "distcc"}) == {}
    assert compile_slot_env(plan(), tmp_path, {"CCACHE_PREFIX_CPP": "icecc"}) == {}
    assert compile_slot_env(plan(ccache_dir=""), tmp_path, {}) == {}
    assert not (tmp_path / "compile-slots").exists()


@pytest.mark.skipif(not shutil.which("ccache"), reason="needs ccache (apt-get install ccache)")
@pytest.mark.parametrize("concurrency,overlap", [(BuildConcurrency(1, 2, 1, 1, "--jobs"), False),
                                                 (TWO_OPS_TWO_JOBS, True)])
def test_ccache_runs_no_more_compiles_at_once_than_slots(tmp_path: Path, concurrency: BuildConcurrency,
                                                         overlap: bool) -> None:
    """Two compiles through ccache at once, each by a g++ that logs when it runs and takes a second: with one
    slot (one op at a time would not need it: two ops of one job each) they follow each other, with two
    they overlap. Both the preprocessor run and the compile of each take a slot."""
    log = tmp_path / "runs.log"
    compiler = tmp_path / "bin" / "g++"
    compiler.parent.mkdir()
    compiler.write_text(f'#!/bin/sh\necho "start $(date +%s.%N)" >> {log}\nsleep 1\n"{shutil.which("g++")}" "$@"\n'
                        f'rc=$?\necho "end $(date +%s.%N)" >> {log}\nexit $rc\n')
    compiler.chmod(0o755)
    slots_plan = replace(plan(concurrency), target_python=sys.executable)
    env = {**os.environ, "CCACHE_DIR": str(tmp_path / "ccache"),
           **compile_slot_env(slots_plan, tmp_path, {})}
    for name in ("a", "b"):
        (tmp_path / f"{name}.cpp").write_text(f"int {name}() {{ return 1; }}\n")
    runs = [subprocess.Popen(["ccache", str(compiler), "-c", f"{name}.cpp", "-o", f"{name}.o"], cwd=tmp_path, env=env)
            for name in ("a", "b")]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    events = sorted((float(t), kind) for kind, t in (line.split() for line in log.read_text().splitlines()))
    assert len(events) == 8  # each: preprocessor run and compile
    most = running = 0
    for _, kind in events:
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert (most > 1) is overlap, events


def test_without_slots_the_compiler_runs_at_once(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(Path(mlstack_compile_slot.__file__)), "echo", "ran"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, mlstack_compile_slot.SLOTS: str(tmp_path / "none")})
    assert (done.returncode, done.stdout) == (0, "ran\n")


def test_a_slot_that_cannot_be_opened_runs_the_compiler_at_once(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    slots.mkdir()
    (slots / "slot-0").symlink_to(tmp_path / "gone")
    assert mlstack_compile_slot.take_slot(str(slots)) is None
