"""`install --offline`'s check, as the pure `coverage.missing`/`wrong_target` over real files in a temporary
bundle directory (hashed by `contents.file_digests`, as install does): complete is empty; each way a bundle falls
short is named, once, with its reason."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mlstack_ds.bundle.contents import file_digests
from mlstack_ds.bundle.coverage import Need, Target, bundle_command, missing, wrong_target
from mlstack_ds.bundle.manifest import BundleFile, BundleTarget, Manifest

LINUX = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
         "linux_x86_64")
HERE = Target("3.11", LINUX)
SDIST = b"the pinned sdist"
PATCH = b"Subject: a patch\n"

# (relative path, kind, project, version, content)
FILES = [
    ("sources/deepspeed-0.19.5.tar.gz", "sdist", "deepspeed", "0.19.5", SDIST),
    ("patches/deepspeed-0.19.5/series", "patch", "deepspeed-0.19.5", "", b"0001-a.patch\n"),
    ("patches/deepspeed-0.19.5/0001-a.patch", "patch", "deepspeed-0.19.5", "", PATCH),
    ("simple/hjson/hjson-3.1.0-py3-none-any.whl", "runtime", "hjson", "3.1.0", b"hjson"),
    ("simple/pydantic/pydantic-2.12.0-py3-none-any.whl", "runtime", "pydantic", "2.12.0", b"pydantic"),
    ("simple/pydantic-core/pydantic_core-2.41.5-cp311-cp311-manylinux_2_17_x86_64.whl", "runtime", "pydantic-core",
     "2.41.5", b"core"),
    ("simple/setuptools/setuptools-80.0.0-py3-none-any.whl", "build", "setuptools", "80.0.0", b"setuptools"),
]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make(directory: Path, files: list[tuple[str, str, str, str, bytes]] = FILES, **changes: object) -> Manifest:
    """A bundle in `directory`: the files on disk and a manifest listing them."""
    entries = []
    for rel, kind, project, version, content in files:
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        entries.append(BundleFile(rel, digest(content), len(content), kind, project, version, "test"))
    fields: dict[str, object] = dict(
        target=BundleTarget("3.11", "manylinux_2_28_x86_64"), recipe="deepspeed-0.19.5", deepspeed_version="0.19.5",
        sdist_sha256=digest(SDIST), series=(("0001-a.patch", digest(PATCH)),), torch="2.13.0",
        requested={"runtime": ("hjson", "pydantic>=2.0.0"), "build": ("setuptools>=70.1",)}, files=tuple(entries),
        tool_version="0.1.0", created_at="now", command="mlstack-ds bundle")
    fields.update(changes)
    return Manifest(**fields)  # type: ignore[arg-type]


NEED = Need("deepspeed-0.19.5", "0.19.5", digest(SDIST), (("0001-a.patch", digest(PATCH)),),
            {"runtime": ("hjson", "pydantic>=2.0.0", "pydantic-core"), "build": ("setuptools>=70.1",)})


def gaps(directory: Path, manifest: Manifest, need: Need = NEED, target: Target = HERE) -> dict[str, str]:
    return {m.name: m.reason for m in missing(manifest, file_digests(directory, manifest), need, target)}


def test_a_complete_bundle_lacks_nothing(tmp_path: Path) -> None:
    manifest = make(tmp_path)
    assert gaps(tmp_path, manifest) == {}
    assert wrong_target(manifest, HERE) is None


def test_a_removed_requirement_is_named_once(tmp_path: Path) -> None:
    manifest = make(tmp_path)
    (tmp_path / "simple/hjson/hjson-3.1.0-py3-none-any.whl").unlink()
    assert gaps(tmp_path, manifest) == {
        "hjson": "simple/hjson/hjson-3.1.0-py3-none-any.whl is listed in the manifest but missing in the bundle"}


def test_a_modified_file_is_named_as_modified(tmp_path: Path) -> None:
    manifest = make(tmp_path)
    (tmp_path / "patches/deepspeed-0.19.5/0001-a.patch").write_bytes(PATCH + b"+ an edit\n")
    found = gaps(tmp_path, manifest)
    assert list(found) == ["0001-a.patch"] and "modified" in found["0001-a.patch"]


def test_a_requirement_the_bundle_never_had(tmp_path: Path) -> None:
    files = [f for f in FILES if f[2] != "pydantic-core"]
    found = gaps(tmp_path, make(tmp_path, files))
    assert found == {"pydantic-core": "required (pydantic-core) and not in the bundle"}


def test_a_version_the_requirement_does_not_accept(tmp_path: Path) -> None:
    need = Need(NEED.recipe, NEED.deepspeed_version, NEED.sdist_sha256, NEED.series, {"runtime": ("hjson>=4",)})
    assert gaps(tmp_path, make(tmp_path), need) == {"hjson": "required (hjson>=4); the bundle has only 3.1.0"}


def test_a_wheel_for_another_python_does_not_count(tmp_path: Path) -> None:
    files = [f for f in FILES if f[2] != "pydantic-core"] + [
        ("simple/pydantic-core/pydantic_core-2.41.5-cp312-cp312-manylinux_2_17_x86_64.whl", "runtime",
         "pydantic-core", "2.41.5", b"core312")]
    found = gaps(tmp_path, make(tmp_path, files))
    assert list(found) == ["pydantic-core"] and "is not for this target" in found["pydantic-core"]


def test_a_bundle_of_another_pin_lacks_the_sdist_and_the_patch(tmp_path: Path) -> None:
    manifest = make(tmp_path)
    other = Need("deepspeed-0.19.8", "0.19.8", "d" * 64, (("0001-a.patch", "e" * 64),), {})
    found = gaps(tmp_path, manifest, other)
    assert set(found) == {"deepspeed 0.19.8 sdist", "0001-a.patch"}
    assert "made for deepspeed-0.19.5" in found["deepspeed 0.19.8 sdist"]
    assert found["0001-a.patch"].endswith("another version of it")


def test_every_gap_is_named_at_once(tmp_path: Path) -> None:
    manifest = make(tmp_path)
    for rel in ("simple/hjson/hjson-3.1.0-py3-none-any.whl", "sources/deepspeed-0.19.5.tar.gz",
                "simple/setuptools/setuptools-80.0.0-py3-none-any.whl"):
        (tmp_path / rel).unlink()
    found = gaps(tmp_path, manifest)
    assert set(found) == {"hjson", "deepspeed", "setuptools"}
    assert found["deepspeed"] == "sources/deepspeed-0.19.5.tar.gz is listed in the manifest but missing in the bundle"


def test_another_python_is_the_wrong_target_with_its_reason(tmp_path: Path) -> None:
    manifest = make(tmp_path, target=BundleTarget("3.12", "manylinux_2_28_x86_64"))
    reason = wrong_target(manifest, HERE)
    assert reason is not None and "Python 3.12 (cp312)" in reason and "Python 3.11 (cp311)" in reason


def test_a_platform_this_machine_does_not_take_is_the_wrong_target(tmp_path: Path) -> None:
    manifest = make(tmp_path, target=BundleTarget("3.11", "musllinux_1_2_x86_64"))
    reason = wrong_target(manifest, HERE)
    assert reason is not None and "does not accept musllinux_1_2_x86_64" in reason


@pytest.mark.parametrize("clients", [False, True])
def test_the_bundle_command_is_one_that_can_be_pasted(clients: bool) -> None:
    command = bundle_command(Path("/srv/my bundle"), BundleTarget("3.12", "manylinux_2_28_x86_64"),
                             "deepspeed-0.19.5", clients=clients, extra=("--torch", "2.7.1"))
    assert command.startswith("mlstack-ds bundle --to '/srv/my bundle' --python-version 3.12 --platform "
                              "manylinux_2_28_x86_64 --recipe deepspeed-0.19.5")
    assert command.endswith("--torch 2.7.1") and ("--with-clients" in command) == clients
