"""Which failed op lost its compiler to SIGKILL (the OOM killer), read from the op's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlstack_ds.build.wheel import compiler_killed

# The op log of issue 28's load run 3 (2026-11-27 06:03), the lines around the kill.
GCC_KILLED = """\
[1/2] c++ -MMD -MF /tmp/x/src/build/temp.linux-x86_64-cpython-311/deepspeed.ops.comm.deepspeed_shm_comm_op/\
csrc/cpu/comm/shm_interface.o.d ... -c /tmp/x/src/csrc/cpu/comm/shm_interface.cpp -o shm_interface.o
FAILED: /tmp/x/src/build/temp.linux-x86_64-cpython-311/deepspeed.ops.comm.deepspeed_shm_comm_op/csrc/cpu/comm/\
shm_interface.o
c++: fatal error: Killed signal terminated program cc1plus
compilation terminated.
ninja: build stopped: subcommand failed.
"""


@pytest.mark.parametrize(("log", "line"), [
    (GCC_KILLED, "c++: fatal error: Killed signal terminated program cc1plus"),
    ("collect2: fatal error: ld terminated with signal 9 [Killed]\n",
     "collect2: fatal error: ld terminated with signal 9 [Killed]"),
    ("clang++: error: unable to execute command: Killed\n", "clang++: error: unable to execute command: Killed"),
    ("shm.cpp:12:1: error: expected ';' before '}' token\nninja: build stopped: subcommand failed.\n", None),
    ("c++: fatal error: Segmentation fault signal terminated program cc1plus\n", None),  # a crash, not memory
])
def test_the_kill_is_told_from_other_failures(tmp_path: Path, log: str, line: str | None) -> None:
    path = tmp_path / "op.log"
    path.write_text(log)
    assert compiler_killed(path) == line


def test_no_log_is_no_kill(tmp_path: Path) -> None:
    assert compiler_killed(tmp_path / "absent.log") is None
