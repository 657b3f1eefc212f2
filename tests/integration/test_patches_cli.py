"""The fetch/patches/recipes commands as a user runs them (real subprocess, real pip, real git):
`fetch --source pypi` then `patches apply` gives the same tree and commit hashes on two runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import run_cli
from support.patchmaker import PatchMaker, insert_line, new_file, replace_text, write_series

from mlstack_ds.errors import ExitCode


def flat(text: str) -> str:
    """Output with line wrapping undone (rich wraps long messages at the terminal width)."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def cli_series(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli-series")
    maker = PatchMaker(pristine_tree_template, root / "work")
    builder = "op_builder/builder.py"
    # After the licence header: the shipped series changes builder.py's imports, and this patch is also
    # applied on top of that series.
    good = maker.diff(insert_line(builder, 4, "# mlstack-ds cli marker"),
                      new_file("deepspeed/mlstack_cli_marker.py", "CLI = True\n"))
    bad = maker.diff(replace_text("version.txt", "9.9.9", "9.9.10"),
                     base=(replace_text("version.txt", "0.19.5", "9.9.9"),))
    return {
        "good": write_series(root / "good", {"0001-cli-marker.patch": ("cli: marker", good)}),
        "bad": write_series(root / "bad", {"0001-cli-marker.patch": ("cli: marker", good),
                                           "0002-version-conflicts.patch": ("version: conflicting", bad)}),
    }


@pytest.mark.slow
def test_fetch_pypi_then_apply_is_reproducible(pip_mirror: Path, cli_series: dict[str, Path],
                                               tmp_path: Path) -> None:
    # pip is configured like an air-gapped site: no index, a local mirror (see the pip_mirror fixture).
    pip_env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(pip_mirror)}
    outcomes = []
    for run in ("first", "second"):  # separate caches: nothing is shared between the two runs
        dest, cache = tmp_path / run / "deepspeed", tmp_path / run / "cache"
        fetched = run_cli("fetch", "--source", "pypi", "--dest", str(dest), "--cache-dir", str(cache), "--json",
                          env=pip_env, timeout=900)
        assert fetched.returncode == 0, fetched.stderr
        shipped = run_cli("patches", "apply", "--tree", str(dest), "--json")  # the shipped series
        assert shipped.returncode == 0, shipped.stderr
        ours = run_cli("patches", "apply", "--tree", str(dest), "--series", str(cli_series["good"]), "--json")
        assert ours.returncode == 0, ours.stderr
        document = json.loads(ours.stdout)
        tree_hash = subprocess.run(["git", "rev-parse", "HEAD^{tree}"], cwd=dest, check=True,
                                   capture_output=True, text=True).stdout.strip()
        assert document["tree_hash"] == tree_hash
        outcomes.append((json.loads(fetched.stdout)["commit"], json.loads(shipped.stdout)["tree_hash"],
                         document["head"], document["tree_hash"]))
    assert outcomes[0] == outcomes[1]


def test_patches_commands_report_and_exit_codes(pristine_tree_template: Path, cli_series: dict[str, Path],
                                                tmp_path: Path) -> None:
    tree = tmp_path / "ds"
    subprocess.run(["cp", "-a", str(pristine_tree_template), str(tree)], check=True)

    listed = run_cli("patches", "list", "--series", str(cli_series["bad"]), "--json")
    assert listed.returncode == 0, listed.stderr
    patches = json.loads(listed.stdout)["patches"]
    assert [p["name"] for p in patches] == ["0001-cli-marker.patch", "0002-version-conflicts.patch"]
    assert sorted(patches[0]["files"]) == ["deepspeed/mlstack_cli_marker.py", "op_builder/builder.py"]

    checked = run_cli("patches", "check", "--tree", str(tree), "--series", str(cli_series["bad"]), "--json")
    assert checked.returncode == ExitCode.PATCH
    states = {p["name"]: p for p in json.loads(checked.stdout)["patches"]}
    assert states["0001-cli-marker.patch"]["state"] == "applies"
    assert states["0002-version-conflicts.patch"]["state"] == "conflicts"
    assert states["0002-version-conflicts.patch"]["conflicts"][0]["file"] == "version.txt"
    assert "1 of 2 patches conflict" in flat(checked.stderr)

    applied = run_cli("patches", "apply", "--tree", str(tree), "--series", str(cli_series["bad"]))
    assert applied.returncode == ExitCode.PATCH
    assert "0002-version-conflicts.patch" in flat(applied.stderr) and "version.txt hunk 1" in flat(applied.stderr)
    assert "Traceback" not in flat(applied.stderr)

    status = run_cli("patches", "status", "--tree", str(tree), "--series", str(cli_series["good"]))
    assert status.returncode == 0, status.stderr
    assert "applies" in flat(status.stdout) and "version: 0.19.5" in flat(status.stdout)

    missing = run_cli("patches", "check", "--tree", str(tmp_path / "nope"))
    assert missing.returncode == ExitCode.PATCH and "does not exist" in flat(missing.stderr)

    (cli_series["bad"].parent / "0003-stray.patch").write_text("not a patch\n")
    try:
        linted = run_cli("patches", "lint", str(cli_series["bad"].parent))
    finally:
        (cli_series["bad"].parent / "0003-stray.patch").unlink()
    assert linted.returncode == ExitCode.PATCH
    assert "0003-stray.patch: patch file is not listed in the series" in flat(linted.stdout)
    assert run_cli("patches", "lint").returncode == 0
    not_there = run_cli("patches", "lint", str(tmp_path / "nope"))
    assert not_there.returncode == ExitCode.USAGE and "nope: not a directory" in flat(not_there.stderr)


def test_recipes_commands() -> None:
    listed = run_cli("recipes", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (recipe,) = [r for r in json.loads(listed.stdout) if r["name"] == "deepspeed-0.19.5"]
    assert recipe["git"]["commit"] == "cf44300453eb0af79ed84ed8f1cb49d57478bd76"
    defaults = {r["name"]: r["default"] for r in json.loads(listed.stdout)}
    assert defaults == {"deepspeed-0.19.5": True, "deepspeed-0.19.8": False}
    plain = flat(run_cli("recipes", "list").stdout)
    assert "recipe: deepspeed-0.19.5; version: 0.19.5; default: yes" in plain
    assert "recipe: deepspeed-0.19.8; version: 0.19.8; default: no" in plain
    assert "commit: not pinned (unverified)" in plain
    shown = run_cli("recipes", "show", "deepspeed-0.19.5")
    assert "sdist.sha256: 8dc5d32604a3c7a713b3d14de482533bd328ffebe716cdafcc3511953fc90cdf" in flat(shown.stdout)
    unknown = run_cli("recipes", "show", "deepspeed-0.0.1")
    assert unknown.returncode == ExitCode.USAGE and "no recipe named" in flat(unknown.stderr)
