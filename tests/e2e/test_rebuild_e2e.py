"""A rebuild after a one-op patch, for real (issue 43): the changed source compiles while DeepSpeed's setup.py
starts (build/early_compile.py), setup.py's own ninja then finds it done, and the wheel has the same ops and
symbols. Its own cache (the shared one's entries stay as the other tests expect); the session's ccache makes
the first build's compiles hits, so the one-op change is the only compile of note."""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
from support.e2e import Target

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def bench_build() -> ModuleType:
    """scripts/bench_build.py: its recipe copy and one-op patch are what `bench.py build` measures."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("bench_build", SCRIPTS / "bench_build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(target: Target, cache: Path, recipe: Path) -> tuple[dict, str]:
    result = target.cli("build", "--python", target.python, "--cache-dir", str(cache), "--recipe", str(recipe),
                        "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), result.stderr


def test_a_one_op_rebuild_compiles_the_change_first(installed_target: Target, tmp_path: Path) -> None:
    bb = bench_build()
    cache = tmp_path / "cache"
    first, first_err = build(installed_target, cache, bb.recipe_copy(tmp_path / "data", None, None))
    assert "compiling what the series changed first" not in first_err  # nothing recorded before it
    sdist = next((cache / "downloads").rglob("deepspeed-0.19.5.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "src", filter="data")
    patch = bb.one_op_patch(tmp_path / "src" / "deepspeed-0.19.5", "deepspeed_shm_comm", "csrc/cpu/comm/shm.cpp")
    second, second_err = build(installed_target, cache, bb.recipe_copy(tmp_path / "data-one-op", None, patch))
    assert second["action"] == "built" and second["plan"]["cache_key"] != first["plan"]["cache_key"]
    assert "compiling what the series changed first: csrc/cpu/comm/shm.cpp" in second_err
    log = Path(json.loads((Path(second["wheel"]).parent / "build.json").read_text())["log"])
    early = log.with_name(f"{log.stem}-early.log").read_text()
    assert "csrc/cpu/comm/shm.cpp" in early
    op_log = (log.with_suffix(".ops") / "deepspeed_shm_comm.log").read_text()
    assert "shm.cpp -o" not in op_log  # setup.py's ninja found the early object up to date
    assert bb.ops_and_symbols(Path(second["wheel"])) == bb.ops_and_symbols(Path(first["wheel"]))
