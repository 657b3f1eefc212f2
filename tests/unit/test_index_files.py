"""The index's files without a DeepSpeed build: a small wheel laid out like DeepSpeed's (its build record,
a compiled extension's name, a RECORD) published, read back, relabelled, tampered with and refused."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from mlstack_ds.errors import FetchError, UsageError
from mlstack_ds.index.choose import IndexChoice, Offer, contents_problem, fetch_verified
from mlstack_ds.index.publish import publish_wheel, regenerate
from mlstack_ds.index.read import list_wheels, locate
from mlstack_ds.index.simple import PageError, parse_project_page, project_page
from mlstack_ds.index.wheelfile import WheelProblem, check_record, relabel, wheel_metadata_version

PLAN: dict[str, Any] = {
    "schema": 1, "recipe": "deepspeed-0.19.5", "deepspeed_version": "0.19.5", "source_pin": "p" * 64,
    "patches": [], "platform": "cpu", "accelerator": "cpu", "archs": [], "wavefront": None,
    "ops": [{"name": "cpu_adam", "flag": "DS_BUILD_CPU_ADAM", "build": True, "reason": "r"}],
    "env": {"DS_BUILD_CPU_ADAM": "1"}, "path_prepend": [], "target_python": "/build/host/python",
    "python_version": "3.11.2", "torch_version": "2.13.0+cpu", "torch_hip": None, "torch_cuda": None,
    "cache_key": "89b9bbe95ca51e91974c3564",
}
BUILD_INFO = ("version='0.19.5'\ninstalled_ops={'deepspeed_not_implemented': False, 'cpu_adam': 1}\n"
              "accelerator_name='cpu'\ntorch_info={'version': '2.13', 'hip_version': '0.0', 'cuda_version': '0.0'}\n")


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(directory: Path, files: dict[str, bytes] | None = None) -> Path:
    """deepspeed-0.19.5-cp311-cp311-linux_x86_64.whl with a build record, an 'extension' and a RECORD."""
    members = files or {
        "deepspeed/__init__.py": b"",
        "deepspeed/git_version_info_installed.py": BUILD_INFO.encode(),
        "deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so": b"\x7fELF not really",
        "deepspeed-0.19.5.dist-info/METADATA": b"Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.5\n\nbody\n",
        "deepspeed-0.19.5.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n",
    }
    record = "".join(f"{name},{_hash(data)},{len(data)}\n" for name, data in members.items())
    record += "deepspeed-0.19.5.dist-info/RECORD,,\n"
    wheel = directory / "deepspeed-0.19.5-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in {**members, "deepspeed-0.19.5.dist-info/RECORD": record.encode()}.items():
            archive.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), data)
    return wheel


def record(wheel: Path, **plan: Any) -> dict[str, Any]:
    return {"plan": {**PLAN, **plan}, "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "source_commit": "c" * 40, "tree_hash": "t" * 40, "host": {"machine": "x86_64", "cpu_flags": []}}


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    (tmp_path / "built").mkdir()
    return make_wheel(tmp_path / "built")


def test_publish_writes_a_simple_index_with_hashes_and_plans(wheel: Path, tmp_path: Path) -> None:
    done = publish_wheel(wheel, record(wheel), tmp_path / "idx")
    assert done.action == "published" and done.version == "0.19.5+cpu.torch2.13.0.k89b9bbe9"
    assert done.wheel.name == "deepspeed-0.19.5+cpu.torch2.13.0.k89b9bbe9-cp311-cp311-linux_x86_64.whl"
    assert wheel_metadata_version(done.wheel) == done.version and check_record(done.wheel) == 5
    [link] = list_wheels(locate(str(tmp_path / "idx")))
    assert link.filename == done.wheel.name and link.sha256 == done.sha256
    plan_file = json.loads(Path(done.wheel.as_posix() + ".plan.json").read_text())
    assert plan_file["plan"]["target_python"] == "" and plan_file["wheel_sha256"] == done.sha256
    assert hashlib.sha256(Path(done.wheel.as_posix() + ".plan.json").read_bytes()).hexdigest() == link.plan_sha256
    assert '<a href="deepspeed/">' in (tmp_path / "idx" / "simple" / "index.html").read_text()
    assert not [p for p in (tmp_path / "idx" / "simple" / "deepspeed").iterdir() if ".partial" in p.name]


def test_publishing_twice_changes_nothing_and_other_projects_stay(wheel: Path, tmp_path: Path) -> None:
    other = tmp_path / "idx" / "simple" / "other-project"
    other.mkdir(parents=True)
    (other / "index.html").write_text("<html><a href='x-1.0.tar.gz#sha256=00'>x</a></html>")
    first = publish_wheel(wheel, record(wheel), tmp_path / "idx")
    snapshot = {p: p.read_bytes() for p in (tmp_path / "idx").rglob("*") if p.is_file()}
    again = publish_wheel(wheel, record(wheel), tmp_path / "idx")
    assert again.action == "already published" and again.sha256 == first.sha256
    assert {p: p.read_bytes() for p in (tmp_path / "idx").rglob("*") if p.is_file()} == snapshot
    root = (tmp_path / "idx" / "simple" / "index.html").read_text()
    assert '<a href="deepspeed/">' in root and '<a href="other-project/">' in root
    assert (other / "index.html").read_text().startswith("<html><a href='x-1.0")


def test_two_plans_of_one_release_coexist(wheel: Path, tmp_path: Path) -> None:
    publish_wheel(wheel, record(wheel), tmp_path / "idx")
    publish_wheel(wheel, record(wheel, torch_version="2.12.0+cpu", cache_key="1234abcd" * 3), tmp_path / "idx")
    names = sorted(link.filename for link in list_wheels(locate(str(tmp_path / "idx"))))
    assert [n.split("-")[1] for n in names] == ["0.19.5+cpu.torch2.12.0.k1234abcd", "0.19.5+cpu.torch2.13.0.k89b9bbe9"]


def test_a_different_file_under_a_published_name_is_refused(wheel: Path, tmp_path: Path) -> None:
    done = publish_wheel(wheel, record(wheel), tmp_path / "idx")
    done.wheel.write_bytes(b"something else")
    with pytest.raises(UsageError, match="already in the index with other content"):
        publish_wheel(wheel, record(wheel), tmp_path / "idx")


def offer_for(tmp_path: Path, published_dir: Path) -> IndexChoice:
    index = locate(str(published_dir))
    [link] = list_wheels(index)
    plan_file = json.loads(Path(link.url.removeprefix("file://").replace("%2B", "+") + ".plan.json").read_text())
    chosen = Offer(link, plan_file, ())
    return IndexChoice(index, (chosen,), chosen)


def test_a_checked_wheel_is_fetched_into_the_cache(wheel: Path, tmp_path: Path) -> None:
    publish_wheel(wheel, record(wheel), tmp_path / "idx")
    fetched = fetch_verified(offer_for(tmp_path, tmp_path / "idx"), tmp_path / "cache")
    assert fetched.path.parent.name == fetched.sha256 and fetched.path.is_file()


def test_a_wheel_changed_after_publishing_is_refused_by_its_hash(wheel: Path, tmp_path: Path) -> None:
    done = publish_wheel(wheel, record(wheel), tmp_path / "idx")
    data = bytearray(done.wheel.read_bytes())
    data[100] ^= 0xFF
    done.wheel.write_bytes(bytes(data))
    with pytest.raises(FetchError, match="does not match its sha256"):
        fetch_verified(offer_for(tmp_path, tmp_path / "idx"), tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.whl"))


def test_a_rewritten_wheel_with_a_new_page_hash_is_refused_by_its_record(wheel: Path, tmp_path: Path) -> None:
    done = publish_wheel(wheel, record(wheel), tmp_path / "idx")
    with zipfile.ZipFile(done.wheel) as archive:
        members = {i.filename: archive.read(i) for i in archive.infolist()}
    members["deepspeed/__init__.py"] = b"import os; os.system('echo owned')\n"
    with zipfile.ZipFile(done.wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    plan_path = Path(done.wheel.as_posix() + ".plan.json")
    plan_file = json.loads(plan_path.read_text())
    plan_file["wheel_sha256"] = hashlib.sha256(done.wheel.read_bytes()).hexdigest()
    plan_path.write_text(json.dumps(plan_file))
    regenerate(tmp_path / "idx" / "simple")  # the attacker also rewrote the page
    with pytest.raises(FetchError, match=r"deepspeed/__init__.py does not match its hash in the wheel's RECORD"):
        fetch_verified(offer_for(tmp_path, tmp_path / "idx"), tmp_path / "cache")


def test_contents_that_disagree_with_the_plan_are_named(wheel: Path, tmp_path: Path) -> None:
    done = publish_wheel(wheel, record(wheel), tmp_path / "idx")
    plan_file = json.loads(Path(done.wheel.as_posix() + ".plan.json").read_text())
    assert contents_problem(done.wheel, plan_file) is None
    other_torch = {**plan_file, "plan": {**plan_file["plan"], "torch_version": "2.12.0+cpu"}}
    assert contents_problem(done.wheel, other_torch) == ("it was built against torch 2.13, the plan's is "
                                                         "2.12.0+cpu")
    more_ops = {**plan_file, "plan": {**plan_file["plan"], "ops": [*PLAN["ops"], {"name": "fused_adam",
                                                                                    "build": True}]}}
    assert contents_problem(done.wheel, more_ops) == "its prebuilt ops are ['cpu_adam'], the plan's ['cpu_adam', " \
        "'fused_adam']"
    other_python = {**plan_file, "plan": {**plan_file["plan"], "python_version": "3.12.1"}}
    assert contents_problem(done.wheel, other_python) == "its compiled ops are for cpython-311, the plan's Python " \
        "is 3.12"


def test_relabel_is_reproducible(wheel: Path, tmp_path: Path) -> None:
    relabel(wheel, tmp_path / "a.whl", "0.19.5+x")
    relabel(wheel, tmp_path / "b.whl", "0.19.5+x")
    assert (tmp_path / "a.whl").read_bytes() == (tmp_path / "b.whl").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.whl") as archive:
        assert "deepspeed-0.19.5+x.dist-info/RECORD" in archive.namelist()


def test_a_member_missing_from_record_is_named(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("deepspeed/extra.py", b"x = 1\n")
    with pytest.raises(WheelProblem, match=r"deepspeed/extra\.py is not in the wheel's RECORD"):
        check_record(wheel)


PAGE = "https://idx.example/simple/deepspeed/"


def test_a_page_round_trips_and_other_files_are_ignored() -> None:
    page = project_page("deepspeed", [("deepspeed-0.19.5+cpu.k1-cp311-cp311-linux_x86_64.whl", "a" * 64, "b" * 64)])
    page += '<a href="deepspeed-0.19.5.tar.gz">sdist</a><a href="deepspeed_kernels-1.0-py3-none-any.whl">k</a>'
    [link] = parse_project_page(page, PAGE)
    assert link.url == PAGE + "deepspeed-0.19.5%2Bcpu.k1-cp311-cp311-linux_x86_64.whl"
    assert link.filename == "deepspeed-0.19.5+cpu.k1-cp311-cp311-linux_x86_64.whl"
    assert (link.sha256, link.plan_sha256) == ("a" * 64, "b" * 64)


@pytest.mark.parametrize(("page", "problem"), [
    ("this is not html at all {\"json\": true}", "not an HTML page"),
    ('<html><a href="deepspeed-0.19.5-py3-none-any.whl">x</a></html>', "has no sha256"),
    ('<a href="deepspeed-0.19.5-py3-none-any.whl#md5=abc">x</a>', "has no sha256"),
    ('<a href="deepspeed-0.19.5-py3-none-any.whl#sha256=xyz">x</a>', "has no sha256"),
])
def test_junk_pages_are_refused(page: str, problem: str) -> None:
    with pytest.raises(PageError, match=problem):
        parse_project_page(page, PAGE)


def test_a_directory_that_is_not_an_index_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="is not a directory"):
        locate(str(tmp_path / "missing"))
    with pytest.raises(FetchError, match="no simple index at"):
        list_wheels(locate(str(tmp_path)))
    (tmp_path / "index.html").write_text("<html></html>")
    assert list_wheels(locate(str(tmp_path))) == []  # an index without DeepSpeed offers nothing
