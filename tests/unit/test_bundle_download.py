"""What `bundle` hands pip and reads itself: the platform tags a manylinux target takes, the stand-in torch
(a wheel pip really accepts, with no byte of torch), DeepSpeed's requirements read from an sdist, and the pip
options and environment that hold `install --offline` to the bundle."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from mlstack_ds.bundle.contents import sdist_requirements
from mlstack_ds.bundle.download import download_argv, make_torch_stub, platforms_for, project_of
from mlstack_ds.bundle.manifest import BundleTarget
from mlstack_ds.bundle.offline import OfflineBundle, pip_env
from mlstack_ds.errors import FetchError, UsageError


def test_a_manylinux_target_takes_every_older_manylinux_and_the_legacy_names() -> None:
    tags = platforms_for("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "manylinux1_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64"} <= set(tags)
    assert platforms_for("manylinux2014_aarch64") == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert platforms_for("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


def test_pip_is_asked_for_binaries_of_the_target_with_torch_held(tmp_path: Path) -> None:
    stub = make_torch_stub(tmp_path / "stub", "2.7.1+rocm6.3")
    argv = download_argv("python", ["hjson"], tmp_path / "d", BundleTarget("3.12", "manylinux_2_28_x86_64"), stub)
    assert "--only-binary=:all:" in argv and argv[-1] == "hjson"
    for option, value in (("--python-version", "3.12"), ("--implementation", "cp"), ("--abi", "cp312"),
                          ("--constraint", str(stub.constraint))):
        assert argv[argv.index(option) + 1] == value
    assert stub.constraint.read_text() == "torch==2.7.1+mlstack.bundle.stub\n"


def test_pip_takes_the_stand_in_torch_and_it_holds_no_torch(tmp_path: Path) -> None:
    stub = make_torch_stub(tmp_path / "stub", "2.13.0")
    (wheel,) = stub.find_links.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert all(".dist-info/" in name for name in archive.namelist())
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-index", "--find-links", str(stub.find_links),
                           "--constraint", str(stub.constraint), "--dest", str(tmp_path / "d"), "torch>=2.0"],
                          capture_output=True, text=True, timeout=120,
                          env={"PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "d").iterdir()] == [wheel.name]


def test_a_junk_torch_version_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--torch"):
        make_torch_stub(tmp_path, "latest")


def test_names_and_versions_from_file_names() -> None:
    assert project_of("pydantic_core-2.41.5-cp312-cp312-manylinux_2_17_x86_64.whl") == ("pydantic_core", "2.41.5")
    assert project_of("deepspeed-0.19.5.tar.gz") == ("deepspeed", "0.19.5")


def sdist(path: Path, requirements: str | None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        members = [("deepspeed-0.19.5/setup.py", "# setup\n")]
        if requirements is not None:
            members.append(("deepspeed-0.19.5/requirements/requirements.txt", requirements))
        for name, text in members:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_deepspeed_requirements_come_from_its_sdist_without_torch(tmp_path: Path) -> None:
    archive = sdist(tmp_path / "deepspeed-0.19.5.tar.gz", "# runtime\nhjson\ntorch\npydantic>=2.0.0  # v2\n\nninja\n")
    assert sdist_requirements(archive) == ("hjson", "pydantic>=2.0.0", "ninja")


def test_an_sdist_without_requirements_or_not_an_archive_is_a_fetch_error(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="no requirements"):
        sdist_requirements(sdist(tmp_path / "a.tar.gz", None))
    junk = tmp_path / "b.tar.gz"
    junk.write_bytes(b"not a tar")
    with pytest.raises(FetchError, match="cannot read"):
        sdist_requirements(junk)


def test_offline_pip_sees_no_configuration_and_no_index() -> None:
    env = pip_env({"PATH": "/bin", "PIP_INDEX_URL": "https://mirror", "PIP_FIND_LINKS": "/opt/wheels",
                   "PIP_EXTRA_INDEX_URL": "x"})
    assert env == {"PATH": "/bin", "PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1",
                   "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def test_offline_pip_gets_one_find_links_per_project(tmp_path: Path) -> None:
    for project in ("hjson", "pydantic-core"):
        (tmp_path / "simple" / project).mkdir(parents=True)
    (tmp_path / "simple" / "index.html").write_text("<html></html>")
    bundle = OfflineBundle(tmp_path, None, tmp_path / "sources" / "x.tar.gz")  # type: ignore[arg-type]
    assert bundle.pip_args() == ("--no-index", "--find-links", str(tmp_path / "simple" / "hjson"),
                                 "--find-links", str(tmp_path / "simple" / "pydantic-core"))
