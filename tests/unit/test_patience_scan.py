"""Every wait on a process takes its bound from the one table (mlstack_ds/patience.py), read from the source.

Why a scan: the table only helps while nothing goes around it. The waits had grown one constant at a time
beside each caller (a fixed 150 s for a node probe that imports torch, 30 s for a ROCm tool), and the next
`timeout=60` would look as harmless. So the source is parsed and every call that waits on a child
(runner.run, run_in_background, wait_patiently, subprocess.run, `.wait(timeout=)`, `.communicate(timeout=)`)
must name its bound without a number of its own or a module constant: a `WAITS[...]` entry, a parameter
(which a caller filled from the table or a user's option), or a Patience built from those.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from mlstack_ds import patience
from mlstack_ds.patience import WAITS

PACKAGE = Path(__file__).resolve().parents[2] / "mlstack_ds"
CONSTANT_NAME = re.compile(r"^(?:\w+_)?(?:TIMEOUT|STALL|CEILING|GRACE)_S$")
WAITING_FUNCTIONS = {"run", "run_in_background", "wait_patiently", "run_on", "start_on", "run_step", "check_reachable",
                     "copy_to", "fetch_from", "run_tool", "run_tool_on_each", "script_on_each"}
WAITING_METHODS = {"wait", "communicate"}
BOUND_KEYWORDS = ("timeout", "timeout_s", "patience")
# Files that cannot take their bound from the table, and why. Each is run where mlstack_ds is not importable.
# The table's own names (WAITS; the defaults of users' `--timeout` options), which callers may use.
TABLE_NAMES = frozenset(name for name in vars(patience) if name.isupper())
ALLOWED: dict[str, str] = {
    "rehearsal/standin.py": "a stdlib-only stand-in for hipcc, run by path by a rehearsal's build: no mlstack_ds there",
}


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "patience.py" or relative in ALLOWED:
            continue
        yield relative, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _called(call: ast.Call) -> tuple[str, str | None]:
    """(name, receiver): `run(...)` -> ("run", None); `subprocess.run(...)` -> ("run", "subprocess")."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id, None
    if isinstance(func, ast.Attribute):
        receiver = func.value.id if isinstance(func.value, ast.Name) else None
        return func.attr, receiver
    return "", None


def _own_number(expr: ast.expr) -> str | None:
    """What in `expr` is a bound of its own: a number, or an UPPER_CASE constant not from patience.py."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return repr(node.value)
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is not None and name.isupper() and name not in TABLE_NAMES:
            return name
    return None


def _default_problems(relative: str, function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A parameter that bounds a wait (`timeout`, `timeout_s`, `patience`) with a number as its default: a
    bound of its own for every caller that leaves it out."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    pairs = [*zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults, strict=True),
             *((a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is not None)]
    return [f"{relative}:{function.lineno}: {function.name}({arg.arg}=...) defaults to {own}, not patience.WAITS"
            for arg, default in pairs if arg.arg in BOUND_KEYWORDS and (own := _own_number(default)) is not None]


def bound_problems(relative: str, tree: ast.Module) -> list[str]:
    """Each call in `tree` whose time-out is not the table's, and each time-out constant defined there."""
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and CONSTANT_NAME.match(target.id):
                    problems.append(f"{relative}:{node.lineno}: defines {target.id} (put it in patience.WAITS)")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            problems += _default_problems(relative, node)
        if not isinstance(node, ast.Call):
            continue
        name, receiver = _called(node)
        waits = name in WAITING_FUNCTIONS or name in WAITING_METHODS
        if not waits:
            continue
        bounds = [kw for kw in node.keywords if kw.arg in BOUND_KEYWORDS]
        if receiver == "subprocess" and name == "run" and not bounds:
            problems.append(f"{relative}:{node.lineno}: subprocess.run without a time-out (use runner.run)")
        for keyword in bounds:
            own = _own_number(keyword.value)
            if own is not None:
                problems.append(f"{relative}:{node.lineno}: {name}({keyword.arg}=...) uses {own}, not patience.WAITS")
    return problems


def test_every_wait_takes_its_bound_from_the_table() -> None:
    problems = [problem for relative, tree in _sources() for problem in bound_problems(relative, tree)]
    assert problems == [], "\n".join(problems)


def test_every_named_wait_is_in_the_table() -> None:
    """`WAITS["..."]` with a name the table lacks would fail only when that wait happens: found here instead."""
    unknown = []
    for relative, tree in _sources():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "WAITS"
                    and isinstance(node.slice, ast.Constant) and node.slice.value not in WAITS):
                unknown.append(f"{relative}:{node.lineno}: WAITS[{node.slice.value!r}]")
    assert unknown == []


def test_the_scan_finds_what_it_is_for() -> None:
    """The scan's own check, on the shapes the tool had before the table (all of them were there)."""
    before = ast.parse(
        "import subprocess\n"
        "TOOL_TIMEOUT_S = 30.0\n"
        "NODE_TIMEOUT_S = 150.0\n"
        "def probe(run, runner, proc, argv):\n"
        "    run([argv], timeout=30)\n"
        "    runner.run(argv, timeout=TOOL_TIMEOUT_S, stall_s=60)\n"
        "    subprocess.run(argv, timeout=300)\n"
        "    subprocess.run(argv, check=True)\n"
        "    proc.communicate(timeout=5)\n"
        "    runner.run(argv, patience=Patience(ceiling_s=150.0))\n")
    found = bound_problems("before.py", before)
    assert [p.split(": ", 1)[0] for p in found] == [f"before.py:{n}" for n in (2, 3, 5, 6, 7, 8, 9, 10)]
    after = ast.parse(
        "def probe(run, runner, proc, argv, patience, seconds):\n"
        "    run([argv], patience=WAITS['rocm tool'])\n"
        "    runner.run(argv, patience=patience)\n"
        "    proc.communicate(timeout=seconds)\n"
        "    runner.run(argv, patience=Patience(ceiling_s=seconds + WAITS['ssh command'].ceiling_s))\n")
    assert bound_problems("after.py", after) == []


def test_each_allowed_file_still_needs_its_exception() -> None:
    """An exception that is no longer needed goes: the list names only what really cannot use the table."""
    for relative in ALLOWED:
        tree = ast.parse((PACKAGE / relative).read_text(encoding="utf-8"))
        assert bound_problems(relative, tree), f"{relative} no longer needs its place in ALLOWED"


def test_no_parameter_is_named_timeout() -> None:
    """Seconds are `_s` names (`timeout_s`), or a `patience`: `timeout` had meant a ceiling in some signatures
    and a fixed bound in others (21 of them, beside 15 `timeout_s`)."""
    named = [f"{relative}:{node.lineno}: {node.name}(timeout)" for relative, tree in _sources()
             for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
             for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs) if arg.arg == "timeout"]
    assert named == []
