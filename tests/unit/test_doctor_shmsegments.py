"""Leaked DeepSpeed shared-memory segments, with real files and real processes: segments named and
sized as a real 2-rank `deepspeed` run left them (tests/fixtures/doctor-shm), some mapped or held open
by live children the way DeepSpeed's ranks do, which must never be reported; a child killed with
SIGKILL leaves its segment ownerless."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlstack_ds.doctor.engine import run_rules
from mlstack_ds.doctor.shmsegments import (
    SEGMENT_PREFIX,
    ShmScan,
    ShmSegment,
    describe_size,
    in_use_by_kernel,
    scan_shm_segments,
)

SHM_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "doctor-shm"
CAPTURE = SHM_FIXTURES / "dev-shm-after-deepspeed-launcher-2-ranks.txt"

# How a rank uses its segment (shm.cpp): open it, map it, keep both. The other modes isolate each signal.
USE = """
import mmap, os, sys, time
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
if how in ("map+fd", "map"):
    m = mmap.mmap(fd, os.path.getsize(path))
if how == "map":
    os.close(fd)
print("using", flush=True)
time.sleep(120)
"""


def captured_segments() -> list[tuple[str, int]]:
    """(name, size) of each segment in the real `ls -l` capture."""
    rows = [line.split() for line in CAPTURE.read_text().splitlines() if SEGMENT_PREFIX in line]
    return [(row[-1], int(row[4])) for row in rows]


def make_segment(shm: Path, name: str, size: int) -> Path:
    path = shm / name
    with path.open("wb") as handle:
        handle.truncate(size)  # sparse: the real size, no real memory
    return path


def use(path: Path, how: str, children: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", USE, str(path), how], stdout=subprocess.PIPE, text=True)
    children.append(child)
    assert child.stdout is not None and child.stdout.readline().strip() == "using"
    return child


def test_the_capture_is_two_66_mib_segments() -> None:
    assert captured_segments() == [("deepspeed_allreduce_buffer_0_127.0.0.1_29517_0", 69206024),
                                   ("deepspeed_allreduce_buffer_0_127.0.0.1_29517_1", 69206024)]
    assert describe_size(69206024) == "66 MiB"


def test_only_segments_no_live_process_uses_are_leaked(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    [(name0, size), _] = captured_segments()
    stem = name0.rsplit("_", 1)[0]
    paths = [make_segment(shm, f"{stem}_{rank}", size) for rank in range(5)]
    (shm / "torch_123_456").write_bytes(b"x")  # another program's segment: not ours to judge
    (shm / f"{stem}_dir").mkdir()  # not a regular file
    rank0 = use(paths[0], "map+fd", children)  # what a live DeepSpeed rank does
    use(paths[1], "map", children)  # mapped, descriptor closed
    use(paths[2], "fd", children)  # open, not mapped

    scan = scan_shm_segments(shm)
    by_path = {s.path: s for s in scan.segments}
    assert sorted(by_path) == [str(p) for p in paths]
    assert rank0.pid in by_path[str(paths[0])].users
    assert [s.path for s in scan.leaked] == [str(paths[3]), str(paths[4])]
    assert all(s.size == size and s.uid == os.getuid() for s in scan.segments)

    os.kill(rank0.pid, signal.SIGKILL)  # a rank killed: nothing unlinks its segment
    rank0.wait(timeout=30)
    deadline = time.monotonic() + 60  # a loaded machine reaps slowly
    while str(paths[0]) not in [s.path for s in scan_shm_segments(shm).leaked] and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel drops a killed process's mappings as it reaps it
    assert [s.path for s in scan_shm_segments(shm).leaked] == [str(paths[0]), str(paths[3]), str(paths[4])]


def test_the_finding_removes_exactly_the_leaked_segments(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """The rule on facts scanned from real files: the `rm -f` names the leaked ones and their total."""
    from support.doctor_inputs import healthy_facts, make_input

    shm = tmp_path / "shm"
    shm.mkdir()
    paths = [make_segment(shm, name, size) for name, size in captured_segments()]
    use(paths[1], "map+fd", children)
    facts = healthy_facts(shm_segments=scan_shm_segments(shm))
    [finding] = [f for f in run_rules(make_input(facts=facts)) if f.rule_id == "MLS-SYS-003"]
    assert finding.fix[0] == f"rm -f {paths[0]}"
    assert f"1 DeepSpeed all-reduce segment(s) in {shm}, 66 MiB of shared memory" in finding.evidence
    assert "1 more in use or not inspectable, left alone" in finding.evidence
    subprocess.run(finding.fix[0].split(), check=True)  # the printed command works (no shell needed)
    assert not paths[0].exists() and paths[1].exists()


@pytest.mark.parametrize("how", ["map+fd", "map", "fd"])
def test_the_kernel_says_busy_while_any_process_maps_or_holds_it(
    tmp_path: Path, children: list[subprocess.Popen[str]], how: str
) -> None:
    """The write-lease test sees every user, including processes whose /proc entries we may not read."""
    path = make_segment(tmp_path, f"{SEGMENT_PREFIX}0_a_1_0", 4096)
    assert in_use_by_kernel(path) is False
    child = use(path, how, children)
    assert in_use_by_kernel(path) is True
    child.kill()
    child.wait(timeout=30)
    assert in_use_by_kernel(path) is False
    assert in_use_by_kernel(tmp_path / "absent") is None


def test_verdicts() -> None:
    """Leaked: no /proc user, and the kernel granted the lease, or (not asked) nobody uninspected could hold it."""
    segment = ShmSegment("/dev/shm/x", 1, 0, ())
    assert segment.leaked
    assert not ShmSegment("/dev/shm/x", 1, 0, (42,), busy=False).leaked
    assert not ShmSegment("/dev/shm/x", 1, 0, (), busy=True).leaked  # a user we could not see
    assert not ShmSegment("/dev/shm/x", 1, 0, (), busy=None, unknown=True).leaked
    assert ShmSegment("/dev/shm/x", 1, 0, (), busy=False, unknown=True).leaked  # the kernel knows better


def test_no_shm_dir_or_no_segments(tmp_path: Path) -> None:
    assert scan_shm_segments(tmp_path / "absent") == ShmScan(str(tmp_path / "absent"))
    assert scan_shm_segments(tmp_path).segments == ()
