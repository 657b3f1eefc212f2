"""Launcher argv, hostfile parsing, result files, and the no-orphans guarantee of `run_launch`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mlstack_ds.cluster.hostfile import HostEntry, parse_hostfile
from mlstack_ds.errors import UsageError
from mlstack_ds.launch import launcher, pdsh
from mlstack_ds.launch.session import read_records
from mlstack_ds.patience import Patience
from mlstack_ds.verify.suite import rank_logs


def test_torchrun_argv_uses_loopback_the_given_port_and_no_restarts() -> None:
    args = launcher.worker_args(["zero1", "zero3"], Path("/tmp/out"), 120, "rid")
    argv = launcher.torchrun_argv(Path("/venv/bin/python"), 2, 29555, args)
    assert argv[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
    assert argv[argv.index("--master-port") + 1] == "29555"
    assert argv[argv.index("--max-restarts") + 1] == "0"
    worker = argv.index("--module")
    assert argv[worker + 1:] == [launcher.WORKER_MODULE, "--checks", "zero1,zero3", "--out", "/tmp/out",
                                 "--timeout", "120", "--run-id", "rid"]


def test_worker_package_is_staged_whole(tmp_path: Path) -> None:
    staged = launcher.stage_worker(tmp_path)
    shipped = sorted(p.name for p in launcher.WORKER_PACKAGE.glob("*.py"))
    assert {"__init__.py", "__main__.py", "registry.py"} <= set(shipped)
    assert sorted(p.name for p in (staged / launcher.WORKER_MODULE).iterdir()) == shipped


def test_worker_env_puts_the_staged_copy_first(tmp_path: Path) -> None:
    env = launcher.worker_env({"PYTHONPATH": "/user/lib", "X": "1"}, tmp_path)
    assert env["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/user/lib" and env["X"] == "1"
    assert launcher.worker_env({}, tmp_path)["PYTHONPATH"] == str(tmp_path)


def test_worker_imports_nothing_from_the_tool_but_itself() -> None:
    for source in launcher.WORKER_PACKAGE.glob("*.py"):
        imports = [line.strip() for line in source.read_text().splitlines()
                   if line.lstrip().startswith(("import ", "from "))]
        assert not [line for line in imports if "mlstack_ds" in line], source.name


def test_deepspeed_argv_for_a_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode-a slots=8\nnode-b   slots=8  # second\n\n")
    hosts = parse_hostfile(hostfile)
    assert hosts == [HostEntry("node-a", 8), HostEntry("node-b", 8)]
    args = launcher.worker_args(["zero3"], Path("/shared/out"), 60, "rid")
    argv = pdsh.deepspeed_argv(Path("/venv/bin/python"), hostfile, hosts, 29600, args)
    assert argv[:3] == ["/venv/bin/python", "-m", "deepspeed.launcher.runner"]
    assert argv[argv.index("--hostfile") + 1] == str(hostfile)
    assert argv[argv.index("--master_addr") + 1] == "node-a"
    assert argv[argv.index("--master_port") + 1] == "29600"
    assert "--num_gpus" not in argv
    assert argv[argv.index("--module") + 1:] == args
    with_gpus = pdsh.deepspeed_argv(Path("p"), hostfile, hosts, 1, args, gpus_per_node=4)
    assert with_gpus[with_gpus.index("--num_gpus") + 1] == "4"


@pytest.mark.parametrize("content", ["node-a\n", "node-a slots = 8\n", "node-a slots=x\n", "# only\n", ""])
def test_bad_hostfiles_are_usage_errors(tmp_path: Path, content: str) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(content)
    with pytest.raises(UsageError, match="--hostfile"):
        parse_hostfile(hostfile)


def test_missing_hostfile_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        parse_hostfile(tmp_path / "nope")


def test_free_port_is_bindable() -> None:
    import socket

    port = launcher.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_rank_exit_codes_from_torchrun_failure_summary() -> None:
    log = textwrap.dedent("""\
        Root Cause (first observed failure):
        [0]:
          time      : 2026-11-22_08:00:00
          host      : box
          rank      : 1 (local_rank: 1)
          exitcode  : 17 (pid: 4242)
    """)
    assert launcher.rank_exit_codes(log) == {1: 17}


def test_read_rank_logs_keeps_what_a_dead_rank_wrote(tmp_path: Path) -> None:
    lines = [{"event": "hello", "rank": 1}, {"event": "start", "check": "zero1"},
             {"event": "result", "check": "zero1", "status": "pass"}, {"event": "start", "check": "zero2"}]
    (tmp_path / "rank1.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{truncated")
    logs = rank_logs(read_records(tmp_path, 2), 2)
    assert not logs[0].started and logs[0].results == {}
    assert logs[1].started and logs[1].begun == ("zero1", "zero2") and list(logs[1].results) == ["zero1"]


def test_summary_from_rank0_fills_in_remote_ranks(tmp_path: Path) -> None:
    summary = {"ranks": {"0": [{"check": "zero1", "status": "pass"}],
                         "1": [{"check": "zero1", "status": "fail"}]}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    logs = rank_logs(read_records(tmp_path, 2), 2)
    assert logs[1].results["zero1"]["status"] == "fail"


# A stand-in for torchrun's behaviour that matters here: it starts its worker in a *new session*, so
# killing the launcher's process group alone would leave the worker running.
FAKE_LAUNCHER = textwrap.dedent("""\
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    time.sleep(600)
""")


def test_run_launch_timeout_leaves_no_process_of_the_launch(tmp_path: Path) -> None:
    run_id = launcher.new_run_id()
    started = time.monotonic()
    outcome = launcher.run_launch([sys.executable, "-c", FAKE_LAUNCHER], patience=Patience(2), run_id=run_id)
    assert outcome.timed_out and outcome.returncode is None
    assert time.monotonic() - started < 120  # the time-out and the kill, not the 600 s sleep
    assert launcher.processes_with_marker(run_id) == []


def test_sweep_kills_marked_processes_only(tmp_path: Path) -> None:
    run_id = launcher.new_run_id()
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={**os.environ, launcher.RUN_ID_ENV: run_id}, start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 env={**os.environ, launcher.RUN_ID_ENV: "someone-else"})
    try:
        deadline = time.monotonic() + 60
        while marked.pid not in launcher.processes_with_marker(run_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert launcher.sweep(run_id) == [marked.pid]
        assert marked.wait(timeout=60) == -9
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
