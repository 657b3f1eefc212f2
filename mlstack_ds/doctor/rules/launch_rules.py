"""How ranks are started and how they end: failures a run log shows around the launcher."""

from __future__ import annotations

import re

from mlstack_ds.doctor.model import Rule

# MLS-LOG-010's explanation and fix; the evidence for the cause (core backtraces, counts per variant) is
# docs/abort-at-exit.md.
ABORT_AT_EXIT_EXPLANATION = (
    "`terminate called without an active exception`, often followed by torchrun's `Signal 6 (SIGABRT)` "
    "summary (exit code -6): the process aborted at interpreter exit, after its work. The cause is torch's "
    "gloo worker thread releasing a finished collective while CPython 3.11 shuts down (it needs the GIL "
    "inside a noexcept destructor), not DeepSpeed: docs/abort-at-exit.md. Results written before the abort "
    "(checkpoints, logs, saved models) are complete, but the launcher reports the run as failed."
)
ABORT_AT_EXIT_FIX = (
    "end the script with torch.distributed.destroy_process_group() (HF Trainer: "
    "trainer.accelerator.end_training()), then re-run",
)

_PORT_RE = re.compile(r"port: (\d+)|:(\d+) \(errno: 98")


def port_in_use_fix(line: str) -> tuple[str, ...]:
    """The fix for the port the log line names (torch prints it as `port: N` or `[::]:N (errno: 98`)."""
    match = _PORT_RE.search(line)
    port = next((g for g in match.groups() if g), None) if match else None
    held = port or "<port>"
    return (f"ss -ltnp 'sport = :{held}'   # which process listens on port {held}; stop it if it is a "
            "leftover run",
            "or use another port: deepspeed --master_port 29501 ... / torchrun --master_port 29501 ... / "
            "export MASTER_PORT=29501   # any port no process listens on",
            "single-node torchrun: leave --master_port out (or use --standalone); it then picks a free port")


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-DS-007", severity="error", title="A DeepSpeed script was started without a launcher",
        symptom="`ModuleNotFoundError: No module named 'mpi4py'` from `deepspeed.init_distributed()` "
        "(`mpi_discovery`): without RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK in the "
        "environment (`python script.py`, or `accelerate launch` without `--use_deepspeed`) DeepSpeed "
        "assumes an MPI job and imports mpi4py.",
        fix=("deepspeed --num_accelerators <N> script.py   # or: torchrun --nproc_per_node <N> script.py",
             "a single process: RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "
             "python script.py",
             "only when the job really is started by mpirun: pip install mpi4py",
             "under `deepspeed --launcher slurm` (its `srun -n N ... python -u script.py` sets no RANK): see "
             "MLS-SLURM-005; inside an allocation, `mlstack-ds verify --slurm` shows the launch that works"),
        source="DeepSpeed 0.19.5 deepspeed/comm/comm.py (init_distributed, mpi_discovery); reproduced here "
        "(tests/fixtures/doctor-logs/SOURCES.md: a plain script, and `deepspeed --launcher slurm` in salloc); "
        "research note clients-on-cpu.md (launchers)",
        log_patterns=(re.compile(r"No module named 'mpi4py'"),),
    ),
    Rule(
        id="MLS-NET-003", severity="error", title="The rendezvous port is already in use (EADDRINUSE)",
        symptom="`torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, ... name: EADDRINUSE` (older torch: `failed to bind to "
        "[::]:29500 (errno: 98 - Address already in use)`): another process, often an earlier run that did "
        "not exit, listens on the port rank 0's TCPStore needs. DeepSpeed's launcher uses 29500 unless given "
        "--master_port, and so does a multi-node torchrun (torch 2.13's single-node torchrun picks a free port).",
        fix=port_in_use_fix(""),
        source="torch c10d TCPStore (socket.cpp); reproduced here with port 29500 held "
        "(tests/fixtures/doctor-logs/SOURCES.md); vllm-project/vllm#39015, showlab/Tune-A-Video#90 "
        "(older wording); research note clients-on-cpu.md",
        log_patterns=(re.compile(r"The server socket has failed to (listen on any local network address\..*"
                                 r"EADDRINUSE|bind to \S+:\d+ \(errno: 98)"),),
        log_fix=port_in_use_fix,
    ),
    Rule(
        id="MLS-LOG-010", severity="warning", title="The process aborted at exit after its work (SIGABRT)",
        symptom=ABORT_AT_EXIT_EXPLANATION,
        fix=ABORT_AT_EXIT_FIX,
        source="research note clients-on-cpu.md (2 of the first 3 ZeRO-2 Trainer runs, CPU, gloo); "
        "the text is libstdc++'s verbose terminate handler (libsupc++/vterminate.cc; in libstdc++.so.6.0.30 "
        "here), printed when std::terminate runs with no exception in flight",
        log_patterns=(re.compile(r"terminate called without an active exception"),),
    ),
)
