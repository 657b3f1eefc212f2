"""Shared options mean the same in every command: `--json`, `--python`, `--recipe`/`--deepspeed-version`,
and one default `--source` for `fetch`, `install` and `build`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import CliResult, cli_commands, command_options, run_cli

from mlstack_ds.recipe import find_recipe

SHIPPED_RECIPE = find_recipe().path


def cli(*args: str, **env: str) -> CliResult:
    return run_cli(*args, env=env, timeout=300)


def test_shared_options_are_one_declaration_everywhere() -> None:
    commands = cli_commands()
    with_recipe = {path for path, c in commands.items() if "--recipe" in command_options(c)}
    with_alias = {path for path, c in commands.items() if "--deepspeed-version" in command_options(c)}
    assert with_recipe == with_alias
    assert with_recipe >= {"install", "build", "fetch", "doctor", "recipes show", "patches list", "patches check",
                           "patches apply", "patches status"}
    for option in ("--json", "--python", "--recipe", "--source"):
        declared = [command_options(c)[option] for c in commands.values() if option in command_options(c)]
        assert declared, option
        signatures = {(p.help, p.metavar, p.default) for p in declared}  # type: ignore[attr-defined]
        assert len(signatures) == 1, (option, signatures)
    assert {path for path, c in commands.items() if "--source" in command_options(c)} == {"install", "build", "fetch",
                                                                                       "bundle"}
    assert {path for path, c in commands.items() if "--python" in command_options(c)} >= {
        "detect", "doctor", "install", "build", "verify", "status", "rollback", "uninstall"}


@pytest.mark.parametrize("command", [["detect"], ["doctor"], ["install", "--dry-run"], ["build", "--dry-run"],
                                     ["verify"], ["status"], ["rollback"], ["uninstall"]])
def test_python_is_resolved_the_same_way_by_every_command(tmp_path: Path, command: list[str]) -> None:
    result = cli(*command, "--python", str(tmp_path), "--json")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"error: --python {tmp_path}: a directory without bin/python",
                                          "hint: pass the venv's python"]
    assert json.loads(result.stdout)["error"]["exit_code"] == 2


@pytest.mark.parametrize("recipe", ["--recipe=deepspeed-0.19.5", "--recipe=0.19.5", f"--recipe={SHIPPED_RECIPE}",
                                    "--deepspeed-version=0.19.5", "--deepspeed-version=deepspeed-0.19.5",
                                    f"--deepspeed-version={SHIPPED_RECIPE}"])
def test_recipe_and_its_alias_take_a_name_a_version_or_a_file(recipe: str) -> None:
    shown = cli("recipes", "show", "--json", recipe)
    assert shown.returncode == 0 and json.loads(shown.stdout)["path"] == str(SHIPPED_RECIPE)
    listed = cli("patches", "list", "--json", recipe)
    assert listed.returncode == 0 and json.loads(listed.stdout)["patches"]


@pytest.mark.parametrize("recipe", [f"--recipe={SHIPPED_RECIPE}", "--deepspeed-version=0.19.5"])
def test_install_plans_from_a_recipe_file_or_a_version(recipe: str) -> None:
    planned = cli("install", "--dry-run", "--json", recipe)
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["plan"]["recipe"] == "deepspeed-0.19.5"


def test_an_unknown_recipe_is_one_usage_error_everywhere(tmp_path: Path) -> None:
    for command in (["install", "--dry-run"], ["build", "--dry-run"], ["fetch", "--dest", str(tmp_path / "d")],
                    ["patches", "list"], ["recipes", "show"], ["doctor"]):
        result = cli(*command, "--deepspeed-version", "0.0.1")
        assert result.returncode == 2, (command, result.stderr)
        assert result.stderr.splitlines() == ["error: no recipe named '0.0.1'",
                                              "hint: available recipes: deepspeed-0.19.5, deepspeed-0.19.8"], command


def test_recipes_show_refuses_two_different_recipes() -> None:
    result = cli("recipes", "show", "deepspeed-0.19.5", "--recipe", "0.0.1")
    assert result.returncode == 2 and result.stderr.startswith("error: two recipes given")


def test_fetch_and_install_default_to_the_same_source(tmp_path: Path) -> None:
    """pypi for both (it was git for fetch, pypi for install). No index here: pip fails at once, which is
    enough to see which source was chosen."""
    planned = cli("install", "--dry-run", "--json")
    assert json.loads(planned.stdout)["plan"]["source"] == "pypi"
    fetched = cli("fetch", "--dest", str(tmp_path / "ds"), "--cache-dir", str(tmp_path / "cache"),
                  PIP_NO_INDEX="1", PIP_FIND_LINKS="")
    assert "from pypi ..." in fetched.stderr.splitlines()[0]
    assert fetched.returncode == 4, fetched.stderr


def test_a_failing_result_is_still_one_json_document(tmp_path: Path) -> None:
    """`patches lint --json` with problems: its report with the error inside, not two documents."""
    (tmp_path / "series").write_text("0001-missing.patch\n")
    result = cli("patches", "lint", str(tmp_path), "--json")
    assert result.returncode == 5, result.stderr
    document = json.loads(result.stdout)  # exactly one document
    assert document[str(tmp_path)] and document["error"]["exit_code"] == 5
    assert document["error"]["message"].endswith("lint problem(s) in the patch series")
    assert result.stderr.splitlines()[0].startswith("error: ")
