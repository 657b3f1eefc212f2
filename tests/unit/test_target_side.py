"""The scripts of mlstack_ds/target_side: their functions in this process, and each file run as the tool runs
it, in a fresh interpreter where mlstack_ds cannot be imported.

Why both: in-process tests reach the branches (a receipt that is a directory, a torch without devices) that a
real target seldom shows; the subprocess run proves a module needs nothing of mlstack_ds and that, started by
path, it searches the current directory first, as the `python -c` strings it replaced did (issue 42).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging import tags
from support.target_env import bare_venv

from mlstack_ds import __version__
from mlstack_ds import runner as runner_module
from mlstack_ds.cluster import remote, tool
from mlstack_ds.cluster.nodeprobe import node_script, parse_node_output
from mlstack_ds.detect.target_probe import parse_target_output
from mlstack_ds.installed.journal import GUARD_NAME, guard_line
from mlstack_ds.target_side import (
    mlstack_build_wheel,
    mlstack_change_guard,
    mlstack_compile_slot,  # noqa: F401  (prepared() finds each module in sys.modules)
    mlstack_connect_check,
    mlstack_dsconfig_answers,
    mlstack_dsconfig_parse,
    mlstack_ninja_turn,  # noqa: F401  (prepared() finds each module in sys.modules)
    mlstack_package_origin,
    mlstack_platform_tags,
    mlstack_probe_target,
    mlstack_purelib,
    script,
    source,
)

TARGET_SIDE = Path(mlstack_probe_target.__file__).parent
# A fresh interpreter without site-packages or the environment: nothing of mlstack_ds (installed, editable or
# on PYTHONPATH) can be imported, and only the standard library is there. Unlike -I, -P is not implied: run
# by path, the script's directory comes first on sys.path, as in a real target.
FRESH = (sys.executable, "-E", "-s", "-S")


@pytest.fixture
def listening() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def fresh(argv: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FRESH, *argv], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120,
                          check=False)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- the probe ---------------------------------------------------------------------------------------------

def test_the_record_locator_finds_an_installed_distributions_record() -> None:
    found = mlstack_probe_target.record_path("pytest")
    assert found is not None and Path(found).is_file()
    assert Path(found).name == "RECORD" and Path(found).parent.name.endswith(".dist-info")
    assert mlstack_probe_target.record_path("no-such-distribution-mlstack") is None


def test_the_receipt_reader_reads_the_receipt_or_says_why_not(tmp_path: Path) -> None:
    path = tmp_path / "share" / "mlstack-ds" / "receipt.json"
    assert mlstack_probe_target.receipt_answer(str(tmp_path)) == {"path": str(path), "text": None, "error": None}
    write(path, '{"schema": 1}')
    assert mlstack_probe_target.receipt_answer(str(tmp_path))["text"] == '{"schema": 1}'
    path.unlink()
    path.mkdir()  # unreadable: a directory where the file should be
    answer = mlstack_probe_target.receipt_answer(str(tmp_path))
    assert answer["text"] is None and "Is a directory" in answer["error"]


def test_the_probe_prints_the_lines_detect_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert mlstack_probe_target.main(["receipt", "quick"]) == 0
    out = capsys.readouterr().out
    assert [line.split(":", 1)[0] for line in out.splitlines()] == ["MLSTACK_NODE_RECEIPT", "MLSTACK_TARGET_BASE"]
    facts = parse_target_output(out, Path(sys.executable), torch_expected=False)
    assert facts.answered and facts.python.version == ".".join(map(str, sys.version_info[:3]))
    assert facts.python.prefix == sys.prefix


def test_torch_facts_from_a_torch_with_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    props = types.SimpleNamespace(name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-")
    cuda = types.SimpleNamespace(get_arch_list=list, device_count=lambda: 1, get_device_properties=lambda i: props)
    torch = types.SimpleNamespace(__version__="2.13.0+rocm7.2", __file__="/t/torch/__init__.py", cuda=cuda,
                                  version=types.SimpleNamespace(hip="7.2.1", cuda=None),
                                  _C=types.SimpleNamespace(_cuda_getArchFlags=lambda: "gfx942 gfx90a"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert mlstack_probe_target.torch_facts() == {"torch": {
        "version": "2.13.0+rocm7.2", "hip": "7.2.1", "cuda": None, "arch_list": ["gfx942", "gfx90a"],
        "device_count": 1, "devices": [{"name": "AMD Instinct MI300X", "gcn_arch_name": "gfx942:sramecc+:xnack-"}],
        "path": "/t/torch/__init__.py"}, "error": None}


def test_torch_facts_when_torch_is_absent_or_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ModuleNotFoundError(name="torch")
    assert mlstack_probe_target.torch_facts() == {"torch": None, "error": None}


# --- DeepSpeed's config parser and estimators --------------------------------------------------------------

def test_the_duplicate_key_hook_says_what_deepspeed_says() -> None:
    hook = mlstack_dsconfig_parse.dict_raise_error_on_duplicate_keys
    assert hook([("a", 1), ("b", 2)]) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match=r"^Duplicate keys in DeepSpeed config: \['a'\]$"):
        hook([("a", 1), ("a", 2)])


def test_the_parser_reads_hjson_and_names_its_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{\n  // a comment\n  train_batch_size: 8,\n}\n')
    assert mlstack_dsconfig_parse.parse(str(config)) == {"hjson": True, "config": {"train_batch_size": 8}}
    config.write_text('{"a": 1, "a": 2}')
    assert mlstack_dsconfig_parse.parse(str(config)) == {
        "hjson": True, "error": "ValueError: Duplicate keys in DeepSpeed config: ['a']"}
    monkeypatch.setitem(sys.modules, "hjson", None)
    assert mlstack_dsconfig_parse.parse(str(config)) == {"hjson": False}


def test_a_rejection_is_placed_at_its_key() -> None:
    config = {"zero_optimization": {"stage": 9, "offload_param": {"device": "nvme"}}}
    assert mlstack_dsconfig_answers.key_path(config, "device") == "zero_optimization.offload_param.device"
    assert mlstack_dsconfig_answers.describe(ValueError("'stage' must be 0..3"), config) == {
        "key": "zero_optimization.stage", "message": "ValueError: 'stage' must be 0..3"}

    class PydanticLike(Exception):
        def errors(self) -> list[dict[str, object]]:
            return [{"loc": ("offload_param", "device"), "msg": "Input should be 'cpu' or 'nvme'"}]

    assert mlstack_dsconfig_answers.describe(PydanticLike(), config) == {
        "key": "zero_optimization.offload_param.device", "message": "Input should be 'cpu' or 'nvme'"}


def test_auto_values_are_dropped_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"train_batch_size": "auto", "optimizer": {"params": {"lr": "auto"}}, "fp16": {"enabled": True}}
    mlstack_dsconfig_answers.replace_auto(config)
    assert config == {"fp16": {"enabled": True}}
    parsed: list[dict[str, object]] = []
    fake = types.ModuleType("deepspeed.runtime.config")
    fake.DeepSpeedConfig = parsed.append
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.config", fake)
    monkeypatch.setattr(mlstack_dsconfig_answers.importlib.util, "find_spec", lambda name: None)
    request = {"hf": True, "batch": {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                                     "gradient_accumulation_steps": 1}}
    answer = mlstack_dsconfig_answers.validate(request, {"train_batch_size": "auto", "zero_optimization": {}})
    assert answer["ok"] and "not installed" in answer["hf"]
    assert parsed == [{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}]


# --- the node's checks, the tool check, the wheel build, site-packages -------------------------------------

def test_the_connect_check(listening: int) -> None:
    assert mlstack_connect_check.connect("127.0.0.1", listening, 10) == "ok"
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    assert mlstack_connect_check.connect("127.0.0.1", port, 10).startswith("ConnectionRefusedError: ")


def test_the_platform_tags_are_packagings() -> None:
    assert mlstack_platform_tags.platform_tags() == list(tags.platform_tags())


def test_the_package_origin() -> None:
    assert mlstack_package_origin.origin("json") == f"{json.__version__} {os.path.realpath(json.__file__)}"


def test_the_purelib() -> None:
    assert mlstack_purelib.purelib() == sysconfig.get_paths()["purelib"]


def test_the_legacy_wheel_build_calls_setuptools_hook_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from setuptools.command import bdist_wheel
    monkeypatch.setattr(bdist_wheel, "WheelFile", bdist_wheel.WheelFile)  # pack_faster's change, put back
    calls: list[str] = []
    build_meta = types.SimpleNamespace(__legacy__=types.SimpleNamespace(
        build_wheel=lambda out: calls.append(out) or "tiny-1.0-py3-none-any.whl"))
    monkeypatch.setitem(sys.modules, "setuptools", types.SimpleNamespace(build_meta=build_meta))
    monkeypatch.setitem(sys.modules, "setuptools.build_meta", build_meta)
    assert mlstack_build_wheel.build_wheel("/o") == "tiny-1.0-py3-none-any.whl" and calls == ["/o"]


def test_the_tool_check_sends_its_script_on_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_tool as on a node that runs this very tool: ssh replaced by running the same argv here."""
    sent: list[list[str]] = []

    def here(host: str, argv: list[str], **kwargs: object) -> runner_module.RunResult:
        sent.append([str(a) for a in argv])
        return runner_module.run(argv, **kwargs)

    monkeypatch.setattr(remote, "run_on", here)
    tool.check_tool("here")  # raises when the answer is not this version at this path
    assert sent[0][-2:] == ["-", "mlstack_ds"] and "-c" not in sent[0]
    assert mlstack_package_origin.origin("mlstack_ds") == f"{__version__} {tool._package_file()}"


def test_the_node_script_connects_to_the_rendezvous(tmp_path: Path, listening: int) -> None:
    """The connect check as doctor --slurm sends it: a here-document inside the node's `sh -s` script."""
    python = bare_venv(tmp_path / "venv") / "bin" / "python"  # no torch: the probe after it is quick
    script_text = node_script(python, tmp_path / "no-tool", rendezvous=("127.0.0.1", listening))
    done = subprocess.run(["sh", "-s"], input=script_text, capture_output=True, text=True, timeout=300, check=True)
    facts = parse_node_output("here", done.stdout, python)
    assert facts.port_check == "ok" and facts.target is not None and facts.target.answered


# --- each file, run as the tool runs it, where mlstack_ds is absent ----------------------------------------

@dataclass(frozen=True)
class Run:
    argv: list[str]
    check: Callable[[str, Path], None]
    stdin: str | None = None
    files: tuple[tuple[str, str], ...] = ()  # put into the current directory: found first, as under -c


TORN_DOWN = "import atexit\natexit.register(print, 'torn down')\n"


def _probe(out: str, cwd: Path) -> None:
    assert out.splitlines()[0].startswith("MLSTACK_NODE_RECEIPT:")
    facts = parse_target_output(out, Path(sys.executable))
    assert facts.answered and facts.torch_probed and facts.torch is None and facts.torch_error is None
    assert facts.deepspeed_package == str(cwd / "deepspeed")  # the current directory is searched first


def _marked(marker: str, expected: dict[str, object]) -> Callable[[str, Path], None]:
    def check(out: str, cwd: Path) -> None:
        assert out == f"{marker}{json.dumps(expected)}\n"
    return check


RUNS: dict[str, Run] = {
    "mlstack_probe_target": Run(["receipt"], _probe, files=(("deepspeed/__init__.py", ""),)),
    "mlstack_dsconfig_answers": Run([], _marked(mlstack_dsconfig_answers.MARKER, {"ok": True}),
                                    stdin=json.dumps({"mode": "validate", "config": {"train_batch_size": 1}}),
                                    files=(("deepspeed/__init__.py", ""), ("deepspeed/runtime/__init__.py", ""),
                                           ("deepspeed/runtime/config.py", "DeepSpeedConfig = dict\n"))),
    "mlstack_dsconfig_parse": Run(["ds.json"], _marked(mlstack_dsconfig_parse.MARKER, {"hjson": False}),
                                  files=(("ds.json", "{}"),)),
    "mlstack_connect_check": Run(["127.0.0.1", "{port}", "10"], lambda out, cwd: _equal(out, "ok\n")),
    "mlstack_platform_tags": Run([], lambda out, cwd: _equal(out, "fake_tag other_tag\n"),
                                 files=(("packaging/__init__.py", ""),
                                        ("packaging/tags.py", "def platform_tags():\n"
                                                              "    return iter(['fake_tag', 'other_tag'])\n"))),
    "mlstack_package_origin": Run(["json"], lambda out, cwd: _equal(
        out, f"{json.__version__} {os.path.realpath(json.__file__)}\n")),
    # An exit handler that prints: setup.py's imports (torch, DeepSpeed) are not torn down after the answer.
    "mlstack_build_wheel": Run(["{out}"], lambda out, cwd: _equal(out, f"built {cwd / 'out'}.whl\n"),
                               files=(("setuptools/__init__.py", TORN_DOWN),
                                      ("setuptools/build_meta.py", "class __legacy__:\n    @staticmethod\n"
                                       "    def build_wheel(out):\n        return out + '.whl'\n"))),
    "mlstack_compile_slot": Run(["echo", "compiled"], lambda out, cwd: _equal(out, "compiled\n")),
    "mlstack_ninja_turn": Run(["--version"], lambda out, cwd: _equal(out, subprocess.run(
        ["ninja", "--version"], capture_output=True, text=True, check=True).stdout)),
    "mlstack_purelib": Run([], lambda out, cwd: _equal(out, fresh(  # what the one-liner it replaced says
        ["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd).stdout)),
}


def _equal(out: str, expected: str) -> None:
    assert out == expected


def test_every_target_side_module_has_a_run() -> None:
    """The change guard is run by site.py from a `.pth` line, never by path: its own test below."""
    assert sorted([*RUNS, "mlstack_change_guard"]) == sorted(p.stem for p in TARGET_SIDE.glob("mlstack_*.py"))


def test_mlstack_ds_is_not_importable_there(tmp_path: Path) -> None:
    """What the runs below rely on: the fresh interpreter cannot import the tool."""
    done = fresh(["-c", "import mlstack_ds"], tmp_path)
    assert done.returncode != 0 and "No module named 'mlstack_ds'" in done.stderr


def prepared(name: str, tmp_path: Path, listening: int) -> tuple[Run, types.ModuleType, list[str]]:
    """RUNS[name] with its files written under `tmp_path`, its module, and its argv filled in."""
    run = RUNS[name]
    for relative, text in run.files:
        write(tmp_path / relative, text)
    return run, sys.modules[f"mlstack_ds.target_side.{name}"], [a.format(port=listening, out=tmp_path / "out")
                                                               for a in run.argv]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_module_runs_by_path_without_mlstack_ds(name: str, tmp_path: Path, listening: int) -> None:
    run, module, argv = prepared(name, tmp_path, listening)
    done = fresh([str(script(module)), *argv], tmp_path, run.stdin)
    assert done.returncode == 0, done.stderr
    run.check(done.stdout, tmp_path)


def test_the_probe_ends_without_tearing_torch_down(tmp_path: Path) -> None:
    """The interpreter's teardown of a real torch takes 0.3 s after the answer, which every command waits for
    (issue 43): here a torch whose exit handler would print."""
    write(tmp_path / "torch" / "__init__.py", f"from torch import version\n__version__ = '2.13.0'\n{TORN_DOWN}")
    write(tmp_path / "torch" / "version.py", "hip = cuda = None\n")
    done = fresh([str(script(mlstack_probe_target))], tmp_path)
    assert done.returncode == 0, done.stderr
    torch = parse_target_output(done.stdout, Path(sys.executable)).torch
    assert "torn down" not in done.stdout and torch is not None and torch.version == "2.13.0"


@pytest.mark.parametrize("name", ["mlstack_probe_target", "mlstack_platform_tags", "mlstack_package_origin",
                                  "mlstack_connect_check"])
def test_the_modules_sent_as_text_run_from_stdin(name: str, tmp_path: Path, listening: int) -> None:
    """How a node runs them: `python - ARGS` with the module's text on stdin (no file of mlstack_ds there)."""
    run, module, argv = prepared(name, tmp_path, listening)
    done = fresh(["-", *argv], tmp_path, source(module))
    assert done.returncode == 0, done.stderr
    run.check(done.stdout, tmp_path)


def test_the_change_guard_refuses_deepspeed_only() -> None:
    meta_path: list[object] = []
    mlstack_change_guard.guard("being changed", meta_path)
    (finder,) = meta_path
    with pytest.raises(ImportError, match=r"^being changed$") as raised:
        finder.find_spec("deepspeed.ops")
    assert raised.value.name == "deepspeed.ops"
    assert finder.find_spec("torch") is None and finder.find_spec("deepspeedx") is None


def test_the_change_guards_pth_line_works_without_mlstack_ds(tmp_path: Path) -> None:
    """The line as installed/journal.py writes it, read by site.py in a fresh interpreter."""
    site_dir = tmp_path / "site"
    write(site_dir / GUARD_NAME, guard_line("DeepSpeed is being changed"))
    write(site_dir / "deepspeed" / "__init__.py", "")
    assert len((site_dir / GUARD_NAME).read_text().splitlines()) == 1
    probe = ("import site, sys; site.addsitedir(sys.argv[1])\n"
             "try:\n    import deepspeed; print('imported')\nexcept ImportError as e: print(e)\n")
    done = fresh(["-c", probe, str(site_dir)], tmp_path)
    assert (done.stdout, done.stderr) == ("DeepSpeed is being changed\n", "")


def test_importing_a_module_runs_nothing() -> None:
    """The tool imports them for their markers and paths: nothing may happen on import (no output, no exit)."""
    done = subprocess.run([sys.executable, "-c", "import mlstack_ds.target_side." + ", mlstack_ds.target_side.".join(
        sorted([*RUNS, "mlstack_change_guard"]))], capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "PYTHONPATH": str(TARGET_SIDE.parents[1])})
    assert done.stdout == "" and done.stderr == ""


def test_the_wheel_is_packed_at_the_fast_zlib_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setuptools' own wheel writer, after pack_faster: each member deflated at WHEEL_ZIP_LEVEL (issue 43)."""
    import zipfile
    import zlib

    from setuptools.command import bdist_wheel
    monkeypatch.setattr(bdist_wheel, "WheelFile", bdist_wheel.WheelFile)  # put back after the test
    mlstack_build_wheel.pack_faster()
    data = b"".join(f"line {i} of an op library's debug info\n".encode() for i in range(200_000))
    wheel = tmp_path / "toy-1.0-py3-none-any.whl"
    with bdist_wheel.WheelFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("toy/lib.so", data)
    deflate = zlib.compressobj(mlstack_build_wheel.WHEEL_ZIP_LEVEL, zlib.DEFLATED, -15)
    fast = len(deflate.compress(data) + deflate.flush())
    with zipfile.ZipFile(wheel) as archive:
        member = archive.getinfo("toy/lib.so")
        assert archive.read("toy/lib.so") == data
    assert member.compress_size == fast
    default = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
    assert fast != len(default.compress(data) + default.flush())  # the level shows in the size
