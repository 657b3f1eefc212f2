"""The bundle manifest (`bundle.json`): written atomically, read back equal, and anything else refused with one
`ManifestError` (exit 2) naming the file. Real files in temporary directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlstack_ds.bundle.manifest import (
    MANIFEST_NAME,
    BundleFile,
    BundleTarget,
    Manifest,
    ManifestError,
    check_target,
    read_manifest,
    write_manifest,
)
from mlstack_ds.errors import ExitCode, UsageError

SHA = "a" * 64


def manifest(**changes: object) -> Manifest:
    fields: dict[str, object] = dict(
        target=BundleTarget("3.11", "manylinux_2_28_x86_64"), recipe="deepspeed-0.19.5", deepspeed_version="0.19.5",
        sdist_sha256=SHA, series=(("0001-x.patch", "b" * 64),), torch="2.13.0",
        requested={"runtime": ("hjson",), "build": ("wheel",), "clients": (), "tool": ("mlstack-ds==0.1.0",)},
        files=(BundleFile("simple/hjson/hjson-3.1.0-py3-none-any.whl", "c" * 64, 54000, "runtime", "hjson", "3.1.0",
                          "requested: DeepSpeed 0.19.5's runtime requirements"),),
        tool_version="0.1.0", created_at="2026-11-28T06:40:04+0000", command="mlstack-ds bundle --to DIR",
        notes=("torch 2.13.0 is not in the bundle",))
    fields.update(changes)
    return Manifest(**fields)  # type: ignore[arg-type]


def test_written_then_read_back_equal(tmp_path: Path) -> None:
    written = manifest()
    write_manifest(tmp_path, written)
    assert read_manifest(tmp_path) == written
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]  # no temporary file left beside it
    document = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert document["target"]["python_tag"] == "cp311"
    assert document["torch"] == "2.13.0"
    assert document["files"][0]["why"].startswith("requested")


def test_a_rewrite_replaces_the_whole_file(tmp_path: Path) -> None:
    write_manifest(tmp_path, manifest())
    write_manifest(tmp_path, manifest(torch="2.7.1"))
    assert read_manifest(tmp_path).torch == "2.7.1"


@pytest.mark.parametrize(("content", "says"), [
    ("not json", "unreadable"),
    ("[]", "not a JSON object"),
    ('{"schema": 99}', "schema 99"),
    ('{"schema": 1}', "KeyError"),
])
def test_junk_is_one_manifest_error(tmp_path: Path, content: str, says: str) -> None:
    (tmp_path / MANIFEST_NAME).write_text(content)
    with pytest.raises(ManifestError) as caught:
        read_manifest(tmp_path)
    assert says in caught.value.message and str(tmp_path) in caught.value.message
    assert caught.value.exit_code == ExitCode.USAGE
    assert "mlstack-ds bundle --to" in caught.value.hint


@pytest.mark.parametrize(("path", "sha256", "kind"), [
    ("../outside.whl", "c" * 64, "runtime"),
    ("/etc/passwd", "c" * 64, "runtime"),
    ("simple/x/x-1-py3-none-any.whl", "not-a-digest", "runtime"),
    ("simple/x/x-1-py3-none-any.whl", "c" * 64, "junk-kind"),
])
def test_a_file_entry_that_is_malformed_or_leaves_the_bundle_is_refused(tmp_path: Path, path: str, sha256: str,
                                                                        kind: str) -> None:
    write_manifest(tmp_path, manifest(files=(BundleFile(path, sha256, 1, kind, "x", "1", "why"),)))
    with pytest.raises(ManifestError, match=r"malformed|outside"):
        read_manifest(tmp_path)


def test_a_directory_without_a_manifest_is_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="is not a bundle"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match="is not a directory"):
        read_manifest(tmp_path / "absent")


@pytest.mark.parametrize(("version", "platform"), [
    ("3", "manylinux_2_28_x86_64"), ("2.7", "manylinux_2_28_x86_64"), ("3.12.1", "manylinux_2_28_x86_64"),
    ("3.12", "any"), ("3.12", "Manylinux 2.28"), ("3.12", ""),
])
def test_a_junk_target_is_a_usage_error(version: str, platform: str) -> None:
    with pytest.raises(UsageError):
        check_target(version, platform)


def test_the_python_tag_follows_the_version() -> None:
    assert check_target("3.12", "manylinux_2_28_x86_64").python_tag == "cp312"
    assert BundleTarget("3.10", "linux_x86_64").describe() == "Python 3.10 (cp310) on linux_x86_64"
