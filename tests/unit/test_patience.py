"""The patience policy's behaviour: the value type, the table's promises, and the waits the issue changed
(ROCm tools on the stall rule, the node probe as patient as the local one, bench's --timeout a stall rule).

Fake tools stand in for ROCm's (no GPU here); the times are injected through a Patience, so each test
takes seconds, and the old fixed bound is run beside the new one on the same tool to show the difference.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from mlstack_ds.bench.run import STAGE_CEILING_TIMEOUTS, judge, stage_patience
from mlstack_ds.cluster.heartbeat import BEAT_EVERY_S
from mlstack_ds.cluster.nodeprobe import node_script
from mlstack_ds.detect.probes import ToolContext
from mlstack_ds.launch.launcher import LaunchOutcome
from mlstack_ds.patience import WAITS, Patience, stall_rule

# Works (uses CPU) for SECONDS, then answers like rocminfo's first line.
BUSY_TOOL = """#!{python}
import sys, time
end = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else {seconds})
while time.monotonic() < end:
    sum(range(10000))
print("ROCk module is loaded")
"""
# A hung driver: no CPU, no reads, no answer.
HUNG_TOOL = "#!/bin/sh\nexec /bin/sleep 300\n"


def fake_tool(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text(text)
    tool.chmod(0o755)
    return tool


def context(bin_dir: Path, patience: Patience) -> ToolContext:
    return ToolContext(environ={"PATH": str(bin_dir)}, rocm_root=None, patience=patience)


def test_a_patience_is_seconds_that_make_sense() -> None:
    assert Patience(900.0, 60.0).watched and not Patience(150.0).watched
    assert Patience(900.0, 60.0).describe() == "60 s without progress, 900 s in all"
    assert Patience(150.0).describe() == "150 s"
    assert stall_rule(300, 1200) == Patience(ceiling_s=1200, stall_s=300)
    for bad in (dict(ceiling_s=-1.0), dict(ceiling_s=float("inf")), dict(ceiling_s=10.0, stall_s=0.0),
                dict(ceiling_s=10.0, stall_s=float("nan"))):
        with pytest.raises(ValueError, match="seconds"):
            Patience(**bad)  # type: ignore[arg-type]


def test_a_users_stall_time_keeps_the_ceiling_at_least_as_long() -> None:
    """detect --tool-timeout S: S without progress; the table's ceiling, or S when the user gives more."""
    assert WAITS["rocm tool"].with_stall(5) == Patience(WAITS["rocm tool"].ceiling_s, 5)
    assert WAITS["rocm tool"].with_stall(1000) == Patience(1000, 1000)


def test_the_table_keeps_its_promises() -> None:
    assert all(isinstance(p, Patience) for p in WAITS.values())
    with pytest.raises(TypeError):
        WAITS["rocm tool"] = Patience(1.0)  # type: ignore[index]  # one table, read-only
    # The node probe imports torch like the local probe, watched through its heartbeat: the same rule.
    assert WAITS["node probe"] == WAITS["target probe"]
    # A node's task is taken for lost only after many of its heartbeat's lines are missed.
    assert WAITS["silent node"].ceiling_s >= 10 * BEAT_EVERY_S
    # A node's detect runs that probe and the ROCm tools under the node's own rules: ssh must outwait both.
    assert WAITS["node detect"].ceiling_s > WAITS["target probe"].ceiling_s + WAITS["rocm tool"].stall_s
    # ROCm tools: as quick as before to stop a hung driver (30 s), more patient with a working one.
    assert WAITS["rocm tool"] == Patience(ceiling_s=300.0, stall_s=30.0)


def test_a_slow_rocm_tool_that_keeps_working_is_answered_past_its_stall_time(tmp_path: Path) -> None:
    """The old rule (a fixed bound) killed a tool still enumerating GPUs on a loaded machine; the stall
    rule lets it finish. Here: 3 s of work, a stall time of 1 s (the table's 30 s, scaled down)."""
    fake_tool(tmp_path / "bin", "rocminfo", BUSY_TOOL.format(python=sys.executable, seconds=3))
    fixed = context(tmp_path / "bin", Patience(ceiling_s=1.0))
    assert fixed.run_tool("rocminfo") is None
    assert fixed.warnings and "did not finish within 1 s" in fixed.warnings[0]

    patient = context(tmp_path / "bin", Patience(ceiling_s=60.0, stall_s=1.0))
    started = time.monotonic()
    result = patient.run_tool("rocminfo")
    assert result is not None and "ROCk module is loaded" in result.stdout, patient.warnings
    assert patient.warnings == [] and time.monotonic() - started >= 3


def test_a_hung_rocm_tool_is_stopped_after_its_stall_time_not_its_ceiling(tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin", "amd-smi", HUNG_TOOL)
    ctx = context(tmp_path / "bin", Patience(ceiling_s=120.0, stall_s=1.0))
    started = time.monotonic()
    assert ctx.run_tool("amd-smi", "list") is None
    assert time.monotonic() - started < 30
    assert len(ctx.warnings) == 1 and "made no progress for 1 s" in ctx.warnings[0]


def test_a_working_rocm_tool_still_meets_the_ceiling(tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin", "rocminfo", BUSY_TOOL.format(python=sys.executable, seconds=300))
    ctx = context(tmp_path / "bin", Patience(ceiling_s=2.0, stall_s=1.0))
    started = time.monotonic()
    assert ctx.run_tool("rocminfo") is None
    assert time.monotonic() - started < 30 and "did not finish within 2 s" in ctx.warnings[0]


def test_the_tool_context_waits_by_the_table_unless_told() -> None:
    assert ToolContext(environ={}, rocm_root=None).patience == WAITS["rocm tool"]


def test_the_node_connect_check_takes_its_seconds_from_the_table() -> None:
    script = node_script(Path("/v/bin/python"), Path("/v/bin/python"), rendezvous=("head", 29500))
    assert f"/v/bin/python - head 29500 {WAITS['rendezvous connect'].ceiling_s:g} 2>&1" in script


def test_bench_timeout_is_a_stall_rule_with_a_ceiling() -> None:
    """bench --timeout S: S with no rank reporting stops a stage; one that keeps reporting gets up to
    STAGE_CEILING_TIMEOUTS x S (it was a fixed S per stage, whatever the ranks did)."""
    assert stage_patience(600) == Patience(ceiling_s=600 * STAGE_CEILING_TIMEOUTS, stall_s=600)
    stalled = LaunchOutcome(None, 61.0, True, "", stalled=True)
    assert judge({}, 2, stalled, 60, ceiling_s=180) == (
        "failed", "timed out: no rank reported for 60 s (a hang; --timeout)")
    assert judge({}, 2, LaunchOutcome(None, 180.0, True, ""), 60, ceiling_s=180) == (
        "failed", "timed out after 180 s")


def test_the_architecture_page_lists_every_wait() -> None:
    """docs/architecture.md's table is generated from patience.py's source (scripts/architecture.py): every
    entry must have come through, with its numbers."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = page.split("<!-- patience: generated by scripts/architecture.py, do not edit -->")[1].split(
        "<!-- patience: end -->")[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in block.splitlines() if line.startswith("| ")}
    assert set(WAITS) <= set(rows)
    for name, patience in WAITS.items():
        assert f"| {patience.ceiling_s:g} s |" in rows[name]
        assert (f"| {patience.stall_s:g} s |" if patience.stall_s else "| none (fixed) |") in rows[name]
