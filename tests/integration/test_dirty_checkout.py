"""A local git checkout with uncommitted changes (issue 28): its pin and cache key cover them, the plan says
it is dirty, and the build takes exactly the working tree that was pinned.

Real git, the real DeepSpeed sdist as the checkout's content (a site recipe pins the checkout's commit:
upstream's cf44300... is not reachable here), the real fetch and patch stages and the product's `prepare`
on this machine's interpreter (a CPU plan); builds are stopped by the plan's contract before anything
compiles.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_cli

from mlstack_ds.build.wheel import build_wheel
from mlstack_ds.errors import BuildError, FetchError
from mlstack_ds.install.pipeline import InstallRequest, prepare
from mlstack_ds.patches import apply_series, series_for_recipe
from mlstack_ds.plan.buildplan import PatchRef
from mlstack_ds.recipe import Recipe, find_recipe
from mlstack_ds.source import fetch_source, parse_source_spec
from mlstack_ds.source.cache import Cache
from mlstack_ds.source.fetch import source_pin
from mlstack_ds.source.gitrepo import PRISTINE_REF

PINNED_UPSTREAM_COMMIT = "cf44300453eb0af79ed84ed8f1cb49d57478bd76"
ENGINE = Path("deepspeed/runtime/engine.py")
# What upstream's .gitignore says of in-place builds (DeepSpeed's own has these and more).
GITIGNORE = "build/\n*.so\n__pycache__/\n*.egg-info/\n"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t.invalid", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


@dataclasses.dataclass(frozen=True)
class Checkout:
    path: Path
    commit: str
    recipe: Recipe  # a site recipe pinning `commit` (given by path, like `--recipe FILE`)
    recipe_file: Path

    def pin(self) -> str:
        return source_pin(self.recipe, parse_source_spec(str(self.path)))


@pytest.fixture
def checkout(pristine_tree_template: Path, tmp_path: Path) -> Checkout:
    """A DeepSpeed 0.19.5 clone at the pinned commit, with a .gitignore like upstream's, clean."""
    path = tmp_path / "DeepSpeed"
    git(tmp_path, "clone", "-q", str(pristine_tree_template), str(path))
    (path / ".gitignore").write_text(GITIGNORE)
    git(path, "add", ".gitignore")
    git(path, "commit", "-q", "-m", "upstream's .gitignore")
    commit = git(path, "rev-parse", "HEAD")
    shipped = find_recipe()
    recipe_file = tmp_path / "site" / "recipes" / "site.toml"
    recipe_file.parent.mkdir(parents=True)
    recipe_file.write_text(shipped.path.read_text().replace(PINNED_UPSTREAM_COMMIT, commit))
    (tmp_path / "site" / "patches").symlink_to(shipped.path.resolve().parent.parent / "patches")
    return Checkout(path, commit, find_recipe(recipe_file), recipe_file)


def dry_run(checkout: Checkout, *source: str) -> dict:
    result = run_cli("install", "--dry-run", "--json", "--recipe", checkout.recipe_file,
                     "--source", *(source or [checkout.path]), "--python", sys.executable)
    assert result.returncode == 0, result.stderr
    return result.json["plan"]


def test_a_dirty_checkout_gets_a_new_key_and_the_plan_says_dirty(checkout: Checkout) -> None:
    clean = dry_run(checkout)
    assert clean["source_pin"] == checkout.commit  # a clean checkout: the commit, as before
    assert not [n for n in clean["notes"] if "dirty" in n]
    engine = checkout.path / ENGINE
    engine.write_text(engine.read_text() + "# a local experiment\n")
    dirty = dry_run(checkout)
    assert dirty["source_pin"].startswith(f"{checkout.commit}+dirty.")
    assert dirty["cache_key"] != clean["cache_key"]
    assert [n for n in dirty["notes"] if f"{checkout.path} is dirty" in n and str(ENGINE) in n]
    human = run_cli("install", "--dry-run", "--recipe", checkout.recipe_file, "--source", checkout.path,
                    "--python", sys.executable, columns=200)
    assert human.returncode == 0, human.stderr
    assert f"pin {checkout.commit[:12]}+dirty.{dirty['source_pin'].split('+dirty.')[1]}" in human.stdout
    assert f"{checkout.path} is dirty" in human.stderr
    git(checkout.path, "checkout", "-q", "--", str(ENGINE))
    assert dry_run(checkout)["cache_key"] == clean["cache_key"]  # back to clean: the clean build again


def test_each_kind_of_change_is_covered_and_the_same_content_gives_the_same_pin(checkout: Checkout) -> None:
    clean = checkout.pin()
    engine = checkout.path / ENGINE
    original = engine.read_text()
    setup = checkout.path / "setup.py"
    changes = {
        "unstaged edit": lambda: engine.write_text(original + "# edit\n"),
        "staged edit": lambda: (engine.write_text(original + "# staged\n"), git(checkout.path, "add", str(ENGINE))),
        "deleted file": (checkout.path / "build.txt").unlink,
        "mode change": lambda: setup.chmod(setup.stat().st_mode ^ 0o111),
        "untracked file": lambda: (checkout.path / "deepspeed" / "local_op.py").write_text("X = 1\n"),
    }
    pins = {}
    for what, change in changes.items():
        change()
        pins[what] = checkout.pin()
        assert pins[what].startswith(f"{checkout.commit}+dirty."), what
        assert checkout.pin() == pins[what], f"{what}: the same content must give the same pin"
        git(checkout.path, "reset", "-q", "--hard")
        git(checkout.path, "clean", "-q", "-fd")
        assert checkout.pin() == clean, what
    assert len(set(pins.values())) == len(pins), pins
    # The same dirty content in another clone, elsewhere: the same pin (content, not the path).
    engine.write_text(original + "# edit\n")
    other = checkout.path.parent / "elsewhere"
    git(checkout.path.parent, "clone", "-q", str(checkout.path), str(other))
    (other / ENGINE).write_text(original + "# edit\n")
    assert source_pin(checkout.recipe, parse_source_spec(str(other))) == checkout.pin() == pins["unstaged edit"]


def test_ignored_files_do_not_make_a_checkout_dirty(checkout: Checkout) -> None:
    clean = checkout.pin()
    (checkout.path / "build" / "lib").mkdir(parents=True)
    (checkout.path / "build" / "lib" / "cpu_adam.o").write_bytes(b"\0object")
    (checkout.path / "deepspeed" / "ops" / "cpu_adam_op.so").write_bytes(b"\0ELF")
    (checkout.path / "deepspeed" / "__pycache__").mkdir(exist_ok=True)
    (checkout.path / "deepspeed" / "__pycache__" / "x.pyc").write_bytes(b"\0pyc")
    assert checkout.pin() == clean
    (checkout.path / "deepspeed" / "ops" / "new_op.py").write_text("# not ignored\n")
    assert checkout.pin() != clean


def test_the_build_takes_exactly_the_pinned_working_tree(checkout: Checkout, tmp_path: Path) -> None:
    engine = checkout.path / ENGINE
    engine.write_text(engine.read_text() + "# a local experiment\n")
    (checkout.path / "build.txt").unlink()
    (checkout.path / "deepspeed" / "local_op.py").write_text("X = 1\n")
    (checkout.path / "deepspeed" / "ops" / "cpu_adam_op.so").write_bytes(b"\0ELF")  # ignored: left out
    before = git(checkout.path, "status", "--porcelain")
    tree = fetch_source(checkout.recipe, parse_source_spec(str(checkout.path)), tmp_path / "cache", tmp_path / "ds")
    assert tree.pin == checkout.pin()
    assert (tree.path / ENGINE).read_text() == engine.read_text()
    assert (tree.path / "deepspeed" / "local_op.py").exists()
    assert not (tree.path / "build.txt").exists()
    assert not (tree.path / "deepspeed" / "ops" / "cpu_adam_op.so").exists()
    assert git(tree.path, "rev-parse", "HEAD^") == checkout.commit  # on top of the pinned commit
    assert git(tree.path, "rev-parse", PRISTINE_REF) == tree.commit == git(tree.path, "rev-parse", "HEAD")
    assert git(tree.path, "status", "--porcelain", "--ignored") == ""
    assert git(checkout.path, "status", "--porcelain") == before  # the user's checkout is untouched
    again = fetch_source(checkout.recipe, parse_source_spec(str(checkout.path)), tmp_path / "cache",
                         tmp_path / "ds2")
    assert again.commit == tree.commit  # equal content, equal commit
    fetched = run_cli("fetch", "--json", "--recipe", checkout.recipe_file, "--source", checkout.path,
                      "--dest", tmp_path / "ds3", "--cache-dir", tmp_path / "cache")
    assert fetched.returncode == 0 and fetched.json["pin"] == tree.pin and fetched.json["commit"] == tree.commit


def test_the_build_patches_the_dirty_tree_it_was_planned_for(checkout: Checkout, tmp_path: Path) -> None:
    engine = checkout.path / ENGINE
    engine.write_text(engine.read_text() + "# a local experiment\n")
    prepared = prepare(InstallRequest(deepspeed_version=str(checkout.recipe_file), source=str(checkout.path),
                                      python=Path(sys.executable)))
    # A wrong digest for the first patch stops the build right after the series applied: so the source check
    # passed (the copy is the plan's tree) and the series applies on the dirty tree. Nothing compiles.
    first, *rest = prepared.plan.patches
    plan = dataclasses.replace(prepared.plan, patches=(PatchRef(first.name, "0" * 64), *rest))
    with pytest.raises(BuildError, match="the patch series changed since the plan was made"):
        build_wheel(plan, prepared.recipe, prepared.spec, Cache.open(tmp_path / "cache"), {})


def test_a_patched_checkout_with_edits_builds_them_with_the_series_already_applied(checkout: Checkout,
                                                                                   tmp_path: Path) -> None:
    """`fetch`, `patches apply`, hack, `install --source`: the working tree (series + edits) on the pinned
    commit; the patch stage finds the series applied and leaves it."""
    apply_series(checkout.path, series_for_recipe(checkout.recipe))
    engine = checkout.path / ENGINE
    engine.write_text(engine.read_text() + "# hacking on the patched tree\n")
    prepared = prepare(InstallRequest(deepspeed_version=str(checkout.recipe_file), source=str(checkout.path),
                                      python=Path(sys.executable)))
    assert prepared.plan.source_pin.startswith(f"{checkout.commit}+dirty.")
    first, *rest = prepared.plan.patches
    plan = dataclasses.replace(prepared.plan, patches=(PatchRef(first.name, "0" * 64), *rest))
    with pytest.raises(BuildError, match="the patch series changed since the plan was made"):
        build_wheel(plan, prepared.recipe, prepared.spec, Cache.open(tmp_path / "cache"), {})


def test_a_checkout_edited_after_the_plan_is_refused(checkout: Checkout, tmp_path: Path) -> None:
    engine = checkout.path / ENGINE
    engine.write_text(engine.read_text() + "# first\n")
    prepared = prepare(InstallRequest(deepspeed_version=str(checkout.recipe_file), source=str(checkout.path),
                                      python=Path(sys.executable)))
    engine.write_text(engine.read_text() + "# second\n")
    cache = Cache.open(tmp_path / "cache")
    with pytest.raises(BuildError, match=r"the source changed since the plan was made \(plan "
                       rf"{checkout.commit[:17]}\+dirty\.[0-9a-f]{{16}}, now {checkout.commit[:17]}\+dirty\."):
        build_wheel(prepared.plan, prepared.recipe, prepared.spec, cache, {})
    assert not (cache.root / "wheels").exists()


def test_a_dirty_checkout_on_later_commits_builds_its_working_tree(checkout: Checkout, tmp_path: Path) -> None:
    (checkout.path / "LATER.txt").write_text("a commit after the pin\n")
    git(checkout.path, "add", "LATER.txt")
    git(checkout.path, "commit", "-q", "-m", "later")
    # Clean: the pinned commit, as before, and the plan says the checkout's own commits are left out.
    assert checkout.pin() == checkout.commit
    # Dirty: its working tree (with the later commit's file), on top of the pinned commit.
    (checkout.path / ENGINE).write_text("# rewritten\n")
    tree = fetch_source(checkout.recipe, parse_source_spec(str(checkout.path)), tmp_path / "cache", tmp_path / "ds")
    assert tree.pin == checkout.pin() and tree.pin.startswith(f"{checkout.commit}+dirty.")
    assert (tree.path / "LATER.txt").exists() and (tree.path / ENGINE).read_text() == "# rewritten\n"
    assert git(tree.path, "rev-parse", "HEAD^") == checkout.commit


def test_a_checkout_without_the_pinned_commit_is_built_as_a_plain_directory(checkout: Checkout) -> None:
    """Another history (a fork, a copy): its files are what the user means to build, pinned by content and
    still checked to be the pinned version, as a directory without .git is."""
    result = run_cli("install", "--dry-run", "--json", "--source", checkout.path, "--python", sys.executable)
    assert result.returncode == 0, result.stderr
    plan = result.json["plan"]
    assert plan["source_pin"].startswith("tree:")
    assert [n for n in plan["notes"] if "without the pinned commit" in n and "plain directory" in n]
    assert source_pin(find_recipe(), parse_source_spec(str(checkout.path))) == plan["source_pin"]
    (checkout.path / "version.txt").write_text("0.18.0\n")
    with pytest.raises(FetchError, match=r"is deepspeed 0\.18\.0, but the pin is 0\.19\.5"):
        source_pin(find_recipe(), parse_source_spec(str(checkout.path)))


def test_a_tree_from_fetch_edited_gets_a_new_key(pip_mirror: Path, tmp_path: Path) -> None:
    """The issue's steps: `fetch --dest DIR` (the sdist, imported as one commit), an edit, `install --dry-run
    --source DIR`. The tree's own commit is not the pinned one; its content is what is pinned."""
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(pip_mirror)}
    tree, cache = tmp_path / "ds", tmp_path / "cache"
    fetched = run_cli("fetch", "--dest", tree, "--cache-dir", cache, env=env)
    assert fetched.returncode == 0, fetched.stderr

    def plan() -> dict:
        result = run_cli("install", "--dry-run", "--json", "--source", tree, "--cache-dir", cache,
                         "--python", sys.executable, env=env)
        assert result.returncode == 0, result.stderr
        return result.json["plan"]

    before = plan()
    engine = tree / ENGINE
    engine.write_text(engine.read_text() + "# a local experiment\n")
    after = plan()
    assert before["source_pin"].startswith("tree:") and after["source_pin"].startswith("tree:")
    assert after["source_pin"] != before["source_pin"] and after["cache_key"] != before["cache_key"]


def test_source_git_from_a_dirty_local_repository_builds_the_tag_and_says_so(checkout: Checkout,
                                                                              tmp_path: Path) -> None:
    git(checkout.path, "tag", "-a", checkout.recipe.git.tag, "-m", "the release")
    clean = dry_run(checkout, "git", "--git-url", str(checkout.path))
    engine = checkout.path / ENGINE
    engine.write_text(engine.read_text() + "# not in the tag\n")
    dirty = dry_run(checkout, "git", "--git-url", str(checkout.path))
    assert dirty["source_pin"] == clean["source_pin"] == checkout.commit
    assert dirty["cache_key"] == clean["cache_key"]  # what is built is the tag's commit, in both cases
    assert [n for n in dirty["notes"] if "uncommitted changes, which --source git does not build" in n]
    assert not [n for n in clean["notes"] if "--source git does not build" in n]
    tree = fetch_source(checkout.recipe, parse_source_spec("git", git_url=str(checkout.path)), tmp_path / "cache",
                        tmp_path / "ds")
    assert tree.commit == checkout.commit and "# not in the tag" not in (tree.path / ENGINE).read_text()
