"""Compile the sources a patch changed while DeepSpeed's setup.py starts, not after (issue 43).

Why: in a rebuild after a one-op patch every other object is a ccache hit, and the changed source's
compile is the critical path; setup.py gets to it only after ~10 s of start-up on one core (it imports
torch and all of DeepSpeed, probes the compilers, copies the Python files), the other core idle.

How: after each build the cache keeps, per plan family (the plan without its patch series: same pin,
targets, flags, interpreter and torch), each op's build.ninja as torch wrote it and each object's in-tree
dependencies (ninja's deps log) with their git blob ids. The next build of the family compares those
blobs with its patched tree. The objects whose dependencies changed (at most the plan's `jobs`) are
compiled at once by the same ninja from the same build.ninja, in the op's own build directory, holding a
lock there. torch later runs `ninja` by name in that directory and finds target_side/mlstack_ninja_turn.py
first on PATH: it waits for the lock and becomes the real ninja, whose log then has those objects up to
date. Nothing is built differently: when torch writes a different build.ninja (a patch changed the
flags) ninja sees a different command and compiles again; an early compile that fails is compiled again
by setup.py, which reports the error as always.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.build.oplogs import op_name
from mlstack_ds.errors import BuildError, ToolError
from mlstack_ds.patience import WAITS
from mlstack_ds.plan.buildplan import BuildPlan
from mlstack_ds.runner import run_in_background
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.gitrepo import git
from mlstack_ds.target_side import mlstack_ninja_turn as ninja_turn
from mlstack_ds.target_side import runnable_copy

SCHEMA = 1
STATE_DIR = "early-compile"


@dataclass(frozen=True)
class OpObjects:
    """One op's build directory after a build (paths relative to the tree)."""

    directory: str
    build_ninja: str  # as torch wrote it, with the tree's absolute path in it
    objects: dict[str, tuple[str, ...]]  # object -> the in-tree files it was compiled from


@dataclass(frozen=True)
class EarlyCompiles:
    """What started: the environment setup.py needs (the stand-in first on PATH) and the sources."""

    env: dict[str, str]
    sources: tuple[str, ...]


def family_key(plan: BuildPlan) -> str:
    """The plan without its series (and the cache key that depends on it): builds that compile the same
    sources with the same commands unless a patch changed them."""
    material = {k: v for k, v in plan.to_dict().items() if k not in {"patches", "cache_key", "notes", "concurrency"}}
    material["env"] = {k: v for k, v in plan.env.items() if k != "MAX_JOBS"}  # how many at once, not how
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24]


def state_path(cache: Cache, plan: BuildPlan) -> Path:
    return cache.root / STATE_DIR / f"{family_key(plan)}.json"


def parse_ninja_deps(text: str, op_dir: Path, tree: Path) -> dict[str, tuple[str, ...]]:
    """`ninja -t deps` output -> {object: in-tree dependencies}, both relative to `tree`. Dependencies are
    relative to `op_dir` (ccache's base directory rewrites them) or absolute; those outside the tree
    (torch's headers) are left out: the plan family pins them."""
    objects: dict[str, tuple[str, ...]] = {}
    current: str | None = None
    deps: list[str] = []
    tree_prefix = f"{os.path.normpath(tree)}{os.sep}"

    def inside(path: str) -> str | None:
        if os.path.isabs(path) and not path.startswith(tree_prefix):
            return None  # most of them (torch's headers): no path arithmetic for those
        full = os.path.normpath(os.path.join(op_dir, path))
        return full.removeprefix(tree_prefix) if full.startswith(tree_prefix) else None

    for line in [*text.splitlines(), ""]:
        if line.startswith((" ", "\t")) and current is not None:
            dep = inside(line.strip())
            if dep is not None:
                deps.append(dep)
            continue
        if current is not None:
            objects[current] = tuple(deps)
            current = None
        if ": #deps" in line:
            target = inside(line.split(": #deps", 1)[0])
            current, deps = target, []
    return {obj: tuple(found) for obj, found in objects.items() if obj and found}


def tree_blobs(tree: Path) -> dict[str, str]:
    """Every tracked file of the tree's HEAD -> its git blob id (one `git ls-tree`)."""
    out = git(["ls-tree", "-r", "-z", "HEAD"], cwd=tree, error=BuildError, what="git ls-tree").stdout
    blobs: dict[str, str] = {}
    for entry in out.split("\0"):
        meta, _, path = entry.partition("\t")
        fields = meta.split()
        if path and len(fields) == 3 and fields[1] == "blob":
            blobs[path] = fields[2]
    return blobs


def record(cache: Cache, plan: BuildPlan, tree: Path, env: Mapping[str, str]) -> None:
    """Keep this build's op directories for the family's next build. Best effort: a build that cannot
    be read back (no ninja on PATH, a setuptools build without it) only means no early compile later."""
    ninja = shutil.which("ninja", path=env.get("PATH"))
    if ninja is None:
        return
    ops: list[OpObjects] = []
    try:
        with contextlib.ExitStack() as stack:  # all at once: each reads a deps log of ~5,000 headers per object
            asked = [(build_file.parent, stack.enter_context(run_in_background(
                         [ninja, "-C", str(build_file.parent), "-t", "deps"], patience=WAITS["ninja deps"])))
                     for build_file in sorted(tree.glob("build/temp.*/*/build.ninja"))]
            blobs = tree_blobs(tree)
            for op_dir, pending in asked:
                deps = pending.result()
                if deps.ok:
                    ops.append(OpObjects(str(op_dir.relative_to(tree)),
                                         (op_dir / "build.ninja").read_text(encoding="utf-8"),
                                         parse_ninja_deps(deps.stdout, op_dir, tree)))
    except (ToolError, BuildError, OSError):
        return
    needed = {dep for op in ops for found in op.objects.values() for dep in found}
    state = {"schema": SCHEMA, "tree": str(tree), "blobs": {p: b for p, b in blobs.items() if p in needed},
             "ops": [{"directory": op.directory, "build_ninja": op.build_ninja, "objects": op.objects} for op in ops]}
    path = state_path(cache, plan)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(state), encoding="utf-8")
        os.replace(partial, path)  # a reader sees the old state or this one, never half of it
    except OSError:
        return


def load(cache: Cache, plan: BuildPlan) -> tuple[str, dict[str, str], list[OpObjects]] | None:
    """The family's last build: (its tree's path, blobs, op directories), or None."""
    try:
        state = json.loads(state_path(cache, plan).read_text(encoding="utf-8"))
        if state.get("schema") != SCHEMA:
            return None
        ops = [OpObjects(o["directory"], o["build_ninja"], {k: tuple(v) for k, v in o["objects"].items()})
               for o in state["ops"]]
        return str(state["tree"]), dict(state["blobs"]), ops
    except (OSError, ValueError, KeyError, TypeError):
        return None


def changed_objects(ops: list[OpObjects], before: Mapping[str, str], now: Mapping[str, str],
                    built_ops: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """{op directory: objects} of the planned ops whose in-tree dependencies changed. Left to setup.py: an
    object with a dependency that is not a tracked file in both trees (hipify's generated sources), and one
    whose source an earlier op compiles too (fused_adam's copy of cpu_adam_impl.cpp: patch 0025 has that op
    wait for the first, whose object ccache then gives it; two early ninjas would compile it twice)."""
    changed: dict[str, tuple[str, ...]] = {}
    sources: set[str] = set()
    for op in ops:
        if op_name(Path(op.directory).name) not in built_ops:
            continue
        found = tuple(obj for obj, deps in op.objects.items()
                      if all(d in before and d in now for d in deps) and any(before[d] != now[d] for d in deps)
                      and deps[0] not in sources)
        sources.update(op.objects[obj][0] for obj in found)
        if found:
            changed[op.directory] = found
    return changed


def ninja_targets(op: OpObjects, changed: tuple[str, ...], compiled_elsewhere: set[str]) -> tuple[str, ...]:
    """What the early ninja of `op` builds: its `changed` objects, and its others (ccache hits, as a rule:
    setup.py's ninja then finds the op done) but for a copy of a source another op's early ninja compiles
    (changed_objects says why)."""
    return tuple(obj for obj, deps in op.objects.items() if obj in changed or deps[0] not in compiled_elsewhere)


@contextlib.contextmanager
def early_compiles(cache: Cache, plan: BuildPlan, tree: Path, env: Mapping[str, str], *, staging: Path,
                   log_path: Path) -> Iterator[EarlyCompiles | None]:
    """Start the early compiles of this build (None: nothing to start) for the block; what still runs at
    its end (an op setup.py never reached) is stopped."""
    last = load(cache, plan)
    ninja = shutil.which("ninja", path=env.get("PATH"))
    if last is None or ninja is None:
        yield None
        return
    last_tree, before, ops = last
    concurrency = plan.concurrency
    jobs, jobs_per_op = (concurrency.jobs, concurrency.jobs_per_op) if concurrency else (1, 1)
    try:
        work = changed_objects(ops, before, tree_blobs(tree), plan.built_ops)
    except BuildError:
        work = {}
    count = sum(len(objects) for objects in work.values())
    if not 0 < count <= jobs:  # nothing changed, or so much that the whole build is the work
        yield None
        return
    with contextlib.ExitStack() as stack:
        try:
            stand_in = runnable_copy(ninja_turn, staging / "ninja-turn" / "ninja", plan.target_python)
            sources = _start(stack, ops=ops, work=work, last_tree=last_tree, tree=tree, ninja=ninja,
                             jobs_per_op=jobs_per_op, env=env, log_path=log_path) if stand_in else None
        except OSError:  # a file it cannot write: the build goes on without (what started is stopped)
            stack.close()
            stand_in = sources = None
        if stand_in is None or sources is None:
            yield None
        else:
            yield EarlyCompiles({"PATH": os.pathsep.join([str(stand_in.parent), env.get("PATH", "")]),
                                 ninja_turn.REAL_NINJA: ninja}, sources)


def _start(stack: contextlib.ExitStack, *, ops: list[OpObjects], work: Mapping[str, tuple[str, ...]], last_tree: str,
           tree: Path, ninja: str, jobs_per_op: int, env: Mapping[str, str], log_path: Path) -> tuple[str, ...]:
    """Start one early ninja per op of `work` (each held by `stack`); the sources they compile."""
    by_directory = {op.directory: op for op in ops}
    log_path.parent.mkdir(parents=True, exist_ok=True)  # a new cache has no logs directory yet
    log = stack.enter_context(log_path.open("w", encoding="utf-8"))
    for directory in work:
        op_dir = tree / directory
        op_dir.mkdir(parents=True, exist_ok=True)
        (op_dir / "build.ninja").write_text(by_directory[directory].build_ninja.replace(last_tree, str(tree)),
                                            encoding="utf-8")
        elsewhere = {by_directory[d].objects[obj][0] for d, objects in work.items() if d != directory
                     for obj in objects}
        targets = [str(tree / obj) for obj in ninja_targets(by_directory[directory], work[directory], elsewhere)]
        fd = os.open(op_dir / ninja_turn.LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held by the early ninja (and so by its compilers) until it exits
            stack.enter_context(run_in_background(
                [ninja, "-C", str(op_dir), "-v", "-j", str(min(len(targets), jobs_per_op)), *targets],
                patience=WAITS["early compile"], env=env, pass_fds=(fd,), stdout_file=log))
        finally:
            os.close(fd)
    return tuple(sorted({by_directory[d].objects[obj][0] for d, objects in work.items() for obj in objects}))
