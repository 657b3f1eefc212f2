"""A rebuild after a one-op patch, for real (issue 43): the changed source compiles while DeepSpeed's setup.py
starts (build/early_compile.py), setup.py's own ninja then finds it done, and the wheel has the ops and symbols
of the cold install's. Its own cache (the shared one's entries stay as the other tests expect), starting from
the record the session's cold install left; the change is to async_io's deepspeed_aio_utils.cpp, which
includes no torch header (a second to compile): the mechanism is the same for any source, and
`scripts/bench.py build` measures shm.cpp's."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
from support.e2e import Target

from mlstack_ds.build.early_compile import STATE_DIR

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
    (cache / STATE_DIR).mkdir(parents=True)
    receipt = installed_target.status()["receipt"]
    cold_wheel = next((installed_target.cache / "wheels" / receipt["cache_key"]).glob("deepspeed-*.whl"))
    records = list((installed_target.cache / STATE_DIR).glob("*.json"))
    if not records:  # a warm local cache from before early compiles: this test's cache builds the record
        build(installed_target, cache, bb.recipe_copy(tmp_path / "data", None, None))
    for record in records:
        shutil.copy(record, cache / STATE_DIR)
    sdist = next((installed_target.cache / "downloads").rglob("deepspeed-0.19.5.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "src", filter="data")
    source = "csrc/aio/common/deepspeed_aio_utils.cpp"
    patch = bb.one_op_patch(tmp_path / "src" / "deepspeed-0.19.5", "async_io", source)
    built, stderr = build(installed_target, cache, bb.recipe_copy(tmp_path / "data-one-op", None, patch))
    assert built["action"] == "built" and built["plan"]["cache_key"] != receipt["cache_key"]
    assert f"compiling what the series changed first: {source}" in stderr
    log = Path(json.loads((Path(built["wheel"]).parent / "build.json").read_text())["log"])
    assert source in log.with_name(f"{log.stem}-early.log").read_text()
    op_log = (log.with_suffix(".ops") / "async_io.log").read_text()
    assert "deepspeed_aio_utils.cpp -o" not in op_log  # setup.py's ninja found the early object up to date
    assert bb.ops_and_symbols(Path(built["wheel"])) == bb.ops_and_symbols(cold_wheel)
