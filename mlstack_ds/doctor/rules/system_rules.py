"""Host limits and platform settings that break multi-rank runs: /dev/shm, memlock, IOMMU, numactl."""

from __future__ import annotations

import re
import shlex

from mlstack_ds.doctor.model import DoctorInput, Hit, Rule
from mlstack_ds.doctor.rules.common import amd_gpus, rocm_target
from mlstack_ds.doctor.shmsegments import describe_size

MIN_SHM_BYTES = 512 * 1024**2  # DeepSpeed's own ds_report threshold (deepspeed/env_report.py)
MIN_MEMLOCK_BYTES = 1024**3
_MIB = 1024**2


def shm_too_small(inp: DoctorInput) -> Hit | None:
    size = inp.facts.shm_bytes
    if size is None or size >= MIN_SHM_BYTES:
        return None
    return Hit(f"/dev/shm is {size / _MIB:.0f} MiB (DeepSpeed warns below {MIN_SHM_BYTES // _MIB} MiB)")


def memlock_too_low(inp: DoctorInput) -> Hit | None:
    limit = inp.facts.memlock_soft_bytes
    gpu_target = rocm_target(inp) or (inp.env.torch is not None and inp.env.torch.cuda is not None)
    if limit is None or limit >= MIN_MEMLOCK_BYTES or not gpu_target:
        return None
    return Hit(f"ulimit -l is {limit // 1024} KiB")


def leaked_shm_segments(inp: DoctorInput) -> Hit | None:
    scan = inp.facts.shm_segments
    leaked = scan.leaked if scan else ()
    if not scan or not leaked:
        return None
    total = sum(s.size for s in leaked)
    in_use = len(scan.segments) - len(leaked)
    notes = [f"{in_use} more in use or not inspectable, left alone"] if in_use else []
    if scan.unreadable and any(s.busy is None for s in leaked):  # the kernel could not vouch for them
        notes.append(f"judged from /proc alone; {scan.unreadable} process(es) could not be inspected")
    note = f" ({'; '.join(notes)})" if notes else ""
    return Hit(f"{len(leaked)} DeepSpeed all-reduce segment(s) in {scan.shm_dir}, {describe_size(total)} of "
               f"shared memory, mapped or held open by no process{note}: "
               + ", ".join(s.path.rsplit("/", 1)[-1] for s in leaked),
               fix=("rm -f " + " ".join(shlex.quote(s.path) for s in leaked),
                    "run it while no DeepSpeed job is starting on this host (a rank may be about to open "
                    "one of these names)"))


def numactl_missing(inp: DoctorInput) -> Hit | None:
    """DeepSpeed's launcher runs `numactl` only with --bind_cores_to_rank, which the CPU accelerator's
    documentation recommends; on other platforms nobody asks for it."""
    if inp.env.platform != "cpu" or inp.facts.tools.get("numactl"):
        return None
    return Hit("numactl is not on PATH: `deepspeed --bind_cores_to_rank` (recommended for DeepSpeed on CPU) "
               "cannot start its ranks", severity="info")


def iommu_not_passthrough(inp: DoctorInput) -> Hit | None:
    discrete = [g for g in amd_gpus(inp) if not g.integrated]
    cmdline = inp.facts.kernel_cmdline
    if len(discrete) < 2 or cmdline is None or inp.facts.iommu_enabled is False:
        return None
    if re.search(r"(^|\s)(amd_)?iommu=(pt|off)(\s|$)", cmdline):
        return None
    radeon = [g for g in discrete if g.family.startswith("RDNA")]
    fix = ['add iommu=pt to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, run update-grub, reboot',
           "export HSA_FORCE_FINE_GRAIN_PCIE=1",
           "check with rccl-tests: all_reduce_perf -b 8 -e 128M -f 2 -g <number of GPUs>"]
    if radeon:
        fix.append("Radeon cards often lack PCIe peer-to-peer: if RCCL still hangs, "
                   "export NCCL_P2P_DISABLE=1")
    state = "enabled" if inp.facts.iommu_enabled else "state unknown"
    return Hit(f"{len(discrete)} discrete GPUs ({', '.join(g.arch for g in discrete)}); IOMMU {state}; "
               "kernel command line has no iommu=pt", fix=tuple(fix))


RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-SYS-001", severity="warning", title="/dev/shm is too small for multi-rank runs",
        symptom="Containers default to a 64 MB /dev/shm; NCCL/RCCL and DataLoader workers fail or hang "
        "(`/dev/shm size might be too small`), or die with `Bus error` when a shared-memory page cannot be "
        "backed.",
        fix=("docker run --shm-size=16g ...   # or --ipc=host",
             "on a host: mount -o remount,size=16G /dev/shm"),
        source="DeepSpeed's ds_report shm check (deepspeed/env_report.py); F22/F23 multi-rank hangs; "
        "msr-fiddle/pipedream#28 (`Unexpected bus error encountered in worker`), sgl-project/sglang#38638 "
        "(`Bus error (core dumped)` from a full /dev/shm), NVIDIA/nccl#342",
        check=shm_too_small,
        log_patterns=(re.compile(r"/dev/shm size might be too small"), re.compile(r"Bus error\b"),
                      re.compile(r"bus error encountered in worker"),
                      re.compile(r"Error while creating shared memory segment")),
    ),
    Rule(
        id="MLS-SYS-002", severity="warning", title="Low locked-memory limit (ulimit -l)",
        symptom="Pinned host memory (RCCL's InfiniBand/RoCE transports, offload buffers) cannot be "
        "locked: registration errors or silent fallback to slow paths.",
        fix=("ulimit -l unlimited   # for the shell that launches training",
             "docker run --ulimit memlock=-1 ...",
             "/etc/security/limits.conf: * soft memlock unlimited / * hard memlock unlimited"),
        source="issue #7 (pinned memory; no catalogue entry quotes a memlock failure)",
        check=memlock_too_low,
    ),
    Rule(
        id="MLS-SYS-003", severity="warning", title="Leaked DeepSpeed shared-memory segments in /dev/shm",
        symptom="`/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>` files, 66 MiB each, stay "
        "after the job: on the CPU accelerator every rank started with LOCAL_SIZE set (DeepSpeed's launcher) "
        "creates one and nothing removes it. They hold RAM (tmpfs) until removed; each new MASTER_PORT or rank "
        "count adds more.",
        fix=("rm -f <each segment the finding names>   # only those no process maps or holds open",),
        source="DeepSpeed 0.19.5 csrc/cpu/comm/shm.cpp (shm_initialize, shared_create; shared_close's "
        "shm_unlink is never called) and shm_interface.cpp (LOCAL_SIZE); reproduced here with a 2-rank "
        "`deepspeed` run (tests/fixtures/doctor-shm/SOURCES.md); research note clients-on-cpu.md "
        "(36 piled up)",
        check=leaked_shm_segments,
    ),
    Rule(
        id="MLS-SYS-004", severity="error", title="numactl is missing (deepspeed --bind_cores_to_rank)",
        symptom="`deepspeed --bind_cores_to_rank` prints `please install the numactl package with apt` and "
        "dies with `FileNotFoundError: [Errno 2] No such file or directory: 'numactl'` before any rank starts.",
        fix=("sudo apt-get install numactl   # Debian/Ubuntu",
             "sudo dnf install numactl   # Fedora/RHEL",
             "or launch without --bind_cores_to_rank"),
        source="DeepSpeed 0.19.5 deepspeed/utils/numa.py (get_numactl_cmd, check_for_numactl_pkg) and "
        "launcher/launch.py; reproduced here (tests/fixtures/doctor-logs/SOURCES.md)",
        check=numactl_missing,
        log_patterns=(re.compile(r"No such file or directory: 'numactl'"),
                      re.compile(r"please install the numactl package")),
        severity_note="info on a CPU machine without numactl (nothing fails until the flag is used); error "
        "when a log shows the failed launch",
    ),
    Rule(
        id="MLS-NET-001", severity="warning", title="Multi-GPU host without iommu=pt",
        symptom="RCCL collectives hang or time out (`NCCL WARN Missing \"iommu=pt\" from kernel command "
        "line which can lead to system instablity or hang!`, watchdog timeouts).",
        fix=("add iommu=pt to the kernel command line and reboot",
             "export HSA_FORCE_FINE_GRAIN_PCIE=1",
             "Radeon without PCIe P2P: export NCCL_P2P_DISABLE=1 (diagnostic)"),
        source="F22 (ROCm/rccl#1129, ROCm/rccl#1026, ROCm/vllm#390), F23",
        check=iommu_not_passthrough,
        log_patterns=(re.compile(r'Missing "iommu=pt"'),),
    ),
    Rule(
        id="MLS-NET-002", severity="error", title="NCCL/RCCL failed with `unhandled system error`",
        symptom="`NCCL error ... unhandled system error` (ncclSystemError) at the first collective, usually "
        "`deepspeed.initialize`'s broadcast: a system call failed, most often creating its /dev/shm segment "
        "in a container (64 MB default), sometimes a socket or the network interface.",
        fix=("docker run --shm-size=16g ...   # or --ipc=host",
             "NCCL_DEBUG=INFO deepspeed ...   # the line before the error names the failed call",
             "if it is a socket: export NCCL_SOCKET_IFNAME=<the interface the ranks share>"),
        source="huggingface/transformers#11658 (DeepSpeed, 'No space left on device'), NVIDIA/nccl#473 (fixed "
        "by --ipc=host), ROCm/rccl#328 (the same error from RCCL), deepspeedai/DeepSpeed#4002 (--shm-size)",
        log_patterns=(re.compile(r"unhandled system error"),),
    ),
)
