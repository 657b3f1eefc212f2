"""The plan is the build's contract: its source pin and patch list are what the build really uses.

Real sources (the pinned sdist, a plain extracted tree, a local git mirror), the real fetch and patch
stages and the product's `prepare` on this machine's interpreter (a CPU plan); the build is stopped by
the contract before `pip wheel` would start, so nothing is compiled.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from mlstack_ds.build.wheel import build_wheel
from mlstack_ds.errors import BuildError
from mlstack_ds.install.pipeline import InstallRequest, prepare
from mlstack_ds.plan.buildplan import PatchRef
from mlstack_ds.recipe import find_recipe
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.fetch import parse_source_spec, source_pin


@pytest.fixture
def plain_tree(deepspeed_sdist: Path, tmp_path: Path) -> Path:
    with tarfile.open(deepspeed_sdist) as archive:
        archive.extractall(tmp_path / "x", filter="data")
    return tmp_path / "x" / "deepspeed-0.19.5"


def plan_for(source: str, **request: str):  # type: ignore[no-untyped-def]
    return prepare(InstallRequest(source=source, python=Path(sys.executable), **request))  # type: ignore[arg-type]


def test_pin_is_what_the_build_uses(deepspeed_sdist: Path, plain_tree: Path, git_source_repo) -> None:
    recipe = find_recipe("deepspeed-0.19.5")
    assert source_pin(recipe, parse_source_spec("pypi")) == recipe.sdist.sha256
    other = "ab" * 32
    assert source_pin(recipe, parse_source_spec("https://example.invalid/ds.tar.gz", sha256=other)) == other
    assert source_pin(recipe, parse_source_spec(str(deepspeed_sdist))) == recipe.sdist.sha256
    commit = git_source_repo.commit
    assert source_pin(recipe, parse_source_spec("git", git_url=str(git_source_repo.path), git_commit=commit)) \
        == commit
    tree_pin = source_pin(recipe, parse_source_spec(str(plain_tree)))
    assert tree_pin.startswith("tree:") and len(tree_pin) == 5 + 64


def test_an_edited_local_tree_gets_a_new_key_and_same_content_the_same(plain_tree: Path, tmp_path: Path) -> None:
    before = plan_for(str(plain_tree)).plan
    copy = tmp_path / "elsewhere"
    shutil.copytree(plain_tree, copy, symlinks=True)
    assert plan_for(str(copy)).plan.cache_key == before.cache_key  # content, not the path
    (plain_tree / "deepspeed" / "__init__.py").write_text("# edited\n", encoding="utf-8")
    after = plan_for(str(plain_tree)).plan
    assert after.source_pin != before.source_pin and after.cache_key != before.cache_key


def test_git_commit_and_sha256_change_the_key(deepspeed_sdist: Path) -> None:
    pypi = plan_for("pypi").plan
    same_file = plan_for(str(deepspeed_sdist)).plan
    assert same_file.cache_key == pypi.cache_key  # the same sdist, whichever way it arrives
    mirror = plan_for("git", git_url="/nonexistent", git_commit="1" * 40).plan
    assert mirror.source_pin == "1" * 40
    assert mirror.cache_key != plan_for("git", git_url="/nonexistent", git_commit="2" * 40).plan.cache_key


def test_build_refuses_a_tree_edited_after_the_plan(plain_tree: Path, fetch_cache: Path, tmp_path: Path) -> None:
    prepared = plan_for(str(plain_tree))
    (plain_tree / "version.txt").write_text("0.19.5\n\n", encoding="utf-8")
    cache = Cache.open(tmp_path / "cache")
    with pytest.raises(BuildError, match="the source changed since the plan was made"):
        build_wheel(prepared.plan, prepared.recipe, prepared.spec, cache, {})
    assert not (cache.root / "wheels").exists()


def test_build_refuses_a_series_other_than_the_plans(deepspeed_sdist: Path, tmp_path: Path) -> None:
    prepared = plan_for(str(deepspeed_sdist))
    first, *rest = prepared.plan.patches
    plan = dataclasses.replace(prepared.plan, patches=(PatchRef(first.name, "0" * 64), *rest))
    with pytest.raises(BuildError, match=f"the patch series changed since the plan was made: {first.name}"):
        build_wheel(plan, prepared.recipe, prepared.spec, Cache.open(tmp_path / "cache"), {})
