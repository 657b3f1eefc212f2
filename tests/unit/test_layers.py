"""The package's layers, read from the code: every `mlstack_ds` import, found with `ast`, goes down the
order declared in scripts/architecture.py (the `architecture` fixture), stays inside its own unit, or is
one of the same-layer pairs listed there with a reason; and no two top-level units reach each other. An
import runs the `__init__.py` of every package on its path, so the graph counts those too. A new unit needs
a place in that order, so the folder names keep telling where a change belongs. The units that run where
mlstack_ds is absent (STANDALONE_UNITS) import nothing of it, and only the standard library to start."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parents[2] / "mlstack_ds"
MAX_FLAT_MODULES = 12


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> set[str]:
    """Every `mlstack_ds` module `path` imports, at any depth of the file (imports inside functions count)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    modules = {m for m in found if m == "mlstack_ds" or m.startswith("mlstack_ds.")}
    return {m for m in modules if resolves(m)}


def resolves(module: str) -> bool:
    relative = Path(*module.split(".")[1:]) if "." in module else Path()
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


def packages_run_by(module: str) -> set[str]:
    """`a.b.c` and the packages whose `__init__.py` importing it runs first: `a`, `a.b`."""
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts) + 1)}


def written_graph() -> dict[str, set[str]]:
    """Each module's imports as written."""
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """Each module's imports with the packages they run: what an `__init__.py` imports counts for every
    importer of a module below it, not only for those who import the package by name."""
    return {module: set().union(*map(packages_run_by, targets))
            for module, targets in written_graph().items()}


def unit_graph() -> dict[str, set[str]]:
    units: dict[str, set[str]] = defaultdict(set)
    for module, targets in import_graph().items():
        units[unit_of(module)].update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    return units


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def test_every_unit_has_a_layer(architecture: ModuleType) -> None:
    declared = set().union(*(units for _, units in architecture.LAYERS))
    actual = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert actual == declared, f"add {sorted(actual - declared)} to LAYERS; remove {sorted(declared - actual)}"


def test_imports_only_go_down(architecture: ModuleType) -> None:
    layers = architecture.LAYERS
    layer = {unit: index for index, (_, units) in enumerate(layers) for unit in units}
    upward = [f"{module} imports {target} ({layers[layer[unit_of(target)]][0]} is above "
              f"{layers[layer[unit_of(module)]][0]})"
              for module, targets in sorted(import_graph().items()) for target in sorted(targets)
              if layer[unit_of(target)] > layer[unit_of(module)]]
    assert not upward, "\n".join(upward)


def test_units_of_one_layer_import_each_other_only_where_listed(architecture: ModuleType) -> None:
    layer = {unit: index for index, (_, units) in enumerate(architecture.LAYERS) for unit in units}
    allowed = {(unit, package) for (unit, target) in architecture.SAME_LAYER
               for package in packages_run_by(f"mlstack_ds.{target}")}
    sideways = [f"{module} imports {target}: add it to SAME_LAYER with a reason, or move it down a layer"
                for module, targets in sorted(import_graph().items()) for target in sorted(targets)
                if unit_of(target) != unit_of(module) and layer[unit_of(target)] == layer[unit_of(module)]
                and (unit_of(module), target) not in allowed]
    assert not sideways, "\n".join(sideways)


def test_every_same_layer_pair_is_used(architecture: ModuleType) -> None:
    """A stale entry would let a later import through unargued."""
    used = {(unit_of(module), target.removeprefix("mlstack_ds.")) for module, targets in written_graph().items()
            for target in targets}
    assert not set(architecture.SAME_LAYER) - used, sorted(set(architecture.SAME_LAYER) - used)


def test_no_unit_reaches_one_that_reaches_it_back() -> None:
    graph = unit_graph()
    cycles = sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if a < b and a in reachable(graph, b))
    assert not cycles, cycles


def test_doctor_never_imports_the_builder() -> None:
    """doctor judges an install (installed/) but must run where nothing can be built."""
    graph = import_graph()
    reached = set().union(*(reachable(graph, m) for m in graph if unit_of(m) == "doctor"))
    builder = sorted(m for m in reached if unit_of(m) in {"build", "install", "source", "patches"})
    assert not builder, builder


def test_the_worker_imports_nothing_of_the_tool() -> None:
    """It is copied into the target and run with `-m` there, where mlstack_ds is not installed; read as written,
    since there it is a top-level package of its own and mlstack_ds/__init__.py does not run."""
    graph = written_graph()
    outside = sorted({t for m, targets in graph.items() if unit_of(m) == "worker" for t in targets
                      if unit_of(t) != "worker"})
    assert not outside, outside


def test_standalone_units_import_nothing_of_the_tool(architecture: ModuleType) -> None:
    """Each of their modules runs alone where mlstack_ds is absent: an import of mlstack_ds, its own unit's
    modules included, would fail there (read as written: nothing of mlstack_ds runs there)."""
    graph = written_graph()
    found = sorted(f"{m} imports {t}" for m, targets in graph.items() if unit_of(m) in architecture.STANDALONE_UNITS
                   for t in targets)
    assert not found, found


def standalone_imports(path: Path) -> tuple[set[str], set[str]]:
    """The top-level names a module imports: at its top level, and anywhere (inside functions too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def names(nodes: list[ast.AST]) -> set[str]:
        found = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.add("." if node.level else (node.module or "").split(".")[0])
        return found

    return names(list(tree.body)), names(list(ast.walk(tree)))


def test_standalone_units_need_only_the_standard_library_to_start(architecture: ModuleType) -> None:
    """At their top level only the standard library (what the target's interpreter surely has); inside a
    function the target's own packages (torch, deepspeed, hjson), never a sibling module or a relative
    import (a module sent as text to `python -` has no siblings)."""
    problems = []
    for unit in architecture.STANDALONE_UNITS:
        modules = sorted((PACKAGE / unit).glob("*.py"))
        siblings = {p.stem for p in modules} | {"mlstack_ds", "."}
        for path in modules:
            top, anywhere = standalone_imports(path)
            problems += [f"{path.name}: {n} at the top level" for n in sorted(top - set(sys.stdlib_module_names))]
            problems += [f"{path.name}: imports {n}" for n in sorted(anywhere & siblings)]
    assert not problems, problems


def test_a_standalone_module_importing_the_tool_fails_the_check(tmp_path: Path) -> None:
    """The check itself: a target_side module importing mlstack_ds, or a sibling inside a function, is found."""
    bad = tmp_path / "mlstack_bad.py"
    bad.write_text("import json\nfrom mlstack_ds.errors import UsageError\n\ndef f():\n    import mlstack_purelib\n")
    top, anywhere = standalone_imports(bad)
    assert top - set(sys.stdlib_module_names) == {"mlstack_ds"} and "mlstack_purelib" in anywhere


def test_few_modules_stay_flat_at_the_package_root() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= MAX_FLAT_MODULES, flat


def test_the_graph_sees_relative_and_nested_imports() -> None:
    """The reader itself: a relative import inside the worker and an import inside a function are found, and
    `from mlstack_ds.index.choose import choose` counts index/__init__.py as run."""
    graph = import_graph()
    assert "mlstack_ds.worker.protocol" in graph["mlstack_ds.worker.training"]
    assert any(unit_of(t) == "cli" for t in graph["mlstack_ds.__main__"])
    assert {"mlstack_ds", "mlstack_ds.index"} <= graph["mlstack_ds.doctor.engine"]
