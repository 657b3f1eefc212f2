"""What the build adds to ccache's environment (build_time_env), checked with the real ccache and g++: a miss
preprocesses the source once, not twice (issue 43), and the user's own choice is kept."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mlstack_ds.build.wheel import build_time_env
from mlstack_ds.plan.buildplan import BuildPlan

CCACHE_GXX = Path("/usr/lib/ccache/g++")
pytestmark = pytest.mark.skipif(not (CCACHE_GXX.exists() and shutil.which("ccache")),
                                reason="needs ccache's compiler links (apt-get install ccache)")
SOURCE = "#include <vector>\nint size_of_two() { std::vector<int> v{1, 2}; return int(v.size()); }\n"


def plan(path_prepend: tuple[str, ...] = (str(CCACHE_GXX.parent),)) -> BuildPlan:
    return BuildPlan(schema=1, recipe="deepspeed-0.19.5", deepspeed_version="0.19.5", source="pypi",
                     source_pin="p" * 64, patches=(), platform="cpu", accelerator="cpu", archs=(), wavefront=None,
                     ops=(), env={}, path_prepend=path_prepend, target_python="/usr/bin/python3",
                     python_version="3.11", torch_version="2.13.0+cpu", cache_key="k" * 24)


def compiles_on_a_miss(tmp_path: Path, base_env: dict[str, str]) -> list[str]:
    """The g++ commands ccache ran for one cold compile of SOURCE in the tree `tmp_path/tree`."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "op.cpp").write_text(SOURCE)
    log = tmp_path / "ccache.log"
    env = {**os.environ, **base_env, "CCACHE_DIR": str(tmp_path / "ccache"), "CCACHE_LOGFILE": str(log),
           **build_time_env(plan(), tree, tmp_path, base_env)}
    subprocess.run([str(CCACHE_GXX), "-O2", "-g", "-c", "op.cpp", "-o", "op.o"], cwd=tree, env=env, check=True)
    return [line.split("Executing ", 1)[1] for line in log.read_text().splitlines() if "Executing " in line]


def test_a_miss_compiles_what_the_preprocessor_produced(tmp_path: Path) -> None:
    preprocess, compile_ = compiles_on_a_miss(tmp_path, {})
    assert " -E " in preprocess
    assert compile_.endswith(".ii") and "op.cpp" not in compile_  # not the source again: one preprocessor run


def test_the_users_own_choice_is_kept(tmp_path: Path) -> None:
    assert "CCACHE_NOCPP2" not in build_time_env(plan(), tmp_path, tmp_path, {"CCACHE_CPP2": "1"})
    assert compiles_on_a_miss(tmp_path, {"CCACHE_CPP2": "1"})[1].endswith("op.cpp")


def test_without_ccache_nothing_is_added(tmp_path: Path) -> None:
    assert build_time_env(plan(()), tmp_path, tmp_path, {}) == {}
