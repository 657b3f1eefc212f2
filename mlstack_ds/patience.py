"""How long the tool waits on anything it started: one value type, one table of its named waits.

Why one table: the waits grew one constant at a time beside each caller (about 20 of them in 15 modules),
some on the stall rule and some on fixed limits, so the same kind of wait was patient in one place and not
in the next: the node probe imported torch under a fixed 150 s while the same probe run here had moved to
the stall rule after a torch import took 111 s at a load of 25. Here every wait is named once, with the
reason for its numbers beside it, and a unit test (tests/unit/test_patience_scan.py) fails when a wait on
a process takes its bound from anywhere else.

The rule (runner.wait_patiently): with `stall_s`, a child is stopped when it made no progress (CPU time,
page faults, reads; or what the caller watches, such as the ranks' result files) for that long, and one
still working is given up to `ceiling_s`. Without `stall_s` the ceiling is a fixed wall-clock bound: only
for waits whose progress cannot be seen here (ssh or srun idle while a node works) or that are short and
cheap anyway. A hung driver or lock uses no CPU and reads nothing, so the stall rule stops it as soon as a
fixed bound would; a slow machine keeps going.

This module imports nothing of the tool: every layer may use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Patience:
    """`ceiling_s`: the most a wait may take in all; `stall_s`: stopped sooner after that long without
    progress (None: a fixed bound, nothing is watched)."""

    ceiling_s: float
    stall_s: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ceiling_s) and self.ceiling_s >= 0):
            raise ValueError(f"ceiling_s {self.ceiling_s!r}: must be a finite number of seconds, 0 or more")
        if self.stall_s is not None and not (math.isfinite(self.stall_s) and self.stall_s > 0):
            raise ValueError(f"stall_s {self.stall_s!r}: must be a positive finite number of seconds")

    @property
    def watched(self) -> bool:
        """Whether the stall rule applies (progress is watched), not only the ceiling."""
        return self.stall_s is not None

    def with_stall(self, stall_s: float) -> Patience:
        """This wait with a user's stall time (`detect --tool-timeout`); the ceiling at least as long."""
        return Patience(ceiling_s=max(self.ceiling_s, stall_s), stall_s=stall_s)

    def describe(self) -> str:
        """For messages and docs: `60 s without progress, 900 s in all` or `150 s`."""
        if self.stall_s is None:
            return f"{self.ceiling_s:g} s"
        return f"{self.stall_s:g} s without progress, {self.ceiling_s:g} s in all"


def stall_rule(stall_s: float, ceiling_s: float) -> Patience:
    """A user's `--timeout`-like option as a Patience: `stall_s` without progress, `ceiling_s` in all."""
    return Patience(ceiling_s=ceiling_s, stall_s=stall_s)


WAITS: MappingProxyType[str, Patience] = MappingProxyType({
    # -- here, in the target interpreter ------------------------------------------------------------------
    # It imports torch: 10 s on a quiet machine, a minute on a cold ROCm install, 111 s measured at a load
    # of 25 (a fixed 120 s killed it there and the tool said "PyTorch is not installed"). A hung driver
    # uses no CPU and reads nothing: stopped after 60 s of that. The quick probe (no torch) and the
    # ds_config helpers (they import DeepSpeed, which imports torch) wait the same way.
    "target probe": Patience(ceiling_s=900.0, stall_s=60.0),
    # rocminfo, amd-smi, rocm-smi, nvidia-smi: a hung driver (the common fault) uses no CPU, so 30 s
    # without progress stops it as the old fixed 30 s did; a slow machine enumerating many GPUs keeps going.
    "rocm tool": Patience(ceiling_s=300.0, stall_s=30.0),
    # `CXX --version` for build.json: a compiler driver that answers at once; stalled means it is hanging.
    "compiler version": Patience(ceiling_s=120.0, stall_s=30.0),
    # `ninja -t deps` in an op's build directory after a build: reads ninja's deps log, well under a second.
    "ninja deps": Patience(ceiling_s=60.0),
    # A rebuild's early compile of a changed source (build/early_compile.py): never waited on. setup.py's
    # ninja for that op waits for it (a lock), and it is stopped when the build ends; this bounds nothing.
    "early compile": Patience(ceiling_s=3600.0),
    # After SIGKILL to a child's whole session: it exits at once; this only bounds reading the last of its
    # pipes (a grandchild that escaped the session could hold them open).
    "reap killed child": Patience(ceiling_s=5.0),
    # `python -m venv --without-pip` (a rehearsal's fake TheRock venv): seconds; stalled means stuck on a file system.
    "make venv": Patience(ceiling_s=600.0, stall_s=60.0),
    # -- pip, git, downloads ------------------------------------------------------------------------------
    # pip in the target: DeepSpeed's requirements, then the wheel; downloads can sit in a socket read
    # (no CPU) for a while, so a fixed bound, long enough for a slow mirror.
    "pip install": Patience(ceiling_s=1800.0),
    # `pip download` of a bundle's wheels (torch for ROCm is several GB).
    "pip download": Patience(ceiling_s=1800.0),
    # `pip wheel` of mlstack-ds itself for a bundle: pure Python, no compile.
    "pip wheel": Patience(ceiling_s=900.0),
    # `pip download --no-deps` of one sdist from PyPI (a source fetch).
    "pip fetch": Patience(ceiling_s=900.0),
    # A DeepSpeed clone over a slow link: the history is a few hundred MB.
    "git clone": Patience(ceiling_s=1800.0),
    # Other git commands on a local checkout (rev-parse, diff, apply, fetch of one tag).
    "git": Patience(ceiling_s=600.0),
    # HTTP (requests' connect and read time-outs, not processes): a server that accepts nothing within
    # 15 s is not there; 60 s without a byte is a dead transfer.
    "http connect": Patience(ceiling_s=15.0),
    "http read": Patience(ceiling_s=60.0),
    # The package index's pages and wheels (index/read.py).
    "index connect": Patience(ceiling_s=10.0),
    "index read": Patience(ceiling_s=60.0),
    # -- on nodes -----------------------------------------------------------------------------------------
    # The node probe (doctor --hostfile/--slurm) imports torch on the node: the local probe's rule (60 s
    # without progress, 900 s in all), watched through the script's heartbeat on stderr (a line each second
    # the probe used CPU or read from disk; ssh and srun themselves sit idle), not the old fixed 150 s that
    # a torch import under load outlasts.
    "node probe": Patience(ceiling_s=900.0, stall_s=60.0),
    # `mlstack-ds detect` on a node: its own probe waits up to 900 s there by the stall rule, its tools up
    # to 300 s; fixed here (ssh is idle), and above those so the node's own patience decides, not ssh's.
    "node detect": Patience(ceiling_s=1500.0),
    # `mlstack-ds install --cached-wheel` on a node: pip there, DeepSpeed's requirements, then the wheel.
    "node install": Patience(ceiling_s=3600.0),
    # `mlstack-ds rollback` on a node: pip puts the previous wheel back.
    "node rollback": Patience(ceiling_s=1800.0),
    # A plain command over ssh (`test -x`, `cat`): ssh's ConnectTimeout (10 s) and the command itself.
    "ssh command": Patience(ceiling_s=60.0),
    # `ssh node hostname` to tell whether a node answers: ConnectTimeout (10 s) and some load.
    "reachable check": Patience(ceiling_s=30.0),
    # The same after a failed launch, to name the nodes lost meanwhile (NodeTransport.lost).
    "lost-node check": Patience(ceiling_s=30.0),
    # scp of a wheel cache entry or a launch directory to a node (hundreds of MB over a slow link).
    "copy to node": Patience(ceiling_s=300.0),
    # scp of a launch's rank files back from a node: small files.
    "copy from node": Patience(ceiling_s=120.0),
    # A stopped node's tool finishes the package swap it is in (pip under load) before it exits.
    "stop grace": Patience(ceiling_s=120.0),
    # One TCP connect from a node to the rendezvous port (doctor --slurm): a listening port answers at once;
    # 10 s without an answer is a firewall dropping packets.
    "rendezvous connect": Patience(ceiling_s=10.0),
    # -- Slurm --------------------------------------------------------------------------------------------
    # scontrol show hostnames, squeue, scancel: the controller answers in a second, tens under load.
    "scontrol": Patience(ceiling_s=60.0),
    "squeue": Patience(ceiling_s=60.0),
    # The per-node pre-launch step: an srun of `ls`, tens of seconds under a load of 15+.
    "srun check step": Patience(ceiling_s=180.0),
    # srun's own teardown after SIGTERM: seconds idle, more under load.
    "srun terminate grace": Patience(ceiling_s=30.0),
    # Until squeue no longer lists a cancelled step (KillWait 30 s by default, and load).
    "srun step gone": Patience(ceiling_s=120.0),
    # The same for a step whose node went silent: squeue lists it until slurmctld marks that node down
    # (minutes), so only the cancel is sent and the tasks on nodes that answer get their KillWait.
    "srun silent step gone": Patience(ceiling_s=15.0),
    # How long a node's task may print nothing at all, its heartbeat included (cluster/heartbeat.py, a line
    # every 5 s), before its node is taken for lost: a dozen beats missed, not one late under load.
    "silent node": Patience(ceiling_s=60.0),
})


# The defaults of the users' `--timeout` options, which the commands turn into a Patience in one place each
# (verify/suite.py `launch_bounds`, bench/run.py `stage_patience`): how long a launch may go with no rank
# reporting. verify: a check's engine build on a loaded node stays silent for minutes (the workers write
# beats while importing); bench: a stage's warm-up on a large model is one long silent step.
VERIFY_TIMEOUT_S = 300.0
BENCH_TIMEOUT_S = 600.0


def wait(name: str) -> Patience:
    """The table's entry `name`; KeyError names the known ones (a typo in the tool, not a user's input)."""
    try:
        return WAITS[name]
    except KeyError:
        raise KeyError(f"no wait named {name!r} in patience.WAITS (known: {', '.join(WAITS)})") from None
