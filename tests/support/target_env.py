"""Target venvs that `mlstack-ds install` never makes, built by hand: CPU torch + DeepSpeed 0.19.5 with
given DS_BUILD_* flags (the verify tests use DS_BUILD_OPS=0, "no prebuilt ops", and the benchmark uses
the hand-built CPU-ops venv as its baseline). The normal target comes from `mlstack-ds install`
(tests/conftest.py: installed_target). It also owns the test cache directory, for every test and the
benchmarks.

Venvs are cached under `<test cache>/target-venvs/<key>`, the key being the sdist's sha256, the torch
pin and the build flags, so a second local run reuses them; CI starts with an empty cache. A venv is
built in place (venv scripts hard-code their path) and marked complete only at the end; a venv
without the marker is removed and rebuilt, so an interrupted build is never trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .pins import DEEPSPEED_RUNTIME_DEPS, TORCH_PIN

DS_VERSION = "0.19.5"
DS_SDIST_SHA256 = "8dc5d32604a3c7a713b3d14de482533bd328ffebe716cdafcc3511953fc90cdf"  # PyPI's sdist
# The second pin (recipes/deepspeed-0.19.8.toml): patch and refresh tests use its sdist.
DS_NEXT_VERSION = "0.19.8"
DS_NEXT_SDIST_SHA256 = "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"
CPU_OPS_FLAGS: Mapping[str, str] = {
    "DS_ACCELERATOR": "cpu",
    "DS_BUILD_OPS": "0",
    "DS_BUILD_CPU_ADAM": "1",
    "DS_BUILD_FUSED_ADAM": "1",
    "DS_BUILD_SHM_COMM": "1",
}
NO_OPS_FLAGS: Mapping[str, str] = {"DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_cache_dir() -> Path:
    """Downloads and built venvs shared by test runs: $MLSTACK_TEST_CACHE, default <repo>/.cache/test."""
    path = Path(os.environ.get("MLSTACK_TEST_CACHE", REPO_ROOT / ".cache" / "test"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock on the test cache's entry `name`: the suite's two xdist workers (scripts/test.sh)
    may both need one that is not made yet; the second waits and then finds it made."""
    locks = test_cache_dir() / "locks"
    locks.mkdir(exist_ok=True)
    with open(locks / f"{name}.lock", "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def cached_deepspeed_sdist(version: str, sha256: str) -> Path:
    """deepspeed-VERSION.tar.gz from the package index (as users get it), downloaded once into the test
    cache and checked against `sha256` every time."""
    cache = test_cache_dir()
    sdist = cache / f"deepspeed-{version}.tar.gz"
    with cache_lock(sdist.name):
        if not sdist.exists():
            _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                  f"deepspeed=={version}", "-d", str(cache)])
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"cached sdist {sdist} has sha256 {digest}, expected {sha256}; delete it")
    return sdist


@dataclass(frozen=True)
class TargetVenv:
    root: Path
    build_seconds: float  # 0.0 when it came from the cache

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


def cache_key(sdist: Path, flags: Mapping[str, str]) -> str:
    sdist_sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    blob = json.dumps({"sdist": sdist_sha, "torch": TORCH_PIN, "flags": dict(sorted(flags.items())),
                       "python": f"{sys.version_info.major}.{sys.version_info.minor}"}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_target_venv(sdist: Path, flags: Mapping[str, str], cache_dir: Path) -> TargetVenv:
    """Return a venv with torch (pinned) and DeepSpeed from `sdist` built with `flags`; cached."""
    key = cache_key(sdist, flags)
    with cache_lock(f"target-venv-{key}"):
        return _build_target_venv(sdist, flags, cache_dir, cache_dir / "target-venvs" / key)


def _build_target_venv(sdist: Path, flags: Mapping[str, str], cache_dir: Path, final: Path) -> TargetVenv:
    marker = final / "mlstack-test-complete"
    if marker.exists():
        return TargetVenv(final, 0.0)
    shutil.rmtree(final, ignore_errors=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    wheel = built_wheel(sdist, flags, cache_dir)
    make_venv(final, TORCH_PIN, *DEEPSPEED_RUNTIME_DEPS)
    _run([str(final / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)])
    marker.write_text(json.dumps(dict(flags), sort_keys=True) + "\n")
    return TargetVenv(final, time.monotonic() - started)


def built_wheel(sdist: Path, flags: Mapping[str, str], cache_dir: Path) -> Path:
    """DeepSpeed's wheel as plain pip builds it from `sdist` with `flags` (setup.py run by the test venv's
    interpreter, which has the pinned torch): built once and cached, so the targets that need a
    pip-installed DeepSpeed install the same wheel in seconds instead of each running setup.py."""
    key = cache_key(sdist, flags)
    with cache_lock(f"wheel-{key}"):
        return _built_wheel(sdist, flags, cache_dir / "wheels" / key)


def _built_wheel(sdist: Path, flags: Mapping[str, str], final: Path) -> Path:
    found = sorted(final.glob("deepspeed-*.whl"))
    if found:
        return found[0]
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ds-src-", dir=final.parent) as work:
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        (tree,) = (p for p in Path(work).iterdir() if p.is_dir())
        out = Path(work) / "wheel"
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(out),
              str(tree)], env={**os.environ, **flags})
        shutil.rmtree(final, ignore_errors=True)
        out.rename(final)  # atomic: a wheel directory is complete or absent
    return next(final.glob("deepspeed-*.whl"))


def bare_venv(path: Path, base_python: str | Path = sys.executable) -> Path:
    """A new venv at `path` with nothing installed, not even pip (`base_python`'s standard library only);
    returns `path`. The `bare_python` fixture is one, shared; tests that change theirs make their own."""
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path


def overlay_venv(path: Path, base_python: str | Path = sys.executable, *, pip: bool = True) -> Path:
    """A new venv at `path` (with pip) that also sees `base_python`'s site-packages, after its own, through
    a .pth line: pip there counts the base's packages (the test venv's pinned torch) as installed, so a test
    can install on top of them into a scratch venv in seconds, leaving the base unchanged. Returns `path`.
    `pip=False`: no pip of its own (the base's runs there, installing into it): made in a second, where ensurepip
    takes twenty on a loaded machine."""
    base_site = subprocess.run([str(base_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    _run([sys.executable, "-m", "venv", *([] if pip else ["--without-pip"]), str(path)])
    (site,) = path.glob("lib/python3*/site-packages")
    (site / "zz-overlay-base.pth").write_text(base_site + "\n")
    return path


def make_venv(path: Path, *requirements: str, env: Mapping[str, str] | None = None) -> Path:
    """A new venv at `path` with `requirements` installed (callers pin torch: see TORCH_PIN). `env` (default:
    this process's environment when it runs) is pip's: a thread must pass its own, see support/cold_install.py."""
    _run([sys.executable, "-m", "venv", str(path)], env)
    if requirements:
        # Not -q: pip's account of a failed resolution ("The conflict is caused by ...") is printed at info level.
        _run([str(path / "bin" / "python"), "-m", "pip", "install", *requirements], env)
    return path


def _run(argv: list[str], env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(argv, env=dict(env) if env else None, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")


if __name__ == "__main__":  # manual use, from tests/: python -m support.target_env SDIST [noops]
    chosen = NO_OPS_FLAGS if sys.argv[2:] == ["noops"] else CPU_OPS_FLAGS
    made = build_target_venv(Path(sys.argv[1]), chosen, test_cache_dir())
    print(made.root, f"{made.build_seconds:.1f}s")
