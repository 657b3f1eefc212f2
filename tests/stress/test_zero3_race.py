"""The ZeRO-3 loss race on two CPU ranks: the unpatched 0.19.5 tree shows it, the patched one does not,
and the second pin (0.19.8) does not either with no patch at all (upstream has the fixes we backport).

Runs scripts/stress_zero3.py against both source trees with the test venv's interpreter. A *run* is
one fresh ZeRO-3 engine trained for 30 steps beside a plain torch.optim.Adam copy; five runs share a
two-rank launch, because a launch costs 8-37 s of imports on 2 cores and an engine under 1 s.

Why this configuration: with the research's 8 steps one launch in 3 to 6 is corrupted (20 of 60
here), so 10 such runs would miss the bug 2-16 % of the time. With 30 steps there are more post-step
re-gathers per engine: 49 of 60 unpatched engines were corrupted, made six per process, against 0 of
60 patched (docs/benchmarks.md). If engines are independent at p = 0.8, one launch of 5 misses with
probability 0.2**5 = 0.03 %, and two launches with 1e-7: the false-pass probability of the
unpatched assertion. Sharing processes is itself safe once patched (the same measurement).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STRESS = REPO_ROOT / "scripts" / "stress_zero3.py"
ENGINES_PER_LAUNCH = "3,3,3,3,3"
STEPS = "30"


def stress(tree: Path, launches: int, extensions: Path, *extra: str) -> dict:
    """Run the stress script; `--skip-shm-op` must really leave the op alone (nothing JIT-compiled)."""
    argv = [sys.executable, str(STRESS), "--json", "--python", sys.executable, "--deepspeed-tree", str(tree),
            "--runs", str(launches), "--stages", ENGINES_PER_LAUNCH, "--steps", STEPS, "--skip-shm-op",
            "--stall", "120", "--timeout", "1800", *extra]
    # A launch that hangs does nothing and is stopped after 120 s; a loaded machine only makes it slow (at a
    # load of 29, three suites at once, launches took over 240 s, the fixed limit this replaced).
    done = subprocess.run(argv, capture_output=True, text=True, timeout=launches * 1900, check=False,
                          env={**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)})
    assert done.stdout, done.stderr[-2000:]
    assert not list(extensions.glob("**/deepspeed_shm_comm*")), "shm_comm was compiled despite --skip-shm-op"
    return json.loads(done.stdout)


def failed_launches(summary: dict) -> str:
    """Why launches gave no verdict (the launcher's exit and its last error lines), whole: pytest's repr of
    the outcomes cuts exactly that part off."""
    return "\n".join(f"launch {o['index']}: {o['detail']}" for o in summary["outcomes"] if o["status"] == "failed")


@pytest.mark.slow
def test_patched_tree_trains_like_plain_adam(patched_deepspeed_tree: Path, tmp_path: Path) -> None:
    summary = stress(patched_deepspeed_tree, 2, tmp_path / "torch_extensions")
    assert summary["failed"] == 0, failed_launches(summary)
    assert summary["corrupted_engines"] == 0, [o["deviation"] for o in summary["outcomes"]]
    assert summary["judged"] * summary["engines_per_run"] == 10


@pytest.mark.slow
def test_the_second_pin_trains_like_plain_adam_unpatched(next_unpatched_deepspeed_tree: Path, tmp_path: Path) -> None:
    """Why 0.19.8's series carries no 0001-0003: pristine 0.19.8, no engine corrupted. One launch of 5
    engines is enough here: with the race, 0.8 of engines are corrupted, so all 5 clean by chance has
    probability 0.2**5 = 0.03 %."""
    summary = stress(next_unpatched_deepspeed_tree, 1, tmp_path / "torch_extensions")
    assert summary["failed"] == 0, failed_launches(summary)
    assert summary["deepspeed"].startswith("deepspeed 0.19.8 "), summary["deepspeed"]
    assert summary["corrupted_engines"] == 0, [o["deviation"] for o in summary["outcomes"]]
    assert summary["judged"] * summary["engines_per_run"] == 5


# Up to this many launches for the unpatched tree, stopping at the first corrupted one (usually the first).
# Engines of one launch are not independent: on 2026-11-28 a clean-clone suite run (load about 4.5) had two
# launches of 5 engines each, all 10 clean, against the p = 0.8 per engine the module docstring assumes; the
# race's odds follow the ranks' thread timing, which the machine's load moves. More launches cost nothing when
# the first is corrupted, and make a whole run of clean launches the rare event it should be.
UNPATCHED_LAUNCHES = 6


@pytest.mark.slow
def test_unpatched_tree_corrupts_the_loss(pristine_deepspeed_tree: Path, tmp_path: Path) -> None:
    summary = stress(pristine_deepspeed_tree, UNPATCHED_LAUNCHES, tmp_path / "torch_extensions",
                     "--stop-after-corrupted", "1")
    assert summary["corrupted"] >= 1, summary["outcomes"]
    first = next(o for o in summary["outcomes"] if o["status"] == "corrupted")["deviation"]
    assert first["stage"] == 3 and first["step"] >= 2
