"""The node-side heartbeat (cluster/heartbeat.py) that an srun task runs under: the command's own output and
exit code pass through, a beat line comes at once and every few seconds, and a signal that stops a task
reaches the command itself, once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from mlstack_ds.cluster.heartbeat import BEAT, without_beats

HEARTBEAT = [sys.executable, "-m", "mlstack_ds.cluster.heartbeat"]


def test_the_command_runs_as_itself_between_beats() -> None:
    script = "import sys, time\nprint('out'); print('err', file=sys.stderr); time.sleep(1.2); sys.exit(3)"
    done = subprocess.run([*HEARTBEAT, "--every", "0.25", "--", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout == "out\n"
    lines = done.stderr.splitlines()
    assert lines[0] == BEAT  # at once: the node answered
    assert lines.count(BEAT) >= 4 and "err" in lines
    assert without_beats(done.stderr) == "err\n"


def test_a_signal_to_the_task_reaches_the_command_once_and_is_reported() -> None:
    """slurmstepd signals the task's process group: the command (in the same group) gets SIGTERM once, runs
    its handler to the end, and the heartbeat outlives the signal to report its exit code."""
    script = ("import signal, sys, time\nseen = []\n"
              "signal.signal(signal.SIGTERM, lambda *_: seen.append(1))\n"
              "print('ready', flush=True)\nend = time.monotonic() + 3\n"
              "while time.monotonic() < end: time.sleep(0.05)\nprint(len(seen)); sys.exit(7)")
    proc = subprocess.Popen([*HEARTBEAT, "--every", "0.5", "--", sys.executable, "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, out) == (7, "1\n"), err


def test_a_command_killed_by_a_signal_is_128_plus_it() -> None:
    started = time.monotonic()
    done = subprocess.run([*HEARTBEAT, "--", "sh", "-c", "kill -KILL $$"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 128 + signal.SIGKILL
    assert time.monotonic() - started < 30


def test_no_command_is_a_usage_error() -> None:
    done = subprocess.run([*HEARTBEAT, "--"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("usage: ")
