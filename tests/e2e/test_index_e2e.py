"""Issue 30 for real: the session's cold CPU build published to a PEP 503 index, served by `python -m
http.server` on the loopback address, and installed into a second venv whose PATH has no compiler at all;
then the index's failures (tampered wheel, a wheel for another torch, unreachable, junk HTML), each one
error with its exit code and the previous install intact. The cold build is the suite's own (installed_target).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.bundles import network_namespace
from support.cli import CliResult, run_cli
from support.e2e import FIRST_USE, Target, no_compiler_path, served
from support.pins import TORCH_VERSION
from support.target_env import overlay_venv

from mlstack_ds.index.publish import regenerate
from mlstack_ds.launch.launcher import free_port

pytestmark = [pytest.mark.slow, pytest.mark.reads_target]  # publishes and bundles its cached wheel

PLANNED_OPS = ["async_io", "cpu_adam", "deepspeed_shm_comm", "fused_adam", "pin_memory"]


@pytest.fixture(scope="module")
def index_dir(installed_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mlstack-ds publish KEY --to DIR` of the cold build's cached wheel (twice: the second is a no-op)."""
    key = installed_target.status()["receipt"]["cache_key"]
    directory = tmp_path_factory.mktemp("team-index")
    for expected in ("published", "already published"):
        result = installed_target.cli("publish", key, "--to", str(directory), "--cache-dir",
                                      str(installed_target.cache), "--json")
        assert result.returncode == 0, result.stderr[-3000:]
        assert [w["action"] for w in result.json["wheels"]] == [expected]
    return directory


@pytest.fixture(scope="module")
def index_url(index_dir: Path) -> Iterator[str]:
    with served(index_dir) as base:
        yield f"{base}/simple"


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return no_compiler_path(tmp_path_factory.mktemp("no-compiler") / "bin")


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Target:
    """Another venv with the same torch and no DeepSpeed (it sees the test venv's packages), its own cache."""
    root = tmp_path_factory.mktemp("second")
    return Target(overlay_venv(root / "venv", sys.executable), root / "cache")


def install(target: Target, *args: str, path: str) -> CliResult:
    return target.install(*args, env={"PATH": path})


def fresh(second: Target, tmp_path: Path) -> Target:
    """The second venv with an empty cache: a wheel the good install downloaded (kept by its sha256) is not
    there to be reused, so the index's copy is read."""
    return Target(second.venv, tmp_path / "fresh-cache")


@pytest.fixture(scope="module")
def index_install(second: Target, index_url: str, bare_path: str) -> CliResult:
    result = install(second, "--index", index_url, "--index-only", "--no-verify", "--json", path=bare_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_a_machine_without_a_compiler_installs_the_prebuilt_ops_from_the_index(
        index_install: CliResult, second: Target, index_url: str, bare_path: str, tmp_path: Path) -> None:
    document = index_install.json
    plan, receipt = document["plan"], document["receipt"]
    assert document["action"] == "installed" and document["index"]["chosen"] == Path(receipt["wheel"]).name
    assert plan["prebuilt"].startswith(index_url + "/deepspeed/") and receipt["origin"] == plan["prebuilt"]
    assert "no C++ compiler found (none of c++, g++, clang++ on PATH)" in [m for m, _ in plan["toolchain_missing"]]
    assert receipt["deepspeed_version"] == f"0.19.5+cpu.torch2.13.0.k{plan['cache_key'][:8]}"
    assert sorted(receipt["ops"]) == PLANNED_OPS
    assert not (second.cache / "logs").exists()  # no build started: nothing was compiled
    assert not [p for p in (second.cache / "tmp").iterdir()] if (second.cache / "tmp").exists() else True
    status = second.status()
    assert status["intact"] is True and sorted(status["installed"]["prebuilt_ops"]) == PLANNED_OPS
    blocker = tmp_path / "no-jit"
    blocker.write_text("JIT would have to create a directory here")
    loaded = subprocess.run([second.python, "-c", FIRST_USE, *PLANNED_OPS], capture_output=True, text=True,
                            env={**os.environ, "PATH": bare_path, "TORCH_EXTENSIONS_DIR": str(blocker)}, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    verify = second.cli("verify", "--python", second.python, "--only", "environment,prebuilt_ops", "--json",
                        env={"PATH": bare_path})
    assert verify.returncode == 0, verify.stderr[-3000:]
    assert [(c["name"], c["status"]) for c in verify.json["checks"]] == [("environment", "pass"),
                                                                         ("prebuilt_ops", "pass")]


def test_a_second_install_from_the_index_is_a_no_op(index_install: CliResult, second: Target, index_url: str,
                                                    bare_path: str) -> None:
    result = install(second, "--index", index_url, "--json", path=bare_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.json["action"] == "up-to-date"


def test_plain_pip_takes_the_exact_wheel_from_the_index(index_install: CliResult, second: Target, index_url: str,
                                                        tmp_path: Path) -> None:
    version = index_install.json["receipt"]["deepspeed_version"]
    done = subprocess.run([second.python, "-m", "pip", "download", "--no-deps", "--index-url", index_url,
                           f"deepspeed=={version}", "-d", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = tmp_path.glob("*.whl")
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == index_install.json["receipt"]["wheel_sha256"]


@pytest.fixture
def copy_of_index(index_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    return copy


def refused(second: Target, before: dict, result: CliResult, code: int) -> str:
    """The failure contract, and the install from the index untouched; returns the error line."""
    assert result.returncode == code, result.stderr[-3000:]
    error, _ = result.one_error()
    after = second.status()
    assert after["intact"] is True and after["receipt"] == before["receipt"]
    return error


def the_wheel(index: Path) -> Path:
    [wheel] = (index / "simple" / "deepspeed").glob("*.whl")
    return wheel


def test_a_tampered_wheel_is_refused(index_install: CliResult, second: Target, copy_of_index: Path,
                                     bare_path: str, tmp_path: Path) -> None:
    before = second.status()
    wheel = the_wheel(copy_of_index)
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))
    with served(copy_of_index) as base:
        result = install(fresh(second, tmp_path), "--force", "--no-verify", "--index", f"{base}/simple",
                         path=bare_path)
    error = refused(second, before, result, 4)
    assert f"error: {wheel.name} from the index {base}/simple does not match its sha256" in error


def test_a_wheel_for_another_torch_is_refused_with_the_reason(index_install: CliResult, second: Target,
                                                              copy_of_index: Path, bare_path: str,
                                                              tmp_path: Path) -> None:
    before = second.status()
    plan_file = Path(f"{the_wheel(copy_of_index)}.plan.json")
    document = json.loads(plan_file.read_text())
    document["plan"]["torch_version"] = "2.12.0+cpu"
    plan_file.write_text(json.dumps(document))
    regenerate(copy_of_index / "simple")  # as the publisher of such a wheel would have made the page
    with served(copy_of_index) as base:
        result = install(fresh(second, tmp_path), "--force", "--no-verify", "--index", f"{base}/simple",
                         "--index-only", "--json", path=bare_path)
    refused(second, before, result, 7)
    assert "built for torch 2.12.0+cpu, the target has torch 2.13.0+cpu" in result.json["error"]["message"]


def test_an_unreachable_index_is_one_error(index_install: CliResult, second: Target, bare_path: str,
                                           tmp_path: Path) -> None:
    before = second.status()
    url = f"http://127.0.0.1:{free_port()}/simple"
    result = install(fresh(second, tmp_path), "--force", "--no-verify", "--index", url, path=bare_path)
    assert "error: the index " + url + " is unreachable: Connection refused" in refused(second, before, result, 4)


def test_an_index_with_junk_html_is_one_error(index_install: CliResult, second: Target, tmp_path: Path,
                                              bare_path: str) -> None:
    before = second.status()
    page = tmp_path / "junk" / "simple" / "deepspeed"
    page.mkdir(parents=True)
    (page / "index.html").write_bytes(b'{"not": "html"} \x00\x01 <<<< >>>')
    with served(tmp_path / "junk") as base:
        result = install(fresh(second, tmp_path), "--force", "--no-verify", "--index", f"{base}/simple",
                         path=bare_path)
    assert f"error: the index page {base}/simple/deepspeed/ is malformed" in refused(second, before, result, 4)


def test_a_bundle_with_the_prebuilt_wheel_installs_it_offline_without_a_compiler(
        installed_target: Target, deepspeed_sdist: Path, bare_path: str, tmp_path: Path) -> None:
    """Issue 41: `bundle --prebuilt KEY` puts the cold build's wheel, with its plan, into the bundle (and its
    manifest); `install --offline` on a machine like this one installs it instead of building: no compiler on
    PATH, no build log, and, where namespaces can be made, no network either."""
    key = installed_target.status()["receipt"]["cache_key"]
    bundle = tmp_path / "bundle"
    made = run_cli("bundle", "--to", bundle, "--source", deepspeed_sdist, "--torch", TORCH_VERSION, "--prebuilt",
                   key, "--cache-dir", installed_target.cache, "--json", columns=200, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    prebuilt = {f["path"].rsplit("/", 1)[-1]: f for f in made.json["manifest"]["files"] if f["kind"] == "prebuilt"}
    (wheel,) = (name for name in prebuilt if name.endswith(".whl"))
    assert f"{wheel}.plan.json" in prebuilt and wheel.startswith("deepspeed-0.19.5+")
    target = Target(overlay_venv(tmp_path / "venv", sys.executable), tmp_path / "cache")
    done = run_cli("install", "--python", target.python, "--cache-dir", target.cache, "--offline", bundle,
                   "--no-verify", "--json", env={"PATH": bare_path}, prefix=network_namespace(), columns=200,
                   timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    receipt = done.json["receipt"]
    assert receipt["source"] == f"offline:{bundle}" and receipt["cache_key"] == key
    assert receipt["origin"] == (bundle / "simple" / "deepspeed" / wheel).resolve().as_uri()
    assert receipt["wheel_sha256"] == prebuilt[wheel]["sha256"]
    assert not (target.cache / "logs").exists(), "the offline install built something"
