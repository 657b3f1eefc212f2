"""Build stage: fetch + patch the pinned source, then build its wheel into a content-addressed cache.

Why a wheel cache keyed by the plan: the same plan (source pin, patches, targets, flags, torch)
always gives the same wheel, so a second install — or a rollback — needs no compiler at all.
Nothing here touches the target environment; a failed or interrupted build changes nothing there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from mlstack_ds.build.compile_slots import compile_slot_env
from mlstack_ds.build.early_compile import early_compiles
from mlstack_ds.build.early_compile import record as record_build
from mlstack_ds.build.oplogs import OpLogs
from mlstack_ds.detect.host import host_facts
from mlstack_ds.detect.toolchain import find_cxx
from mlstack_ds.errors import BuildError
from mlstack_ds.patches import apply_series, series_for_recipe
from mlstack_ds.plan.buildjobs import BuildConcurrency
from mlstack_ds.plan.buildplan import BuildPlan, plan_env
from mlstack_ds.recipe import Recipe
from mlstack_ds.runner import run_streaming
from mlstack_ds.source.cache import Cache, publish, sha256_of
from mlstack_ds.source.checkout import short_pin
from mlstack_ds.source.fetch import SourceSpec, SourceTree, fetch_source, source_pin
from mlstack_ds.source.gitrepo import rev_parse
from mlstack_ds.target_side import mlstack_build_wheel as build_wheel_module
from mlstack_ds.target_side import script

_NINJA_STEP_RE = re.compile(r"^\s*\[(\d+)/(\d+)\]")
_ERROR_RE = re.compile(r"error|Error|ERROR|FAILED|fatal")


@dataclass(frozen=True)
class BuiltWheel:
    wheel: Path
    sha256: str
    source_commit: str
    tree_hash: str
    cached: bool
    log: Path | None
    seconds: float


@dataclass
class BuildProgress:
    """What the build is doing now, from its output: the ops compiling and ninja's last step."""

    op: str = "preparing"
    step: str = ""
    on_change: Callable[[BuildProgress], None] | None = None

    def feed(self, line: str, op: str | None = None, running: tuple[str, ...] = ()) -> None:
        step = _NINJA_STEP_RE.match(line)
        now = ", ".join(running) if running else (op or self.op)
        if step:
            self.step = f"{step.group(1)}/{step.group(2)}"
        elif now == self.op:
            return
        self.op = now
        if self.on_change:
            self.on_change(self)


class _OpFailed(Exception):
    """Raised from the output reader when an op has failed: the runner then stops the whole build at once
    instead of letting the other ops' compiles run on."""


def wheel_dir(cache: Cache, plan: BuildPlan) -> Path:
    return cache.root / "wheels" / plan.cache_key


def cached_wheel(cache: Cache, plan: BuildPlan) -> Path | None:
    wheels = sorted(wheel_dir(cache, plan).glob("deepspeed-*.whl"))
    return wheels[0] if wheels else None


def checked_entry(wheel: Path) -> tuple[dict[str, object], str]:
    """A cache entry's build.json and its wheel's sha256, after checking the wheel against the sha256
    recorded when it was built: a flipped bit on disk, a truncated copy or a hand edit is named here, not
    by pip half-way through an install. An entry made before the hash was recorded is checked by the
    archive's own CRCs, then gets its hash recorded (when the cache is writable)."""
    meta_path = wheel.parent / "build.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), str) for k in ("source_commit", "tree_hash")):
            raise ValueError("not a build record")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _corrupt(wheel, f"its build record {meta_path.name} is unreadable: {exc}") from None
    digest = sha256_of(wheel)
    recorded = meta.get("wheel_sha256")
    if isinstance(recorded, str):
        if digest != recorded:
            raise _corrupt(wheel, f"sha256 {digest} != {recorded}, recorded when it was built")
        return meta, digest
    problem = _archive_problem(wheel)
    if problem:
        raise _corrupt(wheel, problem)
    with contextlib.suppress(OSError):  # a read-only shared cache is still usable, checked this way
        _write_json(meta_path, {**meta, "wheel_sha256": digest})
    return {**meta, "wheel_sha256": digest}, digest


def _corrupt(wheel: Path, problem: str) -> BuildError:
    return BuildError(f"cached wheel {wheel} is corrupt ({problem}); nothing was installed",
                      hint="run the same command with --rebuild: it builds the wheel again and replaces the "
                      f"entry (or delete {wheel.parent})")


def _archive_problem(wheel: Path) -> str | None:
    """What is wrong with the zip archive (a member whose CRC does not match, a broken directory), or None."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            bad = archive.testzip()
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
        return f"not a readable zip archive: {exc}"
    return f"member {bad} does not match its CRC-32" if bad else None


def _write_json(path: Path, data: dict[str, object]) -> None:
    """Replace `path` atomically: a reader sees the old record or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".build-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def build_wheel(
    plan: BuildPlan,
    recipe: Recipe,
    spec: SourceSpec,
    cache: Cache,
    base_env: Mapping[str, str],
    *,
    force: bool = False,
    progress: BuildProgress | None = None,
    status: Callable[[str], None] = lambda _msg: None,
) -> BuiltWheel:
    """Return the plan's wheel from the cache, or fetch, patch and build it there."""
    started = time.monotonic()
    final_dir = wheel_dir(cache, plan)
    hit = cached_wheel(cache, plan)
    if hit and not force:
        meta, digest = checked_entry(hit)
        return BuiltWheel(hit, digest, str(meta["source_commit"]), str(meta["tree_hash"]), True, None,
                          time.monotonic() - started)
    logs = cache.root / "logs"
    log_path = logs / f"build-{plan.cache_key}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    with cache.staging_dir("build") as staging:
        status(f"fetching DeepSpeed {recipe.version} ({spec.kind})")
        tree = fetch_source(recipe, spec, cache.root, staging / "src")
        _check_source_is_the_plans(plan, recipe, spec, tree)
        commit = tree.commit
        tree_hash = rev_parse(tree.path, f"{commit}^{{tree}}", BuildError)
        if plan.patches:
            status(f"applying {len(plan.patches)} patches")
            applied = apply_series(tree.path, series_for_recipe(recipe), store=tree.store)
            _check_series_is_the_plans(plan, applied.patches)
            tree_hash, commit = applied.tree_hash, applied.head
        concurrency = plan.concurrency
        at_once = f", {concurrency.ops_at_once} at once" if concurrency and concurrency.ops_at_once > 1 else ""
        status(f"building ops: {', '.join(plan.built_ops) or 'none'}{at_once} (log: {log_path})")
        out = staging / "wheel"
        env = build_env(plan, tree.path, staging, base_env)
        try:
            with early_compiles(cache, plan, tree.path, env, staging=staging,
                                log_path=log_path.with_name(f"{log_path.stem}-early.log")) as early:
                if early is not None:
                    status(f"compiling what the series changed first: {', '.join(early.sources)}")
                _compile(plan, tree.path, staging, out, base_env=base_env, log_path=log_path, progress=progress,
                         early_env=early.env if early else {})
        except CompilerKilled as killed:
            if concurrency is None or concurrency.processes <= 1:
                raise
            # Several builds on one host each planned for the memory free when they began; together they
            # can exhaust it, and the kernel kills a compiler. One compile at a time needs the least.
            log_path = log_path.with_name(f"{log_path.stem}-one-at-a-time.log")
            status(f"{killed.message.removeprefix('building DeepSpeed failed in ')}: "
                   f"building again one compile at a time (log: {log_path})")
            _compile(one_compile_at_a_time(plan), tree.path, staging, out, base_env=base_env, log_path=log_path,
                     progress=progress)
        wheels = sorted(out.glob("deepspeed-*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"the build produced {len(wheels)} DeepSpeed wheels", hint=f"full log: {log_path}")
        record_build(cache, plan, tree.path, env)
        digest = sha256_of(wheels[0])
        (out / "build.json").write_text(json.dumps(
            {"source_commit": commit, "tree_hash": tree_hash, "plan": plan.to_dict(), "log": str(log_path),
             "wheel_sha256": digest, "host": host_facts(find_cxx(plan_env(plan, base_env)))}, indent=2))
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        if final_dir.exists() and (force or cached_wheel(cache, plan) is None):
            _discard(final_dir, staging)  # what --rebuild replaces, or an entry without a wheel
        publish(out, final_dir)  # a concurrent build of the same plan that published first is kept
    wheel = cached_wheel(cache, plan)
    if wheel is None:
        raise BuildError(f"the wheel cache entry {final_dir} vanished while it was being made",
                         hint="another mlstack-ds process removed it; run the same command again")
    if wheel.name != wheels[0].name or sha256_of(wheel) != digest:  # theirs
        meta, digest = checked_entry(wheel)
        commit, tree_hash = str(meta["source_commit"]), str(meta["tree_hash"])
    return BuiltWheel(wheel, digest, commit, tree_hash, False, log_path, time.monotonic() - started)


def _discard(entry: Path, staging: Path) -> None:
    """Move a cache entry out of the way in one rename (a reader that has opened its wheel keeps reading it),
    then delete it with the staging directory."""
    os.rename(entry, staging / f"discarded-{entry.name}")


def wheel_command(python: str, tree: Path, out: Path) -> list[str]:
    """The command that builds `tree`'s wheel into `out` with `python` (the target's torch and setuptools).
    A tree that declares its own build system (pyproject.toml) goes through pip, which reads it. `out` must
    exist (setuptools' hook stages the wheel inside it). A tree without one (every DeepSpeed sdist) goes
    straight to setuptools' legacy `build_wheel` hook: target_side/mlstack_build_wheel.py says why."""
    if (tree / "pyproject.toml").exists():
        return [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir", "-v",
                "-w", str(out), str(tree)]
    return [python, "-u", str(script(build_wheel_module)), str(out)]


def build_env(plan: BuildPlan, tree: Path, staging: Path, base_env: Mapping[str, str]) -> dict[str, str]:
    """setup.py's whole environment: the plan's, and this build's additions."""
    return {**plan_env(plan, base_env), **build_time_env(plan, tree, staging, base_env)}


def build_time_env(plan: BuildPlan, tree: Path, staging: Path, base_env: Mapping[str, str]) -> dict[str, str]:
    """What this one build adds to the plan's environment (paths of this run, so not in the plan):
    - setuptools' build_ext `parallel` option, from a config file DIST_EXTRA_CONFIG names (read like the
      tree's own setup.cfg), when the plan builds several ops at once;
    - ccache's base directory: compile commands name files relative to the tree, so the same source
      compiled from another staging directory (a rebuild, another pin with the same file) is a hit. The
      debug info's directory is then that of the first build (CCACHE_NOHASHDIR), which no one reads: the
      tree is deleted after the build;
    - ccache compiles what its preprocessor run produced (CCACHE_NOCPP2): by default a miss preprocesses
      the source twice, once for the hash and again inside the compile, and torch's extension headers make
      that 1 to 3 s of CPU per file, work a hand build without ccache does once (issue 43, docs/benchmarks.md
      "Build speed"). The machine code and symbols are the same; only debug info's column numbers differ.
      A user's own CCACHE_CPP2/CCACHE_NOCPP2 is kept;
    - ccache's prefix command, which lets only `--jobs` compiles run at a time (build/compile_slots.py).
    """
    env: dict[str, str] = {}
    if plan.concurrency and plan.concurrency.ops_at_once > 1:
        config = staging / "build-ext.cfg"
        config.write_text(f"[build_ext]\nparallel = {plan.concurrency.ops_at_once}\n", encoding="utf-8")
        env["DIST_EXTRA_CONFIG"] = str(config)
    if plan.path_prepend and "CCACHE_BASEDIR" not in base_env:
        env["CCACHE_BASEDIR"] = str(tree)
        env.setdefault("CCACHE_NOHASHDIR", "1")
    if plan.path_prepend and not {"CCACHE_CPP2", "CCACHE_NOCPP2"} & base_env.keys():
        env["CCACHE_NOCPP2"] = "1"
    env.update(compile_slot_env(plan, staging, base_env))
    return env


class CompilerKilled(BuildError):
    """A compiler of the build was killed (SIGKILL): on Linux, the kernel's OOM killer. A build running
    several compiles at once goes again with one; otherwise this is the error."""


# What a compiler driver prints when its compiler proper dies of SIGKILL: gcc (cc1plus, and collect2 for
# the linker) and clang. Measured in issue 28's load runs: the OOM killer took cc1plus from a cold build
# running beside two others ('c++: fatal error: Killed signal terminated program cc1plus').
_KILLED_RE = re.compile(r"Killed signal terminated program \S+|terminated with signal 9 \[Killed\]"
                        r"|unable to execute command: Killed")


def compiler_killed(log: Path) -> str | None:
    """The line of an op's log that says its compiler was killed, if one does."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _KILLED_RE.search(text)
    if match is None:
        return None
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else None].strip()[:300]


def one_compile_at_a_time(plan: BuildPlan) -> BuildPlan:
    """The same build (the same wheel: concurrency is not part of the cache key) with one compiler process."""
    env = {k: v for k, v in plan.env.items() if k != "HIPCC_COMPILE_FLAGS_APPEND"}
    env["MAX_JOBS"] = "1"
    return replace(plan, env=env, concurrency=BuildConcurrency(1, 1, 1, 1, "memory"))


def _compile(plan: BuildPlan, tree: Path, staging: Path, out: Path, *, base_env: Mapping[str, str], log_path: Path,
             progress: BuildProgress | None, early_env: Mapping[str, str] | None = None) -> None:
    """Build the wheel of `tree` into `out` (emptied first); raise BuildError, or CompilerKilled when the op
    that failed lost its compiler to SIGKILL. Objects already compiled in the tree are kept: a second call
    compiles only what is missing."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    argv = wheel_command(plan.target_python, tree, out)
    env = {**build_env(plan, tree, staging, base_env), **(early_env or {})}
    op_logs = OpLogs(log_path.with_suffix(".ops"))

    def on_line(line: str) -> None:
        op = op_logs.feed(line)
        if progress:
            progress.feed(line, op, tuple(op_logs.running))
        if op_logs.failed:
            raise _OpFailed(op_logs.failed)

    stopped_by: str | None = None
    try:
        result = run_streaming(argv, log_path=log_path, env=env, cwd=tree, on_line=on_line)
    except _OpFailed as failed:
        stopped_by = str(failed)
    finally:
        op_logs.close()  # written out before _op_error reads the failed op's log
    if stopped_by is not None:
        raise _op_error(op_logs, stopped_by, log_path)
    if not result.ok:
        failed_op = op_logs.failed or (op_logs.last_op if op_logs.running else None)
        if failed_op:
            raise _op_error(op_logs, failed_op, log_path)
        raise BuildError(f"building DeepSpeed failed (exit {result.returncode}): {_first_error(result.stdout)}",
                         hint=f"full log: {log_path}")


def _op_error(op_logs: OpLogs, op: str, log_path: Path) -> BuildError:
    killed = compiler_killed(op_logs.path(op))
    if killed:
        return CompilerKilled(
            f"building DeepSpeed failed in op {op}: its compiler was killed, most likely by the kernel for want "
            f"of memory ({killed})",
            hint=f"free memory (other builds, or swap) and run again, or --jobs 1; the op's log: "
                 f"{op_logs.path(op)}")
    first = op_logs.first_error(op) or "see its log"
    return BuildError(f"building DeepSpeed failed in op {op}: {first}",
                      hint=f"the op's log: {op_logs.path(op)}; full log: {log_path}")


def _check_source_is_the_plans(plan: BuildPlan, recipe: Recipe, spec: SourceSpec, tree: SourceTree) -> None:
    """The plan hashed one source; build exactly that one (a local tree edited since the plan is refused,
    and a dirty checkout's copy must have the plan's digest)."""
    now = source_pin(recipe, spec)
    fetched = tree.pin or tree.sha256 or tree.commit
    if now == plan.source_pin and (now.startswith("tree:") or fetched == plan.source_pin):
        return
    changed = fetched if now == plan.source_pin else now  # a checkout edited while it was copied: the copy's
    raise BuildError(f"the source changed since the plan was made (plan {short_pin(plan.source_pin, 17)}, "
                     f"now {short_pin(changed, 17)})",
                     hint="run the same command again to plan for the source as it is now")


def _check_series_is_the_plans(plan: BuildPlan, applied: tuple[tuple[str, str], ...]) -> None:
    """The plan (and so the cache key) names each patch by its sha256; build with exactly those."""
    planned = tuple((p.name, p.sha256) for p in plan.patches)
    if tuple(applied) != planned:
        changed = sorted({name for name, _ in set(applied) ^ set(planned)})
        raise BuildError(f"the patch series changed since the plan was made: {', '.join(changed)}",
                         hint="run the same command again to plan with the series as it is now")


def _first_error(output: str) -> str:
    """The most telling line of a failed build's output (the first compiler error, else the last line)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR_RE.search(ln) and "warning" not in ln.lower()]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]
