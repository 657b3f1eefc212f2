"""Early compiles of what a patch changed (build/early_compile.py, issue 43), with the real ninja, g++ and git:
an op directory laid out as torch's cpp_extension writes it, built once, recorded, then patched in a new
tree. The compiler is g++ behind a wrapper that takes 2 s first, so that the early ninja is still running
when the op's own ninja starts, as setup.py's does seconds later in a real rebuild."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlstack_ds.build.early_compile import (
    changed_objects,
    early_compiles,
    load,
    parse_ninja_deps,
    record,
    state_path,
)
from mlstack_ds.plan.buildjobs import BuildConcurrency
from mlstack_ds.plan.buildplan import BuildPlan, OpDecision
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.gitrepo import git_env
from mlstack_ds.target_side import mlstack_ninja_turn

pytestmark = pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("g++")), reason="needs ninja and g++")

OP_DIR = "build/temp.linux-x86_64-cpython-311/deepspeed.ops.toy.toy_op"
A_OBJ, B_OBJ = f"{OP_DIR}/src/a.o", f"{OP_DIR}/src/b.o"


def plan(built: tuple[str, ...] = ("toy",), jobs: int = 2) -> BuildPlan:
    return BuildPlan(schema=1, recipe="deepspeed-0.19.5", deepspeed_version="0.19.5", source="pypi",
                     source_pin="p" * 64, patches=(), platform="cpu", accelerator="cpu", archs=(), wavefront=None,
                     ops=tuple(OpDecision(name, f"DS_BUILD_{name.upper()}", True, "") for name in built),
                     env={}, path_prepend=(), target_python=sys.executable,
                     python_version="3.11", torch_version="2.13.0+cpu", cache_key="k" * 24,
                     concurrency=BuildConcurrency(jobs, 1, 2, 1, "cpus"))


def run_git(tree: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=tree, env=git_env(), check=True, capture_output=True)


def torch_like_build_ninja(tree: Path, cxx: Path, outside: Path) -> str:
    """What torch's _write_ninja_file writes for an op of two sources (the tree's absolute paths in it)."""
    return (f"ninja_required_version = 1.3\ncxx = {cxx}\n\ncflags = -I{tree}/src -I{outside} -O0\npost_cflags = \n\n"
            "rule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags\n"
            "  depfile = $out.d\n  deps = gcc\n\n"
            f"build {tree}/{A_OBJ}: compile {tree}/src/a.cpp\nbuild {tree}/{B_OBJ}: compile {tree}/src/b.cpp\n")


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path, dict[str, str], Cache]:
    """tree1, built and recorded; the environment of its build; the cache."""
    outside = tmp_path / "outside"  # torch's headers stand-in: not in the tree, not recorded
    outside.mkdir()
    (outside / "outside.h").write_text("inline int outside() { return 1; }\n")
    slow = tmp_path / "slow-cxx"
    slow.write_text('#!/bin/sh\nsleep 2\nexec g++ "$@"\n')
    slow.chmod(0o755)
    tree = tmp_path / "tree1"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "inc.h").write_text("inline int two() { return 2; }\n")
    (tree / "src" / "a.cpp").write_text('#include "inc.h"\n#include "outside.h"\n'
                                        "int a() { return two() + outside(); }\n")
    (tree / "src" / "b.cpp").write_text("int b() { return 3; }\n")
    run_git(tree, "init", "-q")
    run_git(tree, "add", "-A")
    run_git(tree, "commit", "-q", "-m", "sources")
    op_dir = tree / OP_DIR
    op_dir.mkdir(parents=True)
    (op_dir / "build.ninja").write_text(torch_like_build_ninja(tree, slow, outside))
    env = dict(os.environ)
    subprocess.run(["ninja", "-j", "2"], cwd=op_dir, env=env, check=True, capture_output=True)
    cache = Cache.open(tmp_path / "cache")
    record(cache, plan(), tree, env)
    return tmp_path, tree, env, cache


def patched_copy(tmp_path: Path, tree: Path, path: str, text: str) -> Path:
    """A new tree of the same commit (another staging directory) with one more commit changing `path`."""
    new = tmp_path / "tree2"
    subprocess.run(["git", "clone", "-q", str(tree), str(new)], env=git_env(), check=True, capture_output=True)
    (new / path).write_text(text)
    run_git(new, "add", "-A")
    run_git(new, "commit", "-q", "-m", "the patch")
    return new


def test_a_build_records_each_objects_in_tree_dependencies(built: tuple[Path, Path, dict[str, str], Cache]) -> None:
    _, tree, _, cache = built
    last = load(cache, plan())
    assert last is not None
    last_tree, blobs, ops = last
    assert last_tree == str(tree)
    (op,) = ops
    assert op.directory == OP_DIR
    assert op.objects == {A_OBJ: ("src/a.cpp", "src/inc.h"), B_OBJ: ("src/b.cpp",)}  # outside.h is not the tree's
    assert set(blobs) == {"src/a.cpp", "src/inc.h", "src/b.cpp"}
    assert str(tree) in op.build_ninja


def test_a_changed_header_is_compiled_early_and_the_ops_ninja_waits_for_it(
        built: tuple[Path, Path, dict[str, str], Cache]) -> None:
    tmp_path, tree, env, cache = built
    new = patched_copy(tmp_path, tree, "src/inc.h", "inline int two() { return 22; }\n")
    op_dir = new / OP_DIR
    staging, log = tmp_path / "staging", tmp_path / "logs" / "early.log"  # a new cache has no logs directory
    with early_compiles(cache, plan(), new, env, staging=staging, log_path=log) as early:
        assert early is not None
        assert early.sources == ("src/a.cpp",)  # b.cpp does not include the header
        assert str(tree) not in (op_dir / "build.ninja").read_text()
        # What torch does next in setup.py: `ninja -v` by name in the op's directory, while the early one runs.
        ops_ninja = subprocess.run(["ninja", "-v", "-j", "2"], cwd=op_dir, env={**env, **early.env},
                                   capture_output=True, text=True, check=True)
    assert "no work to do" in ops_ninja.stdout  # it waited: the early ninja's log has both objects up to date
    assert "src/a.cpp" in log.read_text()
    assert (op_dir / "src" / "a.o").is_file()


def test_without_waiting_the_ops_ninja_would_compile_again(built: tuple[Path, Path, dict[str, str], Cache]) -> None:
    """The stand-in is what makes the previous test pass: the real ninja, run at once, compiles a.o itself."""
    tmp_path, tree, env, cache = built
    new = patched_copy(tmp_path, tree, "src/inc.h", "inline int two() { return 22; }\n")
    staging, log = tmp_path / "staging", tmp_path / "early.log"
    with early_compiles(cache, plan(), new, env, staging=staging, log_path=log) as early:
        assert early is not None
        ops_ninja = subprocess.run([early.env[mlstack_ninja_turn.REAL_NINJA], "-v", "-j", "2"], cwd=new / OP_DIR,
                                   env=env, capture_output=True, text=True, check=True)
    assert "src/a.cpp" in ops_ninja.stdout


@pytest.mark.parametrize(("change", "the_plan"), [
    (None, plan()),  # nothing changed: every object is a ccache hit in setup.py's own ninja
    ("src/a.cpp", plan(built=("cpu_adam",))),  # the op is not in this plan
    ("src/inc.h", plan(jobs=0)),  # more changed objects than the plan's jobs: the whole build is the work
])
def test_nothing_starts_early(built: tuple[Path, Path, dict[str, str], Cache], change: str | None,
                              the_plan: BuildPlan) -> None:
    tmp_path, tree, env, cache = built
    if state_path(cache, the_plan) != state_path(cache, plan()):
        shutil.copy(state_path(cache, plan()), state_path(cache, the_plan))  # the same family's record
    new = patched_copy(tmp_path, tree, change or "README", "changed\n")
    with early_compiles(cache, the_plan, new, env, staging=tmp_path / "staging", log_path=tmp_path / "log") as early:
        assert early is None


def test_an_untracked_dependency_leaves_the_object_to_setup_py() -> None:
    """hipify writes the sources it compiles into the tree during setup.py: not there before it runs."""
    from mlstack_ds.build.early_compile import OpObjects
    op = OpObjects(OP_DIR, "", {A_OBJ: ("src/a.hip", "src/inc.h"), B_OBJ: ("src/b.cpp",)})
    before = {"src/inc.h": "1", "src/b.cpp": "2"}
    assert changed_objects([op], before, {"src/inc.h": "9", "src/b.cpp": "2"}, ("toy",)) == {}
    assert changed_objects([op], before, {"src/inc.h": "1", "src/b.cpp": "3"}, ("toy",)) == {OP_DIR: (B_OBJ,)}


def test_a_source_two_ops_compile_starts_early_once() -> None:
    from mlstack_ds.build.early_compile import OpObjects
    first = OpObjects("build/t/deepspeed.ops.adam.cpu_adam_op", "", {"x/impl.o": ("impl.cpp",), "x/a.o": ("a.cpp",)})
    second = OpObjects("build/t/deepspeed.ops.adam.fused_adam_op", "", {"y/impl.o": ("impl.cpp",), "y/f.o": ("f.cpp",)})
    before = {"impl.cpp": "1", "a.cpp": "2", "f.cpp": "3"}
    assert changed_objects([first, second], before, {**before, "impl.cpp": "9"}, ("cpu_adam", "fused_adam")) == {
        first.directory: ("x/impl.o",)}


def test_an_early_ninja_leaves_a_copy_another_op_compiles() -> None:
    from mlstack_ds.build.early_compile import OpObjects, ninja_targets
    fused = OpObjects("f", "", {"y/impl.o": ("impl.cpp",), "y/f.o": ("f.cpp",), "y/g.o": ("g.cpp",)})
    assert ninja_targets(fused, ("y/f.o",), {"impl.cpp"}) == ("y/f.o", "y/g.o")
    assert ninja_targets(fused, ("y/f.o",), set()) == ("y/impl.o", "y/f.o", "y/g.o")


def test_parse_keeps_the_tree_relative_dependencies(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    text = (f"{tree}/{A_OBJ}: #deps 3, deps mtime 1 (VALID)\n    ../../../src/a.cpp\n    /usr/include/torch.h\n"
            f"    {tree}/src/inc.h\n\n{tree}/{B_OBJ}: #deps 1, deps mtime 1 (STALE)\n    /elsewhere/b.cpp\n\n")
    assert parse_ninja_deps(text, tree / OP_DIR, tree) == {A_OBJ: ("src/a.cpp", "src/inc.h")}


def test_the_stand_in_needs_a_real_ninja(tmp_path: Path) -> None:
    script = Path(mlstack_ninja_turn.__file__)
    env = {k: v for k, v in os.environ.items() if k != mlstack_ninja_turn.REAL_NINJA}
    result = subprocess.run([sys.executable, str(script), "--version"], env={**env, "PATH": str(tmp_path)},
                            capture_output=True, text=True)
    assert result.returncode == 127 and "no real ninja" in result.stderr
    real = shutil.which("ninja")
    assert real is not None
    (tmp_path / mlstack_ninja_turn.LOCK_NAME).write_text("")  # not held: nothing to wait for
    version = subprocess.run([sys.executable, str(script), "-C", str(tmp_path), "--version"],
                             env={**env, mlstack_ninja_turn.REAL_NINJA: real}, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip()[0].isdigit()


def test_the_family_leaves_out_the_series_and_the_jobs() -> None:
    from mlstack_ds.build.early_compile import family_key
    base = plan()
    assert family_key(replace(base, cache_key="x" * 24, env={"MAX_JOBS": "8"})) == family_key(base)
    assert family_key(replace(base, torch_version="2.12.0+cpu")) != family_key(base)
