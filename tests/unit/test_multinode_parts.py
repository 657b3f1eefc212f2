"""The pure parts of the multi-node machinery: rank layout, the ranks' env file, the kill pattern, the
per-node report. The real thing (ssh, pdsh, DeepSpeed's launcher on two hosts) is in tests/multinode/."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from mlstack_ds.cluster import remote
from mlstack_ds.cluster.hostfile import HostEntry, rank_layout
from mlstack_ds.launch.pdsh import write_env_file
from mlstack_ds.verify.report import CheckResult, LaunchRecord, VerifyReport


def test_ranks_follow_hostfile_order_and_skip_empty_hosts() -> None:
    hosts = [HostEntry("a", 2), HostEntry("idle", 0), HostEntry("b", 3)]
    assert rank_layout(hosts) == {"a": [0, 1], "b": [2, 3, 4]}


def test_env_file_keeps_the_users_lines_then_forwards_what_the_ranks_need(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_IB_HCA=mlx5_0\nnot a variable\n")
    (cwd / ".deepspeed_env").write_text("HIP_VISIBLE_DEVICES=0,1\n")
    env = {"GLOO_SOCKET_IFNAME": "eth1", "MLSTACK_VERIFY_RUN_ID": "mlstack-verify-1", "DS_ACCELERATOR": "cpu",
           "HOME": "/root", "SECRET_TOKEN": "x", "NCCL_DEBUG": "multi\nline", "OMP_NUM_THREADS": " "}
    path = write_env_file(tmp_path / "env", env, home=home, cwd=cwd)
    assert path.read_text().splitlines() == [
        "NCCL_IB_HCA=mlx5_0", "HIP_VISIBLE_DEVICES=0,1",
        "DS_ACCELERATOR=cpu", "GLOO_SOCKET_IFNAME=eth1", "MLSTACK_VERIFY_RUN_ID=mlstack-verify-1",
    ]


def test_env_file_reads_the_file_ds_env_file_names(tmp_path: Path) -> None:
    (tmp_path / "cluster.env").write_text("NCCL_SOCKET_IFNAME=ib0\n")
    path = write_env_file(tmp_path / "ours", {"DS_ENV_FILE": "cluster.env"}, home=tmp_path / "nohome", cwd=tmp_path)
    assert path.read_text() == "NCCL_SOCKET_IFNAME=ib0\n"


def test_kill_pattern_matches_the_ranks_but_not_pkill_itself() -> None:
    marker = "mlstack-verify-0123abcd"
    pattern = f"[{marker[0]}]{re.escape(marker[1:])}"
    assert re.search(pattern, f"python -m mlstack_verify_worker --run-id {marker}")
    assert not re.search(pattern, f"pkill -KILL -f {pattern}")


def test_remote_commands_are_quoted_for_the_remote_shell(tmp_path: Path) -> None:
    """ssh hands the remote shell one string: a path with spaces and quotes must arrive whole."""
    odd = tmp_path / "a dir with 'quotes' and $HOME"
    argv = remote.ssh_argv("node", ["test", "-x", odd])
    assert argv[:len(remote.SSH_OPTIONS) + 2] == ["ssh", *remote.SSH_OPTIONS, "node"]
    shell_sees = subprocess.run(["sh", "-c", f"printf '%s\\n' {argv[-1]}"], capture_output=True, text=True).stdout
    assert shell_sees.splitlines() == ["test", "-x", str(odd)]
    assert shlex.split(argv[-1]) == ["test", "-x", str(odd)]


def test_unreachable_takes_sshs_own_words() -> None:
    from mlstack_ds.runner import RunResult

    refused = RunResult(("ssh",), 255, "", "ssh: connect to host 10.0.0.9 port 22: Connection refused\n", 0.1)
    gone = remote.unreachable(refused, "node-c")
    assert gone is not None and gone.reason == "connect to host 10.0.0.9 port 22: Connection refused"
    assert gone.error().message == "node node-c is not reachable over ssh: connect to host 10.0.0.9 port 22: " \
        "Connection refused"
    assert remote.unreachable(RunResult(("ssh",), 1, "", "test failed", 0.1), "node-c") is None


def test_report_says_which_node_failed() -> None:
    checks = (CheckResult("zero1", "pass", "", 1.0, ranks={0: "pass", 1: "pass", 2: "pass", 3: "pass"}),
              CheckResult("zero3", "fail", "rank 3: x", 1.0, ranks={0: "pass", 1: "pass", 2: "pass", 3: "fail"}))
    nodes = ({"host": "a", "ranks": [0, 1], "files": "shared"}, {"host": "b", "ranks": [2, 3], "files": "copied"})
    report = VerifyReport(sys.executable, 4, checks, (LaunchRecord(("x",), ("zero1", "zero3"), 1, 1.0, False, "",
                                                                     nodes),), 2.0)
    assert report.to_json()["nodes"] == [
        {"host": "a", "ranks": [0, 1], "files": "shared", "failed": [], "ok": True},
        {"host": "b", "ranks": [2, 3], "files": "copied", "failed": ["zero3"], "ok": False},
    ]
