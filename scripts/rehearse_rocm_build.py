#!/usr/bin/env python3
"""Rehearse DeepSpeed's real ROCm build on this machine (no GPU, no ROCm needed): print what would be compiled.

  scripts/rehearse_rocm_build.py --rocminfo CAPTURE [--rocm 6.4.1] [--torch 2.13.0] [--recipe 0.19.8] [--json]
  scripts/rehearse_rocm_build.py --matrix [--write-docs] [--jobs 2] [--json]
  scripts/rehearse_rocm_build.py --rocminfo CAPTURE --arch gfx1100,gfx1030 --parallel-plan [--unit-seconds H,D,L]

One rehearsal plans the install `mlstack-ds install` would make on the machine CAPTURE describes (a
saved `rocminfo` output), then runs our build stage for real (fetch, patch, `pip wheel` of DeepSpeed's
setup.py) with torch reporting a ROCm build and hipcc/g++ only recording their command lines; see
mlstack_ds/rehearsal. `--matrix` runs the rows of mlstack_ds/rehearsal/matrix.py and `--write-docs`
regenerates docs/rocm-build-matrix.md from them. `--parallel-plan` adds, for one rehearsal, its compile
units and the build time it should take on 1, 16 and 64 cores as our plan runs it (worked out from the
recorded compiles and a time per unit: mlstack_ds/rehearsal/parallel.py).

Exit codes: 0 every rehearsal built and is sound, 1 a bug, 2 bad usage, 3 the machine is refused,
6 a rehearsal failed to build or broke a rule (the violations are listed; in the matrix, a refused row
is a failure too), 130 interrupted. A refused plan exits as `install` would (e.g. mixed wavefronts are
a usage error, 2; a CPU torch on a ROCm host is an environment problem, 3), with its error and hint.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

from _repo import REPO

from mlstack_ds.errors import MlstackError, UsageError
from mlstack_ds.recipe import find_recipe
from mlstack_ds.rehearsal.matrix import ROWS, matrix_markdown, rocminfo_text, spec_for
from mlstack_ds.rehearsal.parallel import UnitTimes, compile_units, estimate
from mlstack_ds.rehearsal.run import RehearsalResult, RehearsalSpec, rehearse, violations
from mlstack_ds.source.cache import default_cache_dir
from mlstack_ds.source.fetch import parse_source_spec

CAPTURES = REPO / "tests" / "fixtures" / "real"
EXTRA_CAPTURES = REPO / "tests" / "patches" / "fixtures"  # the no-GPU capture of this CI machine
DOCS = REPO / "docs" / "rocm-build-matrix.md"
STUBS = REPO / "tests" / "patches" / "hip" / "stub"  # device-side stand-ins for host-only headers
# Seconds per compile unit for --parallel-plan: a host C++ file of a DeepSpeed op (torch's extension
# headers, -O3), measured here: 1054 s of CPU for the 21 files of the five CPU ops (docs/benchmarks.md).
# One offload arch of a hipcc file cannot be measured without ROCm: taken as long as a host file.
DEFAULT_UNIT_SECONDS = "50,50,2"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--rocminfo", type=Path, action="append", metavar="CAPTURE",
                      help="a saved rocminfo output; repeat to splice several machines' GPUs into one node")
    what.add_argument("--matrix", action="store_true", help="rehearse every row of the ROCm build matrix")
    parser.add_argument("--rocminfo-exit", type=int, default=0, help="rocminfo's exit status on that machine")
    parser.add_argument("--rocm", default="6.4.1", help="ROCm release of the host (default 6.4.1)")
    parser.add_argument("--rocm-layout", choices=("opt", "distro", "wheels"), default="opt",
                        help="opt: /opt/rocm with .info/version; distro: packaged ROCm without it; wheels: ROCm as "
                        "TheRock's Python wheels in the build venv (--rocm 7.14.0 or 10.1.0), no ROCm root")
    parser.add_argument("--rocm-guess", choices=("devel", "venv-root"), default="devel",
                        help="wheels: torch's own ROCM_HOME guess (venv-root: torch without pytorch#196503)")
    parser.add_argument("--torch", default="2.13.0", help="the ROCm torch release the build interpreter reports")
    parser.add_argument("--torch-build", choices=("rocm", "cpu", "cuda"), default="rocm",
                        help="rehearse a CPU or CUDA torch on the ROCm host (the plan must refuse it)")
    parser.add_argument("--torch-archs", help="archs the ROCm torch was built for (default: unknown)")
    parser.add_argument("--arch", help="install --arch")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="the user's environment on that machine, e.g. PYTORCH_ROCM_ARCH=gfx90a")
    parser.add_argument("--no-patches", action="store_true", help="build pristine DeepSpeed")
    parser.add_argument("--all-ops", action="store_true", help="DS_BUILD_OPS=1 instead of the plan's op list")
    parser.add_argument("--recipe", default=None, metavar="NAME|VERSION",
                        help="the pin to rehearse (default: the default pin); matrix rows name their own")
    parser.add_argument("--source", default=None,
                        help="pypi (default), or a local sdist/tree of the pin; the matrix fetches each row's "
                        "pinned sdist from the package index (cached)")
    parser.add_argument("--python", type=Path, default=Path(sys.executable),
                        help="build interpreter with torch installed (default: this one)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="download cache (default: mlstack-ds's)")
    parser.add_argument("--jobs", type=int, default=2, help="matrix rehearsals at once (default 2)")
    parser.add_argument("--write-docs", action="store_true", help=f"with --matrix: rewrite {DOCS.relative_to(REPO)}")
    parser.add_argument("--syntax-hipcc", help="a real hipcc for the syntax check of hipified sources "
                        "(default: hipcc on PATH, e.g. Debian's)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--verbose", action="store_true", help="print every recorded compile line")
    parser.add_argument("--parallel-plan", action="store_true",
                        help="print the compile units and the expected build time on 1, 16 and 64 cores")
    parser.add_argument("--unit-seconds", default=DEFAULT_UNIT_SECONDS, metavar="HOST,DEVICE,LINK",
                        help=f"seconds per host file, per offload arch of a hipcc file, per link "
                        f"(default {DEFAULT_UNIT_SECONDS})")
    args = parser.parse_args(argv)
    if args.write_docs and not args.matrix:
        parser.error("--write-docs needs --matrix")
    if args.matrix and (args.source or args.recipe):
        parser.error("--source and --recipe are for one rehearsal: each matrix row names its pin")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.parallel_plan and args.matrix:
        parser.error("--parallel-plan is for one rehearsal, not --matrix")
    try:
        args.unit_times = UnitTimes(*(float(v) for v in args.unit_seconds.split(",")))
    except (TypeError, ValueError):
        parser.error(f"--unit-seconds {args.unit_seconds!r}: expected three numbers, e.g. {DEFAULT_UNIT_SECONDS}")
    return args


def single_spec(args: argparse.Namespace) -> RehearsalSpec:
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {item!r}: expected NAME=VALUE", hint="e.g. --env PYTORCH_ROCM_ARCH=gfx90a")
        env[name] = value
    for capture in args.rocminfo:
        if not capture.is_file():
            raise UsageError(f"--rocminfo {capture}: no such file",
                             hint="a saved `rocminfo` output, e.g. tests/fixtures/real/rocminfo_gfx1100_*.txt")
    archs = tuple(a for a in (args.torch_archs or "").replace(";", " ").replace(",", " ").split() if a)
    return RehearsalSpec(
        name="rehearsal", rocminfo=rocminfo_text(args.rocminfo), rocminfo_exit=args.rocminfo_exit,
        rocm_version=args.rocm, rocm_layout="opt" if args.rocm_layout == "wheels" else args.rocm_layout,
        rocm_wheels=args.rocm_layout == "wheels", rocm_guess=args.rocm_guess,
        torch_version=args.torch, torch_build=args.torch_build,
        torch_archs=archs or None, archs=args.arch, user_env=env, patches=not args.no_patches, all_ops=args.all_ops,
        syntax_hipcc=args.syntax_hipcc, syntax_stubs=str(STUBS) if args.syntax_hipcc else None)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cache = args.cache_dir or default_cache_dir()

    def status(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def one(spec: RehearsalSpec, recipe_name: str | None = args.recipe) -> RehearsalResult:
        recipe = find_recipe(recipe_name) if recipe_name else find_recipe()
        source = parse_source_spec(args.source or "pypi")
        return rehearse(spec, recipe, source, python=args.python, fetch_cache=cache, status=status)

    if args.matrix:
        hipcc = args.syntax_hipcc or shutil.which("hipcc")
        specs = [spec_for(row, find_capture, hipcc, STUBS) for row in ROWS]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, specs, [row.recipe for row in ROWS]))
        if args.write_docs:
            DOCS.write_text(matrix_markdown(ROWS, results))
            status(f"wrote {DOCS}")
    else:
        results = [one(single_spec(args))]
    for result in results:
        _report(result, args.json, args.verbose)
    if args.parallel_plan and results[0].ops:
        _parallel_plan(results[0], args.unit_times, sys.stderr if args.json else sys.stdout)
    if args.json:
        document = [r.to_dict() for r in results] if args.matrix else results[0].to_dict()
        print(json.dumps(document, indent=2))
    if not args.matrix and results[0].outcome == "refused":
        return results[0].exit_code or 3
    return 6 if any(r.outcome != "built" or violations(r) for r in results) else 0


def find_capture(name: str) -> Path:
    """A capture of the matrix: the real captures, or the no-GPU capture of this CI machine."""
    return next((d / name for d in (CAPTURES, EXTRA_CAPTURES) if (d / name).is_file()), CAPTURES / name)


def _report(result: RehearsalResult, quiet: bool, verbose: bool) -> None:
    out = sys.stderr if quiet else sys.stdout
    plan = result.plan
    print(f"{result.spec.name}: {result.outcome} in {result.seconds:.0f} s", file=out)
    if plan is not None:
        print(f"  targets {', '.join(plan.archs)} ({plan.targets_source}), wave{plan.wavefront}; "
              f"planned ops: {', '.join(plan.built_ops)}", file=out)
        for note in plan.notes:
            print(f"  note: {note}", file=out)
    if result.error:
        print(f"  error: {result.error}", file=out)
        if result.hint:
            print(f"  hint: {result.hint}", file=out)
    for name, op in result.ops.items():
        hip = sum(r.is_hip for r in op.compiles)
        print(f"  {name}: {len(op.compiles)} compiles ({hip} hipcc)", file=out)
        for record in op.compiles if verbose else ():
            print("    " + shlex.join(record.argv), file=out)
    for problem in violations(result):
        print(f"  VIOLATION: {problem}", file=out)


def _parallel_plan(result: RehearsalResult, times: UnitTimes, out: TextIO) -> None:
    hip = [c for op in result.ops.values() for c in op.compiles if c.is_hip]
    archs = max((len(c.offload_archs) for c in hip), default=0)
    print(f"parallel plan: {len(result.ops)} ops, {sum(len(op.compiles) for op in result.ops.values())} "
          f"compiles ({len(hip)} hipcc x {archs} archs), {compile_units(result.ops)} compile units; "
          f"{times.host:g} s per host file, {times.device_per_arch:g} s per arch of a hipcc file, "
          f"{times.link:g} s per link", file=out)
    print("| cores | ops at once | files per op | archs at once | build (s) | speed-up |", file=out)
    print("|---|---|---|---|---|---|", file=out)
    for cores in (1, 16, 64):
        e = estimate(result.ops, times, cores)
        c = e.concurrency
        print(f"| {cores} | {c.ops_at_once} | {c.jobs_per_op} | {c.archs_at_once} | {e.seconds:.0f} | "
              f"{e.speedup:.1f}x |", file=out)


def _sigterm_as_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # the build's process group is killed, temp dirs go
    try:
        sys.exit(main(sys.argv[1:]))
    except MlstackError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
