"""torch's JIT build cache: a lock left by a killed build makes every later op load wait forever."""

from __future__ import annotations

import re
import shlex

from mlstack_ds.doctor.jitlocks import describe_age
from mlstack_ds.doctor.model import DoctorInput, Hit, Rule


def stale_jit_lock(inp: DoctorInput) -> Hit | None:
    scan = inp.facts.jit_locks
    stale = scan.stale if scan else ()
    if not scan or not stale:
        return None
    described = "; ".join(f"{lock.path} (op {lock.op}, {describe_age(lock.age_s)} old)" for lock in stale)
    note = f"; {scan.unreadable} process(es) of other users not inspected" if scan.unreadable else ""
    return Hit(f"{described}: no process on this host holds it open or builds in its directory{note}",
               fix=("rm -f " + " ".join(shlex.quote(lock.path) for lock in stale),
                    "if the cache is on a shared file system, first check that no job on another host is "
                    "building that op"))


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-BUILD-006", severity="error", title="A stale torch JIT build lock blocks an op",
        symptom="`deepspeed.initialize` (or any op's first load) hangs after `Using ... as PyTorch extensions "
        "root...`, silently and forever: a killed JIT build left `torch_extensions/<py>_<device>/<op>/lock`, "
        "and torch waits for that file to disappear (`Waited on lock file ...` only where a caller asks "
        "torch to warn).",
        fix=("rm -f <each lock file the finding names>   # only those; the built ops stay",),
        source="pytorch/pytorch#189245 (stale FileBaton lock, permanent deadlock), PR #149382 (the `Waited on "
        "lock file` warning); huggingface/transformers#26015, OpenRLHF/OpenRLHF#208 (DeepSpeed stuck at "
        "`Using ... as PyTorch extensions root`); torch/utils/file_baton.py",
        check=stale_jit_lock,
        log_patterns=(re.compile(r'Waited on lock file "[^"]*" for'),),
    ),
)
