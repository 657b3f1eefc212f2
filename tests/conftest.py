"""Shared test fixtures: the real DeepSpeed 0.19.5 sdist (downloaded once, cached), trees made from it,
and the target venvs.

The sdist comes from the package index through pip, like users get it; it is cached in
`$MLSTACK_TEST_CACHE` (default `<repo>/.cache/test`) so a CI run downloads it once.

Targets: `installed_target` is the product's own install (`mlstack-ds install` from the PyPI sdist,
patched), done once per session in the background and shared by the install, verify and multi-node tests;
its wheel cache (`e2e_cache`) makes later reinstalls take seconds. `no_ops_venv` is the one other kind of
target: DeepSpeed without prebuilt ops, which mlstack-ds never makes, built by hand in tests/support/target_env.py;
tests that only need *a* DeepSpeed (launch mechanics) use it, so they run while the cold install builds.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import isolated_home, run_timeline
from support.cold_install import (
    INSTALLED_NEXT_TARGET_FIXTURE,
    INSTALLED_TARGET_FIXTURE,
    AirGap,
    BackgroundInstall,
    InstallHandoff,
    PublishedInstall,
)
from support.e2e import Target
from support.pins import TORCH_PIN
from support.target_env import (
    DS_NEXT_SDIST_SHA256,
    DS_NEXT_VERSION,
    DS_SDIST_SHA256,
    DS_VERSION,
    NO_OPS_FLAGS,
    TargetVenv,
    bare_venv,
    build_target_venv,
    cache_lock,
    cached_deepspeed_sdist,
    test_cache_dir,
)
from support.trees import patched_tree

from mlstack_ds.recipe import find_recipe
from mlstack_ds.source import fetch_source, parse_source_spec

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "mlstack-ds tests",
    "GIT_AUTHOR_EMAIL": "tests@mlstack-ds.invalid",
    "GIT_COMMITTER_NAME": "mlstack-ds tests",
    "GIT_COMMITTER_EMAIL": "tests@mlstack-ds.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


def needs_fixture(item: pytest.Item, name: str) -> bool:
    return name in getattr(item, "fixturenames", ())


# Fixtures that build or install DeepSpeed for real (minutes on a cold cache): a test that needs one, even
# through another fixture, is marked `slow`, so `-m "not slow"` never starts a build. The cold installs
# (cold_install, cold_install_next) are autouse and start only for selected tests that need their targets.
SLOW_FIXTURES = frozenset({
    INSTALLED_TARGET_FIXTURE,  # `mlstack-ds install`, cold build of the prebuilt ops (support/cold_install.py)
    INSTALLED_NEXT_TARGET_FIXTURE,  # the same for the second pin
    "no_ops_venv",  # torch + DeepSpeed built by pip with DS_BUILD_OPS=0 (support/target_env.py)
})


def slow_fixtures(item: pytest.Item) -> set[str]:
    """The fixtures in `item`'s closure (what it needs, directly or not) that build or install DeepSpeed."""
    return SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))


# Under pytest-xdist (scripts/test.sh runs two workers), the tests that must run one at a time in one process
# form one group: the second pin's (its install runs in the process that needs it) and the tests that change
# the default pin's installed target (install into it, roll it back, break it). The tests that only read that
# target (marked `reads_target`) run on either worker, once the first process to need the target has installed
# it (support/cold_install.py: InstallHandoff), and a lock on the target (`target_access`) keeps them apart from
# the changes. The multi-node tests form two groups, by the harness they share (NODE_GROUPS: the two hosts
# over ssh, the Slurm cluster; each process makes its own, in namespaces of its own, so the two run side by
# side). Every other test is grouped with its file, or with the costly session fixture it shares
# (SHARED_FIXTURE_GROUPS), so such fixtures are made once.
SERIAL_GROUP = "installed-targets"
NODE_GROUPS = (("slurm", "nodes-over-slurm"), ("", "nodes-over-ssh"))  # (fixture, group); "": the rest
SHARED_FIXTURE_GROUPS = ("made_bundle",)  # tests/integration/conftest.py: a real bundle, a minute to make
MULTINODE_DIR = Path(__file__).parent / "multinode"
READS_TARGET = "reads_target"


def runs_with_xdist(config: pytest.Config) -> bool:
    return getattr(config.option, "dist", "no") != "no" or hasattr(config, "workerinput")


def reads_target_only(item: pytest.Item) -> bool:
    return item.get_closest_marker(READS_TARGET) is not None


def needs_serial_group(item: pytest.Item) -> bool:
    if needs_fixture(item, INSTALLED_NEXT_TARGET_FIXTURE):
        return True
    return needs_fixture(item, INSTALLED_TARGET_FIXTURE) and not reads_target_only(item)


def xdist_group(item: pytest.Item) -> str:
    if needs_serial_group(item):
        return SERIAL_GROUP
    if MULTINODE_DIR in Path(str(item.path)).parents:
        return next(group for fixture, group in NODE_GROUPS if not fixture or needs_fixture(item, fixture))
    shared = [name for name in SHARED_FIXTURE_GROUPS if needs_fixture(item, name)]
    return shared[0] if shared else item.nodeid.split("::", 1)[0]


def order_for_workers(items: list[pytest.Item]) -> list[pytest.Item]:
    """The order xdist hands groups out in (scripts/test.sh passes `--no-loadscope-reorder`): the serial group
    first, as it starts the installs and waits on both; then the other groups, largest first (xdist's own
    order); then the groups that need the installed target (the readers, the multi-node groups), which wait
    for the install once their tests that need none have run."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(xdist_group(item), []).append(item)

    def rank(name: str) -> tuple[int, int]:
        members = groups[name]
        waits = any(needs_fixture(item, INSTALLED_TARGET_FIXTURE) for item in members)
        return (0 if name == SERIAL_GROUP else 2 if waits else 1, -len(members))

    return [item for name in sorted(groups, key=rank) for item in groups[name]]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need a DeepSpeed build are marked `slow` (SLOW_FIXTURES). Tests on the cold-installed
    targets run last, so the installs (started at the first test) overlap everything else: the default
    pin's, then the second pin's, whose install overlaps the default pin's tests. Relative order is kept
    within each group. Under xdist each test also gets its group (xdist_group), in the order of
    `order_for_workers`; within the serial group the same order holds, so its installs overlap its
    multi-node tests."""
    for item in items:
        if slow_fixtures(item):
            item.add_marker(pytest.mark.slow)
    next_pin = [item for item in items if needs_fixture(item, INSTALLED_NEXT_TARGET_FIXTURE)]
    default_pin = [item for item in items
                   if needs_fixture(item, INSTALLED_TARGET_FIXTURE) and item not in next_pin]
    others = [item for item in items if item not in next_pin and item not in default_pin]
    items[:] = others + default_pin + next_pin
    if runs_with_xdist(config):
        items[:] = order_for_workers(items)
        for item in items:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


@pytest.fixture(autouse=True)
def start_cold_installs(request: pytest.FixtureRequest) -> None:
    """Start the session's cold installs at the first test of the process that runs their tests: the session's
    first test, or under xdist the serial group's first (or, when no test of that group runs, the first that
    reads the installed target; support/cold_install.py InstallHandoff lets one process install)."""
    if not runs_with_xdist(request.config) or needs_serial_group(request.node):
        request.getfixturevalue("cold_install_next")  # which starts cold_install first
    elif needs_fixture(request.node, INSTALLED_TARGET_FIXTURE):
        request.getfixturevalue("cold_install")


@pytest.fixture(autouse=True)
def target_access(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under xdist, the default pin's installed target is read by the tests marked `reads_target` on both
    workers while the serial group's tests change it: the readers hold a shared lock on it for the test,
    the others an exclusive one."""
    mode = target_lock_mode(request.node)
    if not runs_with_xdist(request.config) or mode is None:
        yield
        return
    lock = run_directory(request.config, request.getfixturevalue("tmp_path_factory")) / "installed-target.lock"
    with open(lock, "w", encoding="utf-8") as handle:
        fcntl.flock(handle, mode)
        yield


def target_lock_mode(item: pytest.Item) -> int | None:
    """How `item` holds the installed target under xdist: shared when it only reads it (marked `reads_target`,
    which the multi-node tests are too: they run it, or copy it to install into), exclusive when it may change
    it, None when it does not need it."""
    if not needs_fixture(item, INSTALLED_TARGET_FIXTURE):
        return None
    return fcntl.LOCK_SH if reads_target_only(item) else fcntl.LOCK_EX


def run_directory(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory common to this run's processes and to no other run: xdist's workers each get a base temp
    directory inside the controller's (`<it>/popen-gwN`); one process has its own."""
    basetemp = tmp_path_factory.getbasetemp()
    return basetemp.parent if hasattr(config, "workerinput") else basetemp


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(OWN_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


INTERRUPTED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)  # before the session's fixtures are torn down after Ctrl-C
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Ctrl-C: a cold install still running is stopped, not waited for (BackgroundInstall.finish)."""
    session.config.stash[INTERRUPTED] = exitstatus == pytest.ExitCode.INTERRUPTED


def others_may_wait(config: pytest.Config) -> bool:
    """Whether another process of this run may still wait for a cold install this one runs."""
    return runs_with_xdist(config) and not config.stash.get(INTERRUPTED, False)


FAILURES_LOG_ENV = "MLSTACK_TEST_FAILURES_LOG"


class FailuresLog:
    """With MLSTACK_TEST_FAILURES_LOG set, each failure's report is appended to that file as it happens: a
    suite under load runs for hours and may be stopped, and pytest prints the failures only at its end."""

    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(f"=== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n")


OWN_HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """The run's first process gives it a HOME of its own (support/isolated_home.py; xdist's workers inherit
    it). The failures log and the timeline (support/run_timeline.py) are written by the process that sees
    every report: pytest's own, or xdist's controller (its workers pass their reports to it)."""
    if isolated_home.MARKER not in os.environ:
        home = Path(tempfile.mkdtemp(prefix="mlstack-test-home-"))
        config.stash[OWN_HOME] = home
        isolated = isolated_home.isolated_environment(os.environ, home)
        os.environ.clear()
        os.environ.update(isolated)
    log = os.environ.get(FAILURES_LOG_ENV)
    if log and not hasattr(config, "workerinput"):
        config.pluginmanager.register(FailuresLog(log), "mlstack-failures-log")
    timeline = os.environ.get(run_timeline.TIMELINE_ENV)
    if timeline:
        config.pluginmanager.register(run_timeline.PhaseCpu(), "mlstack-phase-cpu")
        if not hasattr(config, "workerinput"):
            config.pluginmanager.register(run_timeline.TimelineLog(timeline), "mlstack-timeline")


REUSED_TARGET_ENV = "MLSTACK_TEST_TARGET_VENV"


@pytest.fixture(scope="session")
def e2e_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlstack-ds's cache for the session. MLSTACK_E2E_CACHE reuses one between local runs (a warm
    wheel cache turns the cold build into a reinstall); CI leaves it unset and builds for real."""
    reused = os.environ.get("MLSTACK_E2E_CACHE")
    return Path(reused) if reused else tmp_path_factory.mktemp("mlstack-cache")


@pytest.fixture(scope="session")
def cold_install(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, e2e_cache: Path):
    """The run's cold `mlstack-ds install`, started by start_cold_installs when any selected test needs it
    (tests/support/cold_install.py): run by this process, or, under xdist, by the one that asked first
    (then a PublishedInstall here); None when no selected test needs it."""
    if os.environ.get(REUSED_TARGET_ENV) or not any(
            INSTALLED_TARGET_FIXTURE in getattr(item, "fixturenames", ()) for item in request.session.items):
        yield None
        return
    handoff = InstallHandoff(run_directory(request.config, tmp_path_factory), "cold-install")
    if not handoff.claim():
        yield PublishedInstall(handoff)
        return
    install = BackgroundInstall(tmp_path_factory.mktemp("target") / "venv", e2e_cache, handoff=handoff).start()
    yield install
    install.finish(others_may_wait=others_may_wait(request.config))


@pytest.fixture(scope="session")
def cold_install_next(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                      cold_install: BackgroundInstall | PublishedInstall | None):
    """The second pin's cold `mlstack-ds install --deepspeed-version 0.19.8`, started when the first
    install ends (or now, when no selected test needs the first); None when no selected test needs it.
    It is the air-gapped install too: from a bundle, with `--offline`, in a network namespace with no route
    out (support/cold_install.py). Its own cache, so the default pin's tests that break or fill their cache
    never meet it (with MLSTACK_E2E_CACHE set, the directory beside it named `<it>-next`, reused like it)."""
    if not any(needs_fixture(item, INSTALLED_NEXT_TARGET_FIXTURE) for item in request.session.items):
        yield None
        return
    reused = os.environ.get("MLSTACK_E2E_CACHE")
    cache = Path(f"{reused}-next") if reused else tmp_path_factory.mktemp("mlstack-cache-next")
    air_gap = AirGap(tmp_path_factory.mktemp("next-bundle") / "bundle", f"deepspeed-{DS_NEXT_VERSION}",
                     cached_deepspeed_sdist(DS_NEXT_VERSION, DS_NEXT_SDIST_SHA256))
    install = BackgroundInstall(tmp_path_factory.mktemp("next-target") / "venv", cache,
                                install_args=("--deepspeed-version", DS_NEXT_VERSION), after=cold_install,
                                air_gap=air_gap).start()
    yield install
    install.stop()


@pytest.fixture(scope="session")
def deepspeed_sdist() -> Path:
    """Path to deepspeed-0.19.5.tar.gz from the package index, sha256-checked."""
    return cached_deepspeed_sdist(DS_VERSION, DS_SDIST_SHA256)


@pytest.fixture(scope="session")
def pip_mirror(deepspeed_sdist: Path) -> Path:
    """A find-links directory like an air-gapped site's mirror: the sdist plus its build requirements.

    Kept next to the cached sdist, so a run downloads it at most once (pip needs setuptools to read
    the sdist's metadata, even for `pip download`).
    """
    mirror = deepspeed_sdist.parent / "pip-mirror"
    with cache_lock("pip-mirror"):
        if not any(mirror.glob("setuptools-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                            "setuptools", "wheel", "-d", str(mirror)], check=True)
        shutil.copy2(deepspeed_sdist, mirror / deepspeed_sdist.name)
    return mirror


@pytest.fixture(scope="session")
def fetch_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fetch cache (`--cache-dir`) shared by the session: one sdist import serves every test."""
    return tmp_path_factory.mktemp("fetch-cache")


@pytest.fixture(scope="session")
def pristine_tree_template(
    deepspeed_sdist: Path, fetch_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The sdist extracted once per session into a git repo with one commit (do not modify; copy it).

    Made by the tool's own PATH source (`mlstack-ds fetch --source <sdist>`), so there is one implementation
    of "sdist -> pinned one-commit tree"; the commit id is reproducible (fixed identity and date).
    """
    dest = tmp_path_factory.mktemp("ds-pristine") / f"deepspeed-{DS_VERSION}"
    return fetch_source(find_recipe(), parse_source_spec(str(deepspeed_sdist)), fetch_cache, dest).path


@pytest.fixture(scope="session")
def next_pristine_tree(fetch_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The second pin's sdist (0.19.8) as a pristine one-commit tree, like `pristine_tree_template`."""
    sdist = cached_deepspeed_sdist(DS_NEXT_VERSION, DS_NEXT_SDIST_SHA256)
    dest = tmp_path_factory.mktemp("ds-next-pristine") / f"deepspeed-{DS_NEXT_VERSION}"
    return fetch_source(find_recipe(f"deepspeed-{DS_NEXT_VERSION}"), parse_source_spec(str(sdist)), fetch_cache,
                        dest).path


PRISTINE_TREE_FIXTURES = {DS_VERSION: "pristine_tree_template", DS_NEXT_VERSION: "next_pristine_tree"}


@pytest.fixture(scope="session")
def patched_trees(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`patched_trees(version)`: a new copy of that pin's pristine tree with its shipped series applied
    (support/trees.py: patched_tree). Each call makes its own copy; only that pin's pristine tree is made."""

    def make(version: str) -> Path:
        pristine = request.getfixturevalue(PRISTINE_TREE_FIXTURES[version])
        return patched_tree(pristine, version, tmp_path_factory.mktemp(f"ds-patched-{version}"))

    return make


@pytest.fixture(scope="session")
def installed_target(cold_install: BackgroundInstall | PublishedInstall | None, e2e_cache: Path) -> Target:
    """A venv with torch 2.13.0 CPU, transformers and accelerate, and DeepSpeed installed by
    `mlstack-ds install` (cold build), started when the session began (tests/conftest.py)."""
    reused = os.environ.get(REUSED_TARGET_ENV)
    if reused:  # local runs only: a venv an earlier `mlstack-ds install` made (CI leaves this unset)
        return Target(Path(reused), e2e_cache)
    assert cold_install is not None, "tests/conftest.py starts the cold install for every test that needs it"
    result = cold_install.wait()
    sys.stderr.write(f"\n[installed_target] cold install finished {cold_install.seconds:.0f} s after it started\n")
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["action"] == "installed"
    assert document["verify"]["ok"] is True, document["verify"]  # install runs the whole verify suite
    return cold_install.target


@pytest.fixture(scope="session")
def installed_next_target(cold_install_next: BackgroundInstall | None) -> tuple[Target, dict]:
    """The second pin (DeepSpeed 0.19.8, recipes/deepspeed-0.19.8.toml) installed by `mlstack-ds install
    --offline` into a venv like `installed_target`'s, and the install's `--json` document (plan, receipt,
    verify). `air_gapped_next_install` has the bundle and the network namespace's account."""
    assert cold_install_next is not None, "tests/conftest.py starts the second pin's install for its tests"
    result = cold_install_next.wait()
    sys.stderr.write(f"\n[installed_next_target] cold install finished {cold_install_next.seconds:.0f} s after "
                     "it started\n")
    assert result.returncode == 0, result.stderr[-3000:]
    return cold_install_next.target, json.loads(result.stdout)


@pytest.fixture(scope="session")
def air_gapped_next_install(installed_next_target: tuple[Target, dict],
                            cold_install_next: BackgroundInstall | None) -> BackgroundInstall:
    """The second pin's install as an air-gapped one: its bundle (`.air_gap`, `.bundle`), whether it ran with
    no network (`.isolated`) and its stderr (`.wait()`)."""
    assert cold_install_next is not None and cold_install_next.air_gap is not None
    return cold_install_next


@pytest.fixture(scope="session")
def install_verify_report(installed_target: Target, cold_install: BackgroundInstall | PublishedInstall | None) -> dict:
    """The verify report (`--json`) of the whole suite that the cold install ran on its target: the
    single-node suite run the verify tests examine, instead of running it a second time."""
    if cold_install is None:  # a reused target: run the suite now
        result = installed_target.cli("verify", "--python", installed_target.python, "--json")
        return json.loads(result.stdout)
    return json.loads(cold_install.wait().stdout)["verify"]


@pytest.fixture(scope="session")
def target_venv(installed_target: Target) -> TargetVenv:
    """The verify tests' view of the installed target: cpu_adam, fused_adam, shm_comm prebuilt."""
    return TargetVenv(installed_target.venv, 0.0)


@pytest.fixture(scope="session")
def no_ops_venv(deepspeed_sdist: Path) -> TargetVenv:
    """DeepSpeed installed with DS_BUILD_OPS=0: pure Python, every op would be JIT-compiled."""
    made = build_target_venv(deepspeed_sdist, NO_OPS_FLAGS, test_cache_dir())
    if made.build_seconds:
        sys.stderr.write(f"\n[no_ops_venv] built in {made.build_seconds:.0f} s: {made.root}\n")
    return made


@pytest.fixture(scope="session")
def torch_only_python() -> Path:
    """The test venv's interpreter: pinned torch (scripts/test.sh installs it), no DeepSpeed."""
    if importlib.util.find_spec("torch") is None:
        pytest.fail(f"the test venv has no torch; scripts/test.sh installs {TORCH_PIN} into it")
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.fail("the test venv has DeepSpeed installed; it must not (it is the 'deepspeed missing' case)")
    return Path(sys.executable)


@dataclass(frozen=True)
class GitMirror:
    """A local git repository standing in for github.com/deepspeedai/DeepSpeed (not reachable here)."""

    path: Path
    tag: str
    commit: str  # what the tag points at in this mirror (not upstream's cf44300...: different history)

    @property
    def url(self) -> str:
        return self.path.as_uri()


@pytest.fixture(scope="session")
def git_source_repo(pristine_tree_template: Path, tmp_path_factory: pytest.TempPathFactory) -> GitMirror:
    """A git repo made from the sdist, tagged v0.19.5 (annotated), with a later commit on top of the tag
    so that cloning "the tag" and cloning "the default branch" give different results."""
    path = tmp_path_factory.mktemp("ds-git-mirror") / "DeepSpeed"
    env = {**os.environ, **GIT_IDENTITY}
    subprocess.run(["git", "clone", "-q", str(pristine_tree_template), str(path)], env=env, check=True)
    tag = f"v{DS_VERSION}"
    subprocess.run(["git", "tag", "-a", tag, "-m", f"DeepSpeed {DS_VERSION}"], cwd=path, env=env, check=True)
    commit = subprocess.run(["git", "rev-parse", f"{tag}^{{commit}}"], cwd=path, env=env, check=True,
                            capture_output=True, text=True).stdout.strip()
    (path / "AFTER_THE_TAG.txt").write_text("work that happened after the release\n")
    subprocess.run(["git", "add", "AFTER_THE_TAG.txt"], cwd=path, env=env, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "after the tag"], cwd=path, env=env, check=True)
    return GitMirror(path=path, tag=tag, commit=commit)


@pytest.fixture
def fake_machine(tmp_path: Path):
    """A machine whose ROCm tools are fakes replaying real captures (see tests/support/fakemachine.py)."""
    from support.fakemachine import FakeMachine

    return FakeMachine(tmp_path / "machine")


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter with nothing installed (no torch): a fresh venv without pip."""
    return bare_venv(tmp_path_factory.mktemp("bare-venv")) / "bin" / "python"
