#!/usr/bin/env python3
"""Benchmark a cold build's use of the cores: the hand build, ours, and our rebuild after a one-op patch.

    python scripts/bench.py build [--ops cpu_adam,fused_adam,deepspeed_shm_comm] [--json-out F] [--markdown-out F]
    python scripts/bench.py build --python PY --sdist deepspeed-0.19.5.tar.gz --time-cap 240 [--json-out F]

In one run, on a fresh venv with the pinned CPU torch (or --python's, e.g. a GPU machine's), each step with
its own empty ccache:
  hand     `pip wheel --no-build-isolation` of the 0.19.5 sdist with the plan's DS_BUILD_* flags and
           MAX_JOBS=<cores>, as a user types it (setup.py builds the ops one after another, without ninja);
  cold     `mlstack-ds install --no-verify` with an empty wheel cache and an empty ccache;
  rebuild  the same after adding one patch that changes one source of one op (deepspeed_shm_comm's shm.cpp):
           a new plan, so a new build, where ccache has every other compile.
For each: wall, user and system CPU of the whole process tree, and wall ÷ (CPU ÷ cores), the limit. The
hand and cold wheels must hold the same ops exporting the same symbols, or the run fails.
`--ops` limits the platform's recipe to those ops (a copy of the recipe; the issue's measurement used these three).
With --python (a GPU machine's interpreter, offline with --sdist) nothing is installed anywhere: cold and
rebuild are `mlstack-ds build`. --time-cap bounds the whole run (the GPU check's slot): the op set is cut to
what the hand build is expected to finish in its share (scripts/bench_build_ops.py), each step runs with what
is left, and a step that runs out is stopped and reported as not finished.
Exit codes: 0 measured and the wheels agree, 1 they differ, 2 usage, 3 a step failed or ran out of time.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform as platform_module
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import NoReturn

from bench_build_ops import OpSet, choose_ops
from bench_install import bench_venv

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.19.5"
MIN_CAP_S = 60.0
MIN_STEP_S = 20.0  # a step with less time left than this is not started
KEEP_AFTER_HAND = 0.35  # of the cap, kept for cold and rebuild when the hand build runs
KEEP_AFTER_COLD = 0.08  # of the cap, kept for the rebuild
# The source a rebuild's one-op patch changes, per platform: the first whose op is in the op set.
REBUILD_SOURCES = {"cpu": (("deepspeed_shm_comm", "csrc/cpu/comm/shm.cpp"), ("cpu_adam", "csrc/adam/cpu_adam.cpp")),
                   "gpu": (("fused_adam", "csrc/adam/fused_adam_frontend.cpp"), ("cpu_adam", "csrc/adam/cpu_adam.cpp"))}
PATCH_HEADER = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: mlstack-ds <patches@mlstack-ds.invalid>
Date: Tue, 24 Nov 2026 00:30:00 +0000
Subject: [PATCH] {op}: a one-op change (rebuild benchmark)

Changes one source of {op} only, to measure what a rebuild recompiles.

Origin: mlstack-ds
Forwarded: not-needed
Last-Update: 2026-11-24
---
 {path} | 1 +
 1 file changed, 1 insertion(+)

"""


def rebuild_source(platform: str, ops: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """(op, source) the rebuild's patch changes, or None when the op set has none of the candidates."""
    candidates = REBUILD_SOURCES["cpu" if platform == "cpu" else "gpu"]
    return next(((op, path) for op, path in candidates if op in ops), None)


def one_op_patch(tree: Path, op: str, path: str) -> str:
    """A patch that adds a comment line after the 3rd line of `path` in `tree` (DeepSpeed's sources open with
    a 3-line licence header), with the header format of the series."""
    head = (tree / path).read_text(encoding="utf-8").splitlines()[:6]
    body = [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}",
            f"@@ -1,{len(head)} +1,{len(head) + 1} @@", *(f" {line}" for line in head[:3]),
            "+// rebuild benchmark: a one-op change", *(f" {line}" for line in head[3:])]
    return PATCH_HEADER.format(op=op, path=path) + "\n".join(body) + "\n"


def timed(argv: list[str], env: dict[str, str], cwd: Path | None = None,
          timeout: float | None = None) -> dict[str, float | bool]:
    """Wall, user and system seconds of `argv` and everything it started (children are waited for), and
    whether it finished: past `timeout` its whole process group is killed (the CPU of what was killed is
    then not counted) and `finished` is False."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code = None
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code not in (None, 0):
        raise subprocess.CalledProcessError(code, argv)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    cores = os.cpu_count() or 1
    return {"wall": round(wall, 1), "user": round(user, 1), "system": round(system, 1),
            "limit": round((user + system) / cores, 1),
            "wall_over_limit": round(wall * cores / max(user + system, 0.1), 2), "finished": code == 0}


def recipe_copy(data: Path, ops: list[str] | tuple[str, ...] | None, extra_patch: str | None,
                platform: str = "cpu") -> Path:
    """A data directory with the shipped recipe and series, `platform`'s op list cut to `ops`, and a patch
    added."""
    shutil.copytree(REPO / "patches", data / "patches")
    (data / "recipes").mkdir(parents=True)
    text = (REPO / "recipes" / f"deepspeed-{VERSION}.toml").read_text()
    if ops:
        lines, in_platform = [], False
        for line in text.splitlines():
            if line.startswith("["):
                in_platform = line.strip() == f"[platforms.{platform}.ops]"
            name = line.split("=", 1)[0].strip()
            off = in_platform and "build = true" in line and name not in ops
            lines.append(line.replace("build = true", "build = false") if off else line)
        text = "\n".join(lines) + "\n"
    recipe = data / "recipes" / f"deepspeed-{VERSION}.toml"
    recipe.write_text(text)
    if extra_patch:
        series = data / "patches" / f"deepspeed-{VERSION}"
        (series / "0090-bench-one-op-change.patch").write_text(extra_patch)
        with (series / "series").open("a") as handle:
            handle.write("0090-bench-one-op-change.patch\n")
    return recipe


def ops_and_symbols(wheel: Path) -> dict[str, object]:
    """installed_ops from the build record, and each op library's exported symbols."""
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read("deepspeed/git_version_info_installed.py").decode()
        tree = ast.parse(record)
        ops = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", "") == "installed_ops")
        symbols: dict[str, list[str]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in archive.namelist():
                if name.startswith("deepspeed/ops/") and name.endswith(".so"):
                    path = Path(archive.extract(name, tmp))
                    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                                        check=True)
                    symbols[Path(name).name] = sorted(line.split()[-1] for line in nm.stdout.splitlines())
    return {"installed_ops": ops, "symbols": symbols}


def ccache_counts(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, env=env, check=False).stdout
    stats = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    hits = int(stats.get("direct_cache_hit", 0)) + int(stats.get("preprocessed_cache_hit", 0))
    return {"hits": hits, "misses": int(stats.get("cache_miss", 0))}


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one error line and one hint line (exit 2), not the usage text."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message}\nhint: python scripts/bench.py build --help\n")
        sys.exit(2)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="bench.py build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated ops to build (default: the plan's, or what fits --time-cap)")
    parser.add_argument("--python", help="build with this interpreter's torch (default: a fresh venv with the "
                        "pinned CPU torch); nothing is installed into it")
    parser.add_argument("--sdist", type=Path, help=f"DeepSpeed {VERSION}'s sdist (default: pip download it)")
    parser.add_argument("--time-cap", type=float, metavar="SECONDS",
                        help="the whole run's time; the op set is cut so that the hand build fits")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--markdown-out", type=Path)
    args = parser.parse_args(argv)
    if args.time_cap is not None and args.time_cap < MIN_CAP_S:
        parser.error(f"--time-cap {args.time_cap:g}: too short for two builds (at least {MIN_CAP_S:.0f} s)")
    if args.sdist is not None and not args.sdist.is_file():
        parser.error(f"--sdist {args.sdist}: no such file")
    if args.python is not None and not shutil.which(args.python):
        parser.error(f"--python {args.python}: no such interpreter")
    return args


class Deadline:
    """What is left of --time-cap (None: no cap), less what later steps are kept."""

    def __init__(self, cap_s: float | None) -> None:
        self.cap_s = cap_s
        self.started = time.monotonic()

    def left(self, keep_fraction: float = 0.0) -> float | None:
        if self.cap_s is None:
            return None
        return self.cap_s * (1 - keep_fraction) - (time.monotonic() - self.started)


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        return measure(args)
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd[:6]))} ... failed (exit {exc.returncode})\n"
              "hint: run that step by hand to see its output", file=sys.stderr)
        return 3


def measure(args: argparse.Namespace) -> int:
    """The run: the steps, the comparison, the result (printed, and written where asked)."""
    has_ccache = shutil.which("ccache") is not None
    if not has_ccache:  # a GPU image may lack it: hand and cold compare as well, a rebuild would rebuild all
        print("bench.py build: ccache is not installed: no rebuild step (apt-get install ccache)", file=sys.stderr)
    deadline = Deadline(args.time_cap)
    asked = args.ops.split(",") if args.ops else None
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp_name:
        tmp = Path(tmp_name)
        python = args.python or bench_venv(tmp / "venv")
        command = "build" if args.python else "install"
        cli = [sys.executable, "-m", "mlstack_ds", command, "--python", python, "--cache-dir", str(tmp / "cache")]
        if command == "install":
            cli.insert(4, "--no-verify")
        sdist = args.sdist.resolve() if args.sdist else download_sdist(python, tmp / "sdist")
        cli += ["--source", str(sdist)]
        full = dry_plan(cli, recipe_copy(tmp / "data-full", None, None))
        platform = str(full.get("platform") or "cpu")
        try:
            op_set = choose_ops(full["built_ops"], platform, args.time_cap, asked)
        except ValueError as exc:
            print(f"error: {exc}\nhint: --ops takes names from the plan, or leave it out", file=sys.stderr)
            return 2
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp / "src", filter="data")
        tree = tmp / "src" / f"deepspeed-{VERSION}"
        changed = rebuild_source(platform, op_set.ops)
        cold_recipe = recipe_copy(tmp / "data-cold", op_set.ops, None, platform)
        patch = one_op_patch(tree, *changed) if changed else None
        rebuild_recipe = recipe_copy(tmp / "data-rebuild", op_set.ops, patch, platform)
        plan = dry_plan(cli, cold_recipe)
        flags = {k: v for k, v in plan["env"].items() if k.startswith(("DS_", "TORCH_CUDA_ARCH_LIST", "PYTORCH_ROCM"))}
        flags.pop("DS_ENABLE_NINJA", None)  # the hand build is setup.py's default: no ninja
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DS_", "CCACHE_", "MAX_JOBS"))}
        results: dict[str, dict[str, float | bool]] = {}
        hand_env = {**base, **flags, "MAX_JOBS": str(os.cpu_count() or 1), "CCACHE_DISABLE": "1"}
        results["hand"] = timed([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                                 str(tmp / "hand"), "."], hand_env, cwd=tree,
                                timeout=deadline.left(KEEP_AFTER_HAND))
        ours_env = {**base, "CCACHE_DIR": str(tmp / "ccache")}
        results["cold"] = timed([*cli, "--recipe", str(cold_recipe)], ours_env, timeout=deadline.left(KEEP_AFTER_COLD))
        rebuild_ccache: dict[str, int] = {}
        left = deadline.left()
        rebuilds = has_ccache and changed is not None and bool(results["cold"]["finished"])
        if rebuilds and (left is None or left > MIN_STEP_S):
            subprocess.run(["ccache", "--zero-stats"], env=ours_env, check=True, stdout=subprocess.DEVNULL)
            results["rebuild"] = timed([*cli, "--recipe", str(rebuild_recipe)], ours_env, timeout=left)
            rebuild_ccache = ccache_counts(ours_env)
        finished = all(r["finished"] for r in results.values())
        compared: dict[str, object] | None = None
        if results["hand"]["finished"] and results["cold"]["finished"]:
            (hand_wheel,) = (tmp / "hand").glob("*.whl")
            cold_wheel = next((tmp / "cache" / "wheels" / plan["cache_key"]).glob("*.whl"))
            hand, cold = ops_and_symbols(hand_wheel), ops_and_symbols(cold_wheel)
            compared = {"same": hand == cold, "installed_ops": cold["installed_ops"],
                        "symbols_per_op": {name: len(names) for name, names in cold["symbols"].items()}}  # type: ignore[union-attr]
    report = make_report(results, op_set, plan, platform=platform, command=command, cap_s=args.time_cap,
                         rebuild_ccache=rebuild_ccache,
                         rebuild_changes=f"{changed[1]} ({changed[0]})" if changed else None, compared=compared)
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown_out:
        args.markdown_out.write_text(markdown(report))
    if compared is not None and not compared["same"]:
        return 1
    return 0 if finished else 3


def download_sdist(python: str, into: Path) -> Path:
    subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    f"deepspeed=={VERSION}", "-d", str(into)], check=True)
    (sdist,) = into.glob("deepspeed-*.tar.gz")
    return sdist


def dry_plan(cli: list[str], recipe: Path) -> dict:
    """The plan `cli` would build with `recipe` (its --dry-run --json)."""
    dry = subprocess.run([*cli, "--recipe", str(recipe), "--dry-run", "--json"], capture_output=True, text=True,
                         check=True)
    return json.loads(dry.stdout)["plan"]


def make_report(results: dict[str, dict[str, float | bool]], op_set: OpSet, plan: dict, *, platform: str,
                command: str, cap_s: float | None, rebuild_ccache: dict[str, int], rebuild_changes: str | None,
                compared: dict[str, object] | None) -> dict[str, object]:
    """The run's result: each step's times and whether it finished, the op set and why, and the comparison
    of the two wheels (None when one of the builds did not finish)."""
    hand, cold = results["hand"], results["cold"]
    both = bool(hand["finished"] and cold["finished"])
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform_module.machine()}, {os.cpu_count()} cores", "deepspeed": VERSION,
        "platform": platform, "ours": f"mlstack-ds {command}", "time_cap_s": cap_s,
        "ops": list(op_set.ops), "op_set": {"of": list(op_set.of), "cut": op_set.cut, "reason": op_set.reason,
                                            "hand_estimate_s": round(op_set.hand_estimate_s)},
        "concurrency": plan.get("concurrency"), "seconds": results,
        "cold_over_hand": round(float(cold["wall"]) / float(hand["wall"]), 2) if both else None,
        "cpu_cold_over_hand": round((float(cold["user"]) + float(cold["system"]))
                                    / max(float(hand["user"]) + float(hand["system"]), 0.1), 2) if both else None,
        "rebuild_ccache": rebuild_ccache, "rebuild_changes": rebuild_changes,
        "same_ops_and_symbols": compared["same"] if compared else None,
        "installed_ops": compared["installed_ops"] if compared else None,
        "symbols_per_op": compared["symbols_per_op"] if compared else None,
    }


def markdown(report: dict) -> str:
    rows = "\n".join(f"| {name} | {r['wall']} | {r['user']} | {r['system']} | {r['limit']} | {r['wall_over_limit']} "
                     f"| {'yes' if r['finished'] else '**no** (stopped at the cap)'} |"
                     for name, r in report["seconds"].items())
    ccache = report["rebuild_ccache"]
    rebuild = (f"Rebuild after a one-op patch ({report['rebuild_changes']}): ccache {ccache['hits']} hits, "
               f"{ccache['misses']} misses. " if ccache else "No rebuild (no time left, or no op to change). ")
    return (f"| step | wall (s) | user (s) | system (s) | limit = CPU ÷ cores (s) | wall ÷ limit | finished |\n"
            f"|---|---|---|---|---|---|---|\n{rows}\n\n"
            f"Measured {report['date']} on {report['machine']}, platform {report['platform']}; DeepSpeed "
            f"{report['deepspeed']}, ours: `{report['ours']}`; ops {', '.join(report['ops'])} "
            f"({report['op_set']['reason']}). Cold ÷ hand: wall {report['cold_over_hand']}, CPU "
            f"{report['cpu_cold_over_hand']}. {rebuild}"
            f"Same installed_ops and exported symbols as the hand build: {report['same_ops_and_symbols']}.\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
