"""The Slurm harness (tests/support/slurm_cluster.py) does what the `--slurm` tests will rely on.

A real slurmctld and two slurmds on the two test hosts: an allocation's tasks run on both nodes under the
node's own name and address, with the SLURM_* environment a launcher derives ranks from; a cancelled job
leaves nothing on either node; a task on one node reaches a port a task on the other opened (the
rendezvous path); and the cluster starts again, on the same directory, and leaves no trace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import slurm_cluster as harness
from support.slurm_cluster import SlurmCluster, slurm_cluster
from support.two_hosts import NETNS_ETC, free_port_on

PROBED = ("SLURM_JOB_NODELIST", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_PROCID",
          "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE")
# Far below the 300 s the cancelled job sleeps, far above KillWait (5 s) and a loaded machine's slowness.
CANCEL_BOUND = 120


def test_cluster_is_up_with_both_nodes_idle(slurm: SlurmCluster) -> None:
    slurm.wait_idle()  # at once after the start; later, once the previous tests' jobs are cleaned up
    assert slurm.node_states() == {node.name: "idle" for node in slurm.nodes}
    assert [node.address for node in slurm.nodes] == ["10.213.77.1", "10.213.77.2"]


def test_srun_answers_from_both_nodes_with_their_name_and_address(slurm: SlurmCluster) -> None:
    out = slurm.salloc(["srun", "-N2", "-n2", "sh", "-c", 'echo "$(hostname) $(hostname -I) $SLURM_PROCID"'])
    assert out.returncode == 0, out.stderr
    answers = sorted(tuple(line.split()) for line in out.stdout.splitlines())
    assert answers == [(node.name, node.address, str(rank)) for rank, node in enumerate(slurm.nodes)]


def test_scontrol_expands_the_allocation_nodelist(slurm: SlurmCluster) -> None:
    out = slurm.salloc(["sh", "-c", 'scontrol show hostnames "$SLURM_JOB_NODELIST"'])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [node.name for node in slurm.nodes]


def test_salloc_returns_the_inner_commands_status_and_output(slurm: SlurmCluster) -> None:
    out = slurm.salloc(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (out.returncode, out.stdout, out.stderr) == (7, "out\n", "err\n")
    failed = slurm.salloc(["srun", "-N2", "-n2", "sh", "-c", "exit $((SLURM_PROCID + 3))"])
    assert failed.returncode == 4  # srun's status is its tasks' highest


def task_env(slurm: SlurmCluster, *options: str) -> dict[int, dict[str, str]]:
    """{SLURM_PROCID: the PROBED variables that are set} of each task of `srun OPTIONS` in an allocation."""
    script = f"import json, os; print(json.dumps({{k: os.environ[k] for k in {PROBED!r} if k in os.environ}}))"
    out = slurm.salloc(["srun", *options, sys.executable, "-c", script])
    assert out.returncode == 0, out.stderr
    tasks = [json.loads(line) for line in out.stdout.splitlines()]
    return {int(task["SLURM_PROCID"]): task for task in tasks}


def test_task_environment_names_rank_node_and_allocation(slurm: SlurmCluster) -> None:
    nodelist = ",".join(node.name for node in slurm.nodes)
    plain = task_env(slurm, "-N2", "-n2")
    asked = task_env(slurm, "--ntasks-per-node=1", "--cpus-per-task=1")
    sys.stderr.write(f"\n[slurm task env] srun -N2 -n2: {plain}\n[slurm task env] srun --ntasks-per-node=1 "
                     f"--cpus-per-task=1: {asked}\n")
    for tasks in (plain, asked):
        assert sorted(tasks) == [0, 1]
        assert len({task["SLURM_JOB_ID"] for task in tasks.values()}) == 1
        for rank, task in tasks.items():
            assert task["SLURM_NODEID"] == str(rank)  # one task per node, in node order
            assert (task["SLURM_LOCALID"], task["SLURM_NTASKS"]) == ("0", "2")
            assert task["SLURM_JOB_NODELIST"] == task["SLURM_STEP_NODELIST"] == nodelist
            assert "SLURM_GPUS_ON_NODE" not in task  # no GRES configured
    # Only what was asked for is set: a launcher cannot count on SLURM_NTASKS_PER_NODE or SLURM_CPUS_PER_TASK.
    assert not any("SLURM_NTASKS_PER_NODE" in task or "SLURM_CPUS_PER_TASK" in task for task in plain.values())
    assert all(task["SLURM_NTASKS_PER_NODE"] == task["SLURM_CPUS_PER_TASK"] == "1" for task in asked.values())


def test_cancelled_job_leaves_nothing_on_either_node(slurm: SlurmCluster) -> None:
    job = slurm.allocate()
    # srun from the login node into an allocation it did not make (the --jobid route)
    srun = slurm.popen_in(slurm.login, ["srun", f"--jobid={job}", "-N2", "-n2", "sleep", "300"])
    try:
        deadline = time.monotonic() + CANCEL_BOUND
        while not all(any(line.endswith("/sleep 300") for line in procs) for procs in slurm.leftovers().values()):
            assert srun.poll() is None, srun.communicate()
            assert time.monotonic() < deadline, f"the sleeps did not start on both nodes: {slurm.leftovers()}"
            time.sleep(0.5)
        started = time.monotonic()
        cancel = slurm.run_in(slurm.login, ["scancel", job], timeout=60)
        assert cancel.returncode == 0, cancel.stderr
        assert slurm.wait_no_leftovers(CANCEL_BOUND) == {}
        gone = time.monotonic() - started
        assert srun.wait(timeout=CANCEL_BOUND) != 0
        sys.stderr.write(f"\n[slurm] scancel to nothing left on both nodes: {gone:.1f} s\n")
    finally:
        if srun.poll() is None:
            srun.kill()
        srun.communicate()
    slurm.wait_idle()
    assert slurm.wait_squeue_empty() == []


TRAP = """
import os, signal, sys, time
out = open(os.path.join(sys.argv[1], os.environ["SLURM_PROCID"]), "a", buffering=1)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCONT, signal.SIGHUP):
    signal.signal(sig, lambda number, frame: out.write(signal.Signals(number).name + "\\n"))
out.write("ready\\n")
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize(("stop", "received", "waits_kill_wait"), [
    ("scancel", ["SIGCONT", "SIGTERM"], True),  # the job's tasks: SIGCONT+SIGTERM, SIGKILL after KillWait
    ("srun-sigterm", [], False),  # srun "forcing job termination": SIGKILL at once, no chance to clean up
], ids=["scancel", "srun-sigterm"])
def test_how_a_step_is_stopped(slurm: SlurmCluster, tmp_path: Path, stop: str, received: list[str],
                               waits_kill_wait: bool) -> None:
    """What a task that traps every catchable signal sees when its job is cancelled or its srun gets SIGTERM,
    and how long it lives after (tasks that ignore SIGTERM die at KillWait's SIGKILL)."""
    job = slurm.allocate()
    srun = slurm.popen_in(slurm.login, ["srun", f"--jobid={job}", "-N2", "-n2", sys.executable, "-c", TRAP,
                                        tmp_path])
    try:
        deadline = time.monotonic() + CANCEL_BOUND
        while sorted(f.read_text() for f in tmp_path.iterdir()) != ["ready\n", "ready\n"]:
            assert srun.poll() is None, srun.communicate()
            assert time.monotonic() < deadline, f"the tasks did not start: {slurm.leftovers()}"
            time.sleep(0.2)
        started = time.monotonic()
        if stop == "scancel":
            assert slurm.run_in(slurm.login, ["scancel", job], timeout=60).returncode == 0
        else:
            srun.terminate()
        assert slurm.wait_no_leftovers(CANCEL_BOUND) == {}
        gone = time.monotonic() - started
        sys.stderr.write(f"\n[slurm] {stop}: tasks got {received}, all gone after {gone:.1f} s\n")
        # sorted: Python runs the handlers of signals pending together in signal-number order (TERM before CONT)
        assert [sorted(f.read_text().split()[1:]) for f in sorted(tmp_path.iterdir())] == [received, received]
        if waits_kill_wait:  # Slurm counts KillWait in whole seconds: SIGKILL came 4.73 s after a cancel with 5
            assert gone >= slurm.kill_wait - 1
    finally:
        if srun.poll() is None:
            srun.kill()
        srun.communicate()
        slurm.run_in(slurm.login, ["scancel", job], timeout=60)
    slurm.wait_idle()


RENDEZVOUS = """
import os, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
if os.environ["SLURM_PROCID"] == "0":
    with socket.create_server((host, port)) as server:
        conn, peer = server.accept()
        print("0", socket.gethostname(), "got", conn.recv(100).decode(), "from", peer[0])
else:
    deadline = time.monotonic() + float(sys.argv[3])
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall(socket.gethostname().encode())
    print("1", socket.gethostname(), "sent")
"""


def test_task_reaches_a_port_a_task_on_the_other_node_opened(slurm: SlurmCluster) -> None:
    first, second = slurm.nodes
    port = free_port_on(slurm.hosts, first)
    out = slurm.salloc(["srun", "-N2", "-n2", sys.executable, "-c", RENDEZVOUS, first.name, str(port), "120"])
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [f"0 {first.name} got {second.name} from {second.address}",
                                               f"1 {second.name} sent"]


def test_cluster_starts_again_on_the_same_directory_and_leaves_no_trace(
        slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Beside the session's cluster (its own namespaces, same ports and addresses inside them), twice."""
    root = tmp_path_factory.mktemp("slurm-again")
    for attempt in range(2):
        started = time.monotonic()
        with slurm_cluster(root) as cluster:
            up = time.monotonic() - started
            out = cluster.salloc(["srun", "-N2", "-n2", "hostname"])
            assert out.returncode == 0, out.stderr
            assert sorted(out.stdout.split()) == [node.name for node in cluster.nodes]
            netns = [node.netns for node in cluster.nodes]
            daemons = [proc.pid for proc in cluster.daemons.values()]
            stopping = time.monotonic()
        down = time.monotonic() - stopping
        sys.stderr.write(f"\n[slurm] start {attempt + 1}: up (both nodes idle) in {up:.2f} s, down in {down:.2f} s\n")
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert not any(name in listed or (NETNS_ETC / name).exists() for name in netns)
        assert not any(Path(f"/proc/{pid}").exists() for pid in daemons)
    slurm.wait_idle()  # the session's cluster is untouched


def test_a_cluster_that_does_not_come_up_says_why_and_leaves_no_trace(
        slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "CGROUP_CONF", "CgroupPlugin=cgroup/none-such\n")  # slurmd cannot start
    root = tmp_path_factory.mktemp("slurm-broken")
    broken = slurm_cluster(root)
    with pytest.raises(RuntimeError, match=r"(?s)slurmd-mls-node-a exited with .*--- slurmd-mls-node-a\.log"):
        broken.__enter__()
    made = (root / "hosts" / "netns").read_text().split()  # not a before/after diff: other suites make theirs
    assert len(made) == 2
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    assert not any(name in listed or (NETNS_ETC / name).exists() for name in made)
    slurm.wait_idle()


def test_missing_names_the_absent_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("the two-host harness's reason comes first without root")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(harness, "SBIN", ("/nonexistent",))
    monkeypatch.setattr(harness.th, "missing", lambda: None)
    assert harness.missing() == ("munged, slurmctld, slurmd, srun, salloc, sinfo, scontrol, scancel, squeue not "
                                 "installed (scripts/test.sh installs slurmctld slurmd slurm-client munge)")
