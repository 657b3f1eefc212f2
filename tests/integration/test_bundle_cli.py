"""`mlstack-ds bundle` for real on this machine (pip resolves and downloads from the package index), and
`install --offline` refusing bundles that do not cover it, before anything changes.

No test here builds DeepSpeed: a refusal comes before the plan, and an accepted bundle is shown by
`install --offline --dry-run` (the plan, from the bundle's sdist). The full offline install in a network
namespace is a later part of issue 41.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name
from support.bundles import TORCH, make_bundle, no_network, without_wheel
from support.cli import CliResult, run_cli
from support.target_env import overlay_venv

from mlstack_ds.patches.series import read_series_names
from mlstack_ds.recipe import find_recipe

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
OTHER = "3.12" if HERE != "3.12" else "3.11"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bundle(to: Path, sdist: Path, *args: str) -> CliResult:
    return make_bundle(to, sdist, *args)


@pytest.fixture(scope="module")
def made(made_bundle: tuple[Path, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The session's real bundle (integration/conftest.py) for this machine's Python and platform (do not modify;
    copy it)."""
    return made_bundle


def copy_of(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(made[0], copy)
    return copy


def tool_wheel(directory: Path) -> Path:
    (wheel,) = (directory / "simple" / "mlstack-ds").glob("mlstack_ds-*.whl")
    return wheel


@pytest.mark.slow
def test_every_file_is_in_the_manifest_with_its_sha256_and_no_torch(made: tuple[Path, dict[str, Any]]) -> None:
    to, manifest = made
    listed = {f["path"]: f for f in manifest["files"]}
    for rel, entry in listed.items():
        assert sha256(to / rel) == entry["sha256"], rel
        assert entry["why"], rel
    on_disk = {p.relative_to(to).as_posix() for p in to.rglob("*") if p.is_file()}
    unlisted = {p for p in on_disk - set(listed) if not p.endswith("index.html")}
    assert unlisted == {"bundle.json", ".mlstack-ds-publish.lock"}
    accelerator = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm"}
    assert not [p for p in on_disk if p.split("/")[-1].lower().startswith(("torch-", "torch_", "triton-"))
                or (p.startswith("simple/") and p.split("/")[1] in accelerator)], "torch is never bundled"
    recipe = find_recipe()
    assert manifest["torch"] == TORCH and manifest["target"]["python_version"] == HERE
    assert manifest["sdist_sha256"] == recipe.sdist.sha256 == listed[f"sources/{recipe.sdist.filename}"]["sha256"]
    assert [p["name"] for p in manifest["series"]] == read_series_names(recipe.series_path)
    kinds = {f["kind"] for f in manifest["files"]}
    assert kinds == {"tool", "runtime", "build", "sdist", "patch"}
    projects = {f["project"] for f in manifest["files"]}
    # DeepSpeed's runtime requirements (from its sdist), pydantic's own, the build's and the tool's.
    assert {"hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
            "ninja", "setuptools", "wheel", "mlstack-ds", "typer", "rich", "unidiff", "requests"} <= projects
    assert "hjson" in manifest["requested"]["runtime"] and manifest["requested"]["clients"] == []
    page = (to / "simple" / "hjson" / "index.html").read_text()
    assert "#sha256=" + listed[next(p for p in listed if p.startswith("simple/hjson/"))]["sha256"] in page


@pytest.mark.slow
def test_pip_reads_the_bundle_as_its_own_index(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    to, manifest = made
    digests = {f["sha256"] for f in manifest["files"]}
    env = {"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": os.devnull, "HOME": str(tmp_path)}
    for how in (["--no-index", "--find-links", str(to / "simple" / "hjson"), "hjson"],
                ["--index-url", (to / "simple").as_uri(), "pydantic"]):
        dest = tmp_path / how[0].strip("-")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-cache-dir", "--dest", str(dest), *how],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        got = list(dest.iterdir())
        assert got and all(sha256(p) in digests for p in got), [p.name for p in got]
    assert {p.name.split("-")[0] for p in (tmp_path / "index-url").iterdir()} >= {"pydantic", "pydantic_core"}


@pytest.mark.slow
def test_a_bundle_missing_a_requirement_is_refused_up_front_then_completed(
        made: tuple[Path, dict[str, Any]], deepspeed_sdist: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    removed = without_wheel(made[0], copy, "hjson")
    refused = run_cli("install", "--offline", copy, "--no-verify", columns=200, timeout=300)
    assert refused.returncode == 7, refused.stderr[-3000:]
    error, hint = refused.one_error()
    assert "hjson" in error and removed.name in error and "nothing was installed" in error
    assert f"mlstack-ds bundle --to {copy} --python-version {HERE}" in hint
    assert "Planning" not in refused.stderr and "cache key" not in refused.stderr  # refused before the plan
    completed = bundle(copy, deepspeed_sdist, "--tool-wheel", str(tool_wheel(made[0])))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert sha256(removed) == next(f["sha256"] for f in made[1]["files"] if f["path"].startswith("simple/hjson/"))
    planned = run_cli("install", "--offline", copy, "--dry-run", "--json", columns=200, timeout=300)
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = planned.json["plan"]
    assert plan["source"] == f"offline:{copy}" and plan["source_pin"] == find_recipe().sdist.sha256


@pytest.mark.slow
def test_index_only_with_a_bundle_without_prebuilt_wheels_is_refused_before_anything_changes(
        made: tuple[Path, dict[str, Any]]) -> None:
    refused = run_cli("install", "--offline", made[0], "--index-only", "--no-verify", "--json", columns=200,
                      timeout=300)
    assert refused.returncode == 7, refused.stderr[-3000:]
    error, hint = refused.one_error()
    assert "has no prebuilt DeepSpeed wheel" in error and "nothing was installed" in error
    assert "bundle --prebuilt KEY" in hint


@pytest.mark.slow
def test_a_venv_that_cannot_build_wheels_gets_a_fix_that_takes_the_package_from_the_bundle(
        made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """A new venv's ensurepip setuptools (65, no bdist_wheel) is refused by the plan, as online; offline the fix
    must not send pip to the index: it takes `wheel` from the bundle, and it works with no network at all."""
    to, _manifest = made
    venv = overlay_venv(tmp_path / "venv")
    python = venv / "bin" / "python"
    refused = run_cli("install", "--offline", to, "--dry-run", "--python", python, "--cache-dir", tmp_path / "cache",
                      columns=400, timeout=900)
    assert refused.returncode == 3, refused.stderr[-3000:]
    error, hint = refused.one_error()
    assert "cannot build DeepSpeed's wheel" in error
    assert hint == f"hint: {python} -m pip install --no-index --find-links {to}/simple/wheel wheel"
    fixed = subprocess.run([*no_network(), *shlex.split(hint.removeprefix("hint: "))], capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    planned = run_cli("install", "--offline", to, "--dry-run", "--python", python, "--cache-dir",
                      tmp_path / "cache", "--json", prefix=no_network(), columns=200, timeout=900)
    assert planned.returncode == 0, planned.stderr[-3000:]


@pytest.mark.slow
def test_doctor_offline_says_the_bundle_covers_this_install_or_names_what_it_lacks(
        made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    covered = run_cli("doctor", "--offline", made[0], "--json", columns=200, timeout=300)
    document = json.loads(covered.stdout)
    assert document["offline"]["covered"] is True and document["offline"]["python_version"] == HERE
    assert "MLS-BUILD-008" not in {f["rule_id"] for f in document["findings"]}
    assert any(w.startswith(f"bundle {made[0]}: covers installing ") for w in document["warnings"])
    copy = tmp_path / "copy"
    removed = without_wheel(made[0], copy, "hjson")
    lacking = run_cli("doctor", "--offline", copy, "--json", columns=200, timeout=300)
    assert lacking.returncode == 3, lacking.stderr[-3000:]
    document = json.loads(lacking.stdout)
    (finding,) = [f for f in document["findings"] if f["rule_id"] == "MLS-BUILD-008"]
    assert finding["severity"] == "error" and removed.name in finding["evidence"]
    assert f"mlstack-ds bundle --to {copy} --python-version {HERE}" in finding["fix"][0]
    assert document["offline"]["covered"] is False
    assert [m["name"] for m in document["offline"]["missing"]] == ["hjson"]


@pytest.mark.slow
def test_a_bundle_for_another_python_is_refused_with_the_reason(
        made: tuple[Path, dict[str, Any]], deepspeed_sdist: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    done = bundle(other, deepspeed_sdist, "--python-version", OTHER, "--platform", "manylinux_2_28_x86_64",
                  "--tool-wheel", str(tool_wheel(made[0])))
    assert done.returncode == 0, done.stderr[-3000:]
    tag = "cp" + OTHER.replace(".", "")
    assert [p.name for p in (other / "simple" / "pydantic-core").glob(f"*-{tag}-*.whl")]
    refused = run_cli("install", "--offline", other, "--no-verify", "--json", columns=200, timeout=300)
    assert refused.returncode == 7, refused.stderr[-3000:]
    error, hint = refused.one_error()
    assert f"made for Python {OTHER} ({tag})" in error and f"this target is Python {HERE}" in error
    assert f"--python-version {HERE}" in hint
    assert refused.json["error"]["exit_code"] == 7


@pytest.mark.slow
def test_a_bundle_that_fails_half_way_writes_no_manifest(deepspeed_sdist: Path, tmp_path: Path) -> None:
    to = tmp_path / "bundle"
    done = bundle(to, deepspeed_sdist, "--platform", "plan9_x86_64", "--tool-wheel", str(tmp_path / "absent.whl"))
    assert done.returncode == 4, done.stderr[-3000:]
    error, _hint = done.one_error()
    assert "pip download for Python" in error and "plan9_x86_64" in error
    assert not (to / "bundle.json").exists()
    assert not [p for p in to.iterdir() if p.name.startswith(".bundle-staging-")]


def test_bad_bundle_inputs_are_usage_errors_and_touch_nothing(tmp_path: Path) -> None:
    to = tmp_path / "bundle"
    for args, says in ((["--python-version", "3"], "--python-version '3'"),
                       (["--platform", "any"], "--platform 'any'"),
                       (["--source", "git", "--torch", TORCH], "not a git clone or a directory"),
                       (["--torch", "latest", "--source", str(tmp_path)], "--torch 'latest'")):
        done = run_cli("bundle", "--to", to, *args, columns=200, timeout=120)
        assert done.returncode == 2, (args, done.stderr[-2000:])
        error, _hint = done.one_error()
        assert says in error, error
        assert not to.exists(), args


def test_install_offline_refuses_what_is_not_a_bundle_and_other_sources(tmp_path: Path) -> None:
    done = run_cli("install", "--offline", tmp_path, "--dry-run", "--json", columns=200, timeout=300)
    assert done.returncode == 2 and "is not a bundle (no bundle.json)" in done.one_error()[0]
    assert json.loads(done.stdout)["error"]["exit_code"] == 2
    for args in (["doctor"], ["install", "--hostfile", str(tmp_path / "h")]):  # said before any node is asked
        not_a_bundle = run_cli(*args, "--offline", tmp_path, "--json", columns=200, timeout=120)
        assert not_a_bundle.returncode == 2 and "is not a bundle (no bundle.json)" in not_a_bundle.one_error()[0]
    for args in (["--source", "git"], ["--index", str(tmp_path)]):  # --hostfile/--slurm: tests/multinode
        clash = run_cli("install", "--offline", tmp_path, *args, columns=200, timeout=120)
        assert clash.returncode == 2, clash.stderr[-2000:]
        assert "cannot be used with it" in clash.one_error()[0]


def test_bundle_help_explains_the_command() -> None:
    done = run_cli("bundle", "--help", columns=200, timeout=60)
    assert done.returncode == 0
    for text in ("--python-version", "--platform", "--with-clients", "--torch", "--tool-wheel", "torch is never",
                 "install --offline"):
        assert text in done.stdout, text


@pytest.mark.slow
def test_with_no_network_at_all_the_tool_and_deepspeeds_requirements_install_from_the_bundle(
        made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """What the offline node does before `install --offline`, and the pip step inside it, in a network namespace
    with no network: the tool from DIR/simple (pip's own options), then DeepSpeed's runtime and build requirements
    with exactly the options and environment `install --offline` gives pip; and `install --offline --dry-run`
    (detect, the bundle check, the plan from the bundle's sdist)."""
    from mlstack_ds.bundle.manifest import read_manifest
    from mlstack_ds.bundle.offline import OfflineBundle, pip_env

    offline = no_network()
    to, manifest = made
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull}
    tool = subprocess.run([*offline, python, "-m", "pip", "install", "--index-url", (to / "simple").as_uri(),
                           "mlstack-ds"], capture_output=True, text=True, timeout=300, env=env)
    assert tool.returncode == 0, tool.stderr[-2000:]
    bundle = OfflineBundle(to, read_manifest(to), to / "sources")
    requirements = [*manifest["requested"]["runtime"], *manifest["requested"]["build"]]
    deps = subprocess.run([*offline, python, "-m", "pip", "install", *bundle.pip_args(), *requirements],
                          capture_output=True, text=True, timeout=600, env=pip_env(env))
    assert deps.returncode == 0, deps.stderr[-2000:]
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=120, env=env, check=True)
    names = {canonicalize_name(p["name"]) for p in json.loads(listed.stdout.splitlines()[0])}
    assert {"mlstack-ds", "hjson", "pydantic", "pydantic-core", "ninja", "setuptools", "wheel"} <= names
    assert "torch" not in names
    planned = run_cli("install", "--offline", to, "--dry-run", "--json", prefix=offline, columns=200, timeout=300)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert planned.json["plan"]["source"] == f"offline:{to}"


@pytest.mark.slow
def test_clients_are_bundled_without_the_torch_they_require(made: tuple[Path, dict[str, Any]],
                                                            deepspeed_sdist: Path, tmp_path: Path) -> None:
    """accelerate, peft and Lightning require torch: pip resolves them against the stand-in, and no torch (nor
    triton, nor an nvidia-* wheel of a CUDA torch's) lands in the bundle."""
    copy = copy_of(made, tmp_path)
    done = bundle(copy, deepspeed_sdist, "--with-clients", "--tool-wheel", str(tool_wheel(made[0])))
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = done.json["manifest"]
    clients = (Path(__file__).resolve().parents[2] / "requirements" / "clients.txt").read_text().splitlines()
    assert manifest["requested"]["clients"] == [c for c in clients if c and not c.startswith("#")]
    projects = {f["project"] for f in manifest["files"]}
    assert {"transformers", "accelerate", "peft", "lightning", "hjson"} <= projects
    assert not {p for p in projects if p in {"torch", "triton", "pytorch-triton-rocm"} or p.startswith("nvidia-")}
    assert not list(copy.rglob("torch-*")) and not list(copy.rglob("triton-*"))
