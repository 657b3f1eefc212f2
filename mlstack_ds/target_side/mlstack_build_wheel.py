"""A legacy tree's wheel through setuptools' PEP 517 hook: `python -u mlstack_build_wheel.py OUT`, run in the
tree with the target interpreter, prints `built NAME.whl`.

Why not pip: a tree without pyproject.toml (every DeepSpeed sdist) is built by setuptools' legacy backend,
and pip runs its setup.py twice, once for the metadata and once for the wheel. DeepSpeed's setup.py imports
torch, probes the compilers and asks py-cpuinfo (a subprocess of a second) for each CPU op every time:
about 10 s of a cold build, on one core, before any op compiles. The wheel needs only the second run,
PEP 517's `build_wheel` hook, which is all `python -m build --no-isolation --wheel` calls.
"""

from __future__ import annotations

import os
import sys
import zipfile

# zlib's level for the wheel's members. setuptools packs at zlib's default (6): 2.4 s of CPU for the 100 MB of
# op libraries with debug info of the CPU plan, after the last op is linked, so on the critical path of
# every rebuild. Level 1: 0.9 s, and a wheel of 37 MB instead of 33 MB; the files in it are the same.
WHEEL_ZIP_LEVEL = 1


def pack_faster() -> None:
    """Make setuptools' bdist_wheel write the wheel at WHEEL_ZIP_LEVEL. Where its wheel writer is not where
    setuptools 70 to 80 keep it, the wheel is packed at the default level, as before."""
    try:
        from setuptools.command import bdist_wheel
    except ImportError:
        return
    writer = getattr(bdist_wheel, "WheelFile", None)
    if not isinstance(writer, type):
        return

    class FasterWheelFile(writer):  # type: ignore[misc,valid-type]
        def open(self, name: object, mode: str = "r", *args: object, **kwargs: object) -> object:
            # Every member is written through open(ZipInfo, "w"); the wheel writer's own ZipInfo names no
            # level, and ZipFile then takes zlib's default. (3.13 renamed the attribute.)
            if mode == "w" and isinstance(name, zipfile.ZipInfo):
                setattr(name, "compress_level" if hasattr(name, "compress_level") else "_compresslevel",
                        WHEEL_ZIP_LEVEL)
            return super().open(name, mode, *args, **kwargs)

    bdist_wheel.WheelFile = FasterWheelFile  # type: ignore[attr-defined]


def build_wheel(out: str) -> str:
    """The wheel's file name, built into `out` from the tree in the current directory."""
    from setuptools import build_meta
    pack_faster()
    return build_meta.__legacy__.build_wheel(out)


def search_like_python_c() -> None:
    """Run by path, Python puts this file's directory first on sys.path; `python -c` (how this build ran
    before) puts the current directory, the tree, there. Kept so: the build imports what it did."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main(argv: list[str]) -> int:
    search_like_python_c()
    print("built", build_wheel(argv[0]), flush=True)
    return 0


def exit_without_teardown(code: int) -> None:
    """End the process once the wheel is written and named. setup.py imported torch and all of DeepSpeed, and
    the interpreter's teardown of them (module by module, then the garbage collector) takes 1.2 s of one
    core after the last line that matters, on the critical path of every build. Nothing is left to run: the
    wheel is renamed into place before the hook returns, no compiler runs; only the streams are flushed. A
    build that fails raises before this, and ends as Python ends (its traceback, its exit status)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1:]))
