"""Recipes: the shipped pin loads with the right values; broken recipes fail naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.plan.buildspec import parse_platform
from mlstack_ds.recipe import DEFAULT_RECIPE, RecipeError, find_recipe, list_recipes, load_recipe, recipes_dir
from mlstack_ds.source import parse_source_spec
from mlstack_ds.source.fetch import source_pin

SHIPPED = recipes_dir() / "deepspeed-0.19.5.toml"


def test_shipped_pin_values() -> None:
    recipe = find_recipe("deepspeed-0.19.5")
    assert recipe.version == "0.19.5"
    assert recipe.requirement == "deepspeed==0.19.5"
    assert recipe.git.url == "https://github.com/deepspeedai/DeepSpeed.git"
    assert recipe.git.tag == "v0.19.5"
    assert recipe.git.commit == "cf44300453eb0af79ed84ed8f1cb49d57478bd76"
    assert recipe.sdist.filename == "deepspeed-0.19.5.tar.gz"
    assert recipe.sdist.sha256 == "8dc5d32604a3c7a713b3d14de482533bd328ffebe716cdafcc3511953fc90cdf"
    assert recipe.min_rocm == "5.7"
    assert recipe.series_path.is_file()
    assert recipe.series_path.parts[-2:] == ("deepspeed-0.19.5", "series")
    assert recipe.patch_mirrors == {"csrc": "deepspeed/ops/csrc", "op_builder": "deepspeed/ops/op_builder"}


def test_every_shipped_recipe_is_valid_and_has_its_series() -> None:
    recipes = list_recipes()
    assert [r.name for r in recipes] == sorted(p.stem for p in recipes_dir().glob("*.toml"))
    for recipe in recipes:
        assert recipe.series_path.is_file(), recipe.name


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "custom.toml"
    path.write_text(text)
    return path


def _shipped_text() -> str:
    """The pin part of the shipped recipe (the build tables of other stages are cut off)."""
    text = SHIPPED.read_text()
    return text[: text.index("\n[platforms")] + "\n" if "\n[platforms" in text else text


@pytest.mark.parametrize(
    ("old", "new", "key", "problem"),
    [
        ('tag = "v0.19.5"', 'tag = "v0.19.5"\ncomit = "x"', "source.git.comit", "not known"),
        ('min_rocm = "5.7"\n', "", "min_rocm", "missing"),
        ("sha256 = \"8dc5", "sha256 = \"XYZ5", "source.sdist.sha256", "64 lowercase hex"),
        ('commit = "cf44300453eb0af79ed84ed8f1cb49d57478bd76"', 'commit = "cf44300"', "source.git.commit",
         "40-character"),
        ('version = "0.19.5"', 'version = "nope"', "version", "not a version"),
        ('version = "0.19.5"', "version = 0.195", "version", "must be a str"),
        ("schema = 1", "schema = 2", "schema", "schema 1"),
        ('series = "patches/deepspeed-0.19.5/series"', 'series = "../../etc/series"', "patches.series",
         "relative"),
        ("[patches]", "[platforms.tpu]\nx = 1\n\n[patches]", "platforms.tpu", "not known"),
        ('mirrors = { "csrc"', 'mirrors = { "../csrc"', "patches.mirrors.../csrc", "inside the tree"),
        ('"csrc" = "deepspeed/ops/csrc"', '"csrc" = 1', "patches.mirrors.csrc", "must be a str"),
    ],
)
def test_bad_recipe_names_file_and_key(tmp_path: Path, old: str, new: str, key: str, problem: str) -> None:
    text = _shipped_text()
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(path) in info.value.message
    assert repr(key) in info.value.message
    assert problem in info.value.message
    assert info.value.exit_code == ExitCode.USAGE


def test_platform_tables_are_accepted_as_opaque_data(tmp_path: Path) -> None:
    text = _shipped_text() + '\n[platforms.rocm]\nDS_BUILD_CPU_ADAM = { value = "1", reason = "x" }\n'
    recipe = load_recipe(_write(tmp_path, text))
    assert recipe.platforms["rocm"]["DS_BUILD_CPU_ADAM"] == {"value": "1", "reason": "x"}
    with pytest.raises(TypeError):
        recipe.platforms["rocm"]["new"] = 1  # type: ignore[index]


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(_write(tmp_path, "schema = = 1"))
    with pytest.raises(RecipeError, match="cannot read recipe"):
        load_recipe(tmp_path / "absent.toml")
    with pytest.raises(RecipeError, match=r"no recipe named 'deepspeed-9\.9\.9'") as info:
        find_recipe("deepspeed-9.9.9")
    assert "deepspeed-0.19.5" in info.value.hint



def test_second_pin_values_and_it_is_not_the_default() -> None:
    recipe = find_recipe("0.19.8")  # by version, as --deepspeed-version takes it
    assert recipe.name == "deepspeed-0.19.8" and DEFAULT_RECIPE == "deepspeed-0.19.5"
    assert recipe.sdist.sha256 == "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"
    assert recipe.git.tag == "v0.19.8" and recipe.git.commit is None  # not verifiable when pinned
    assert recipe.series_path.parts[-2:] == ("deepspeed-0.19.8", "series")
    cpu = {op.name: op.build for op in parse_platform("cpu", recipe.platforms["cpu"], str(recipe.path)).ops}
    assert cpu["cpu_adagrad"] and cpu["cpu_lion"]  # 0.19.8's CPU accelerator has builders for them
    assert all("sparse_attn" not in table["ops"] for table in recipe.platforms.values())  # gone in 0.19.7


def test_a_recipe_without_a_commit_fetches_from_git_only_with_git_commit(tmp_path: Path) -> None:
    text = _shipped_text().replace('commit = "cf44300453eb0af79ed84ed8f1cb49d57478bd76"\n', "")
    recipe = load_recipe(_write(tmp_path, text))
    assert recipe.git.commit is None
    with pytest.raises(UsageError) as refused:
        source_pin(recipe, parse_source_spec("git"))
    assert "pins no git commit" in refused.value.message and "--source pypi" in refused.value.hint
    assert source_pin(recipe, parse_source_spec("git", git_commit="a" * 40)) == "a" * 40
    assert source_pin(recipe, parse_source_spec("pypi")) == recipe.sdist.sha256
