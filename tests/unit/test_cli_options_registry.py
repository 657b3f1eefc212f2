"""The options registry holds: a flag is declared once in `mlstack_ds/cli/`, and a flag two commands take is
declared in `cli/options.py`, in one style (`Annotated`, the default at the parameter)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from support.cli import cli_commands, command_options

import mlstack_ds.cli

CLI_DIR = Path(mlstack_ds.cli.__file__).parent
REGISTRY = "options.py"


def _typer_calls(tree: ast.AST) -> list[ast.Call]:
    """`typer.Option(...)` and `typer.Argument(...)` calls."""
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "typer"
            and node.func.attr in ("Option", "Argument")]


def _declarations() -> dict[str, list[str]]:
    """Every flag name (`--hostfile`) to the places (`verify_cmd.py:31`) whose typer.Option names it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(CLI_DIR.glob("*.py")):
        for call in _typer_calls(ast.parse(path.read_text(encoding="utf-8"))):
            for arg in call.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    found[arg.value].append(f"{path.name}:{call.lineno}")
    return found


def test_the_scan_sees_the_declarations() -> None:
    declared = _declarations()
    assert {"--json", "--python", "--hostfile", "--cache-dir", "--world-size", "--tool-timeout"} <= set(declared)


def test_no_flag_is_declared_twice() -> None:
    twice = {flag: places for flag, places in _declarations().items() if len(places) > 1}
    assert not twice, f"declare these once, in cli/{REGISTRY}: {twice}"


def test_a_flag_two_commands_take_is_declared_in_the_registry() -> None:
    users: dict[str, list[str]] = defaultdict(list)
    for path, command in cli_commands().items():
        for flag in command_options(command):
            users[flag].append(path)
    declared = _declarations()
    outside = {flag: (declared.get(flag), commands) for flag, commands in users.items()
               if len(commands) > 1 and flag != "--help"
               and any(not place.startswith(f"{REGISTRY}:") for place in declared.get(flag, ["?"]))}
    assert not outside, f"options taken by two or more commands belong in cli/{REGISTRY}: {outside}"


def test_one_style_the_default_is_never_an_argument_of_the_declaration() -> None:
    """`Annotated[int, typer.Option("--jobs", ...)] = None`, never `typer.Option(None, "--jobs", ...)`."""
    old_style = []
    for path in sorted(CLI_DIR.glob("*.py")):
        for call in _typer_calls(ast.parse(path.read_text(encoding="utf-8"))):
            kind = call.func.attr  # type: ignore[attr-defined]
            first = call.args[0] if call.args else None
            flag_first = isinstance(first, ast.Constant) and str(first.value).startswith("-")
            default_given = bool(call.args) or any(k.arg == "default" for k in call.keywords)
            if (kind == "Option" and not flag_first) or (kind == "Argument" and default_given):
                old_style.append(f"{path.name}:{call.lineno}")
    assert not old_style, old_style


def test_python_is_resolved_by_its_callback_only() -> None:
    """No command body resolves `--python` again: only the registry names `resolve_python`."""
    users = []
    for path in sorted(CLI_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name | ast.alias) and "resolve_python" in (getattr(node, "id", None),
                                                                                getattr(node, "name", None)):
                users.append(path.name)
    assert set(users) == {REGISTRY}, users


def test_one_wording_where_the_flag_means_the_same() -> None:
    commands = cli_commands()
    for flag in ("--cache-dir", "--git-url", "--git-commit", "--sha256", "--arch", "--jobs", "--rebuild",
                 "--no-patches", "--dry-run", "--micro-batch", "--series"):
        declared = [command_options(c)[flag] for c in commands.values() if flag in command_options(c)]
        assert len(declared) > 1, flag
        assert len({(p.help, p.metavar) for p in declared}) == 1, flag  # type: ignore[attr-defined]


def test_the_ds_config_is_config_with_its_alias_everywhere() -> None:
    commands = cli_commands()
    for path in ("doctor", "verify", "bench"):
        options = command_options(commands[path])
        assert options["--config"] is options["--ds-config"], path
