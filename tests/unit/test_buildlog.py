"""A parallel build's interleaved output split by op: replayed from a real build of three CPU ops, two at once."""

from __future__ import annotations

import re
from pathlib import Path

from mlstack_ds.build.oplogs import OpLogs, op_name

LOG = Path(__file__).parents[1] / "fixtures" / "build-logs" / "cpu-3-ops-2-at-once_0.19.5.log"


def replay(directory: Path) -> tuple[OpLogs, list[tuple[str, ...]]]:
    logs = OpLogs(directory)
    running_seen: list[tuple[str, ...]] = []
    for line in LOG.read_text().splitlines():
        logs.feed(line)
        if not running_seen or running_seen[-1] != tuple(logs.running):
            running_seen.append(tuple(logs.running))
    logs.close()
    return logs, running_seen


def test_every_op_gets_its_own_log_with_its_own_compiles_and_link(tmp_path: Path) -> None:
    logs, running = replay(tmp_path)
    assert logs.finished == ["deepspeed_shm_comm", "cpu_adam", "fused_adam"] and logs.failed is None
    assert ("deepspeed_shm_comm", "cpu_adam") in running  # two ops were compiling at once
    for op, sources in {"cpu_adam": ("cpu_adam.cpp", "cpu_adam_impl.cpp"),
                        "fused_adam": ("fused_adam.cpp", "cpu_adam_impl.cpp"),
                        "deepspeed_shm_comm": ("shm.cpp", "shm_interface.cpp")}.items():
        text = logs.path(op).read_text()
        compiled = [Path(m.group(1)).name for m in re.finditer(r" -c (\S+\.cpp) -o ", text)]
        assert sorted(compiled) == sorted(sources), op
        assert f"{op}_op.cpython-311-x86_64-linux-gnu.so" in text.splitlines()[-1]  # ends with its link
        others = {"cpu_adam", "fused_adam", "deepspeed_shm_comm"} - {op}
        assert not any(f"{other}_op/" in text for other in others), op


def test_packaging_after_the_last_link_belongs_to_no_op(tmp_path: Path) -> None:
    logs = OpLogs(tmp_path)
    for line in LOG.read_text().splitlines():
        logs.feed(line)
    assert logs.feed("  copying build/lib.linux-x86_64-cpython-311/deepspeed/__init__.py -> build/bdist") is None
    logs.close()


def test_the_failed_op_is_named_with_its_first_error(tmp_path: Path) -> None:
    """The lines patch 0019 and ninja print when an op fails (formats from the real build of the probe)."""
    logs = OpLogs(tmp_path)
    for line in ["  building 'deepspeed.ops.adam.cpu_adam_op' extension",
                 "  building 'deepspeed.ops.comm.deepspeed_shm_comm_op' extension",
                 "  [1/2] c++ -MMD -MF /t/src/build/temp.linux-x86_64-cpython-311/"
                 "deepspeed.ops.comm.deepspeed_shm_comm_op/csrc/cpu/comm/shm.o.d -c /t/src/csrc/cpu/comm/shm.cpp",
                 "  FAILED: /t/src/build/temp.linux-x86_64-cpython-311/deepspeed.ops.comm.deepspeed_shm_comm_op/"
                 "csrc/cpu/comm/shm.o",
                 "  /t/src/csrc/cpu/comm/shm.cpp:12:1: error: 'this' does not name a type",
                 "  error: building 'deepspeed.ops.comm.deepspeed_shm_comm_op' extension failed: Error compiling"]:
        logs.feed(line)
    logs.close()
    assert logs.failed == "deepspeed_shm_comm"
    assert logs.first_error("deepspeed_shm_comm").startswith("FAILED: ")
    assert "does not name a type" in logs.path("deepspeed_shm_comm").read_text()
    assert "FAILED" not in logs.path("cpu_adam").read_text()


def test_op_names_are_deepspeeds() -> None:
    assert op_name("deepspeed.ops.adam.cpu_adam_op") == "cpu_adam"
    assert op_name("deepspeed.ops.comm.deepspeed_shm_comm_op") == "deepspeed_shm_comm"
