"""The GPU check: on any ROCm or CUDA machine, from a checkout and a directory of wheels, with no network,
install the tool, run detect, doctor, install, verify, a short bench and the `gpu` tests, and write one
report (report.json, report.md, logs.tar.gz) into --out.

Why a script and not a command of the tool: it runs before the tool is installed (it installs it), with
the target interpreter, so its own code uses the standard library only. Every step is a subprocess of its
own (no shell) with a time limit taken from one budget, so the whole run fits a fixed slot on a borrowed
machine; the report is rewritten after every step, so a run killed at the slot's end still leaves one.

Exit codes: 0 every step passed, 2 usage, 3 no GPU visible (nothing installed), 8 a step or check failed.
Wrapper: scripts/gpu_check.sh; wheels: scripts/gpu_wheels.sh. See docs/verify.md, "On a GPU machine".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

EXIT_OK, EXIT_USAGE, EXIT_NO_GPU, EXIT_FAILED = 0, 2, 3, 8
SCHEMA = 1
REPO = Path(__file__).resolve().parents[1]
PART_BYTES = 15 * 2**20  # what comes back from the device: files of at most 16 MiB
MAX_OUT_FILES = 8  # and at most 8 of them
MAX_OUT_BYTES = 64 * 2**20  # 64 MiB in all
REPORT_ROOM = 16 * 2**20  # kept for report.json, report.md and logs.tar.gz (a few MiB of logs at most)
REPORT_FILES = ("report.json", "report.md", "logs.tar.gz")
PART_PREFIX = "wheel.part"
LOG_TAIL_BYTES = 4 * 2**20  # per log in logs.tar.gz
TAIL_CHARS = 3000  # per step in report.json
NO_DEEPSPEED_ENV = "MLSTACK_GPU_CHECK_NO_DEEPSPEED"  # tests/gpu/conftest.py: why the DeepSpeed tests skip

# Each step's own limit in seconds; a step gets the smaller of it and what the budget has left.
LIMITS = {"tool": 150, "clients": 120, "detect": 60, "doctor": 90, "install": 360, "verify": 210, "bench": 150,
          "pytest": 150, "build-bench": 240, "keep-wheel": 90}
BUILD_BENCH_MIN_S = 90.0  # less than this left: the build comparison is skipped (two builds need more)
RESERVE_S = 10.0  # kept back from the budget for writing the report

PROBE = r"""
import json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import torch
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
else:
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["hip"] = getattr(torch.version, "hip", None)
    out["available"] = bool(torch.cuda.is_available())
    out["gpus"] = []
    if out["available"]:
        for index in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(index)
            out["gpus"].append({"index": index, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                "gfx": getattr(p, "gcnArchName", "") or None,
                                "memory_gib": round(p.total_memory / 2**30, 1)})
print(json.dumps(out))
"""


# After the clients step's install: their versions, and what pip check says of the environment (printed
# only: an image's torch can list requirements it does not hold, which is the image's business).
CLIENTS_PROBE = r"""
import subprocess, sys
import accelerate, lightning, peft, transformers
print(f"transformers {transformers.__version__}, accelerate {accelerate.__version__}, peft {peft.__version__}, "
      f"lightning {lightning.__version__}")
check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
print(f"pip check (exit {check.returncode}):\n{check.stdout[-3000:]}{check.stderr[-1000:]}")
"""


class UsageProblem(Exception):
    """A bad command line: one `error:` line, one `hint:` line, exit 2."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


class Interrupted(Exception):
    """SIGTERM or SIGINT (the slot ended): stop, keep what was measured, write the report."""


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is the project's one error line and one hint line, not usage text."""

    def error(self, message: str) -> NoReturn:
        raise UsageProblem(message, "scripts/gpu_check.sh --help")


@dataclass
class Step:
    """One step's record: what ran, for how long, how it ended and why."""

    name: str
    title: str
    argv: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exit_code: int | None = None
    verdict: str = "skipped"  # pass | fail | skipped
    reason: str = ""
    limit_s: float = 0.0
    log: str = ""
    tail: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass
class Options:
    python: str
    wheels: Path
    out: Path
    pin: str
    bench_model: str
    bench_stages: str
    bench_steps: int
    skip_pytest: bool
    keep_wheel: bool
    skip_build_bench: bool
    wheel: Path | None
    cache_dir: Path | None
    budget_s: float
    allow_cpu: bool = False  # rehearse every step on a machine without a GPU (the CPU platform)


# ---------------------------------------------------------------------------------------------------------
# The report (pure: records in, documents out; tests/unit/test_gpu_check.py builds them from made-up steps)


def summarize_verify(document: Mapping[str, Any]) -> dict[str, Any]:
    """verify's --json document reduced to its counts and one row per check (reason only where not a pass)."""
    checks = [{"name": c.get("name"), "status": c.get("status"), "seconds": round(float(c.get("duration_s") or 0), 1),
               "reason": c.get("reason") or ""} for c in document.get("checks") or []]
    counts = document.get("counts") or {s: sum(1 for c in checks if c["status"] == s) for s in ("pass", "fail", "skip")}
    error = (document.get("error") or {}).get("message") if isinstance(document.get("error"), dict) else None
    return {"counts": dict(counts), "world_size": document.get("world_size"), "ok": document.get("ok"),
            "seconds": document.get("duration_s"), "checks": checks, **({"error": error} if error else {})}


def summarize_bench(document: Mapping[str, Any]) -> dict[str, Any]:
    """bench's --json document reduced to one row per run: throughput, TFLOP/s and peak memory."""
    runs = []
    for run in document.get("runs") or []:
        peaks = [p for p in run.get("peak_memory_bytes") or [] if p is not None]
        rate = run.get("samples_per_s") or {}
        runs.append({"world_size": run.get("world_size"), "stage": run.get("stage"), "status": run.get("status"),
                     "reason": run.get("reason") or "", "samples_per_s": rate.get("median"),
                     "tokens_per_s": run.get("tokens_per_s"), "tflops": run.get("model_tflops_per_s"),
                     "peak_gb": max(peaks) / 1e9 if peaks else None, "memory_kind": run.get("peak_memory_kind"),
                     "precision": run.get("precision"), "seconds": run.get("duration_s")})
    return {"spec": dict(document.get("spec") or {}), "runs": runs, "ok": document.get("ok")}


def summarize_build_bench(document: Mapping[str, Any]) -> dict[str, Any]:
    """`bench.py build`'s --json document reduced to the op set, each step's wall and CPU seconds and whether
    it finished, the ratios and whether the two wheels agree."""
    steps = {name: {"wall": r.get("wall"), "cpu": round(float(r.get("user") or 0) + float(r.get("system") or 0), 1),
                    "finished": bool(r.get("finished"))} for name, r in (document.get("seconds") or {}).items()}
    op_set = document.get("op_set") or {}
    return {"ops": list(document.get("ops") or []), "of": list(op_set.get("of") or []), "cut": op_set.get("cut"),
            "why": op_set.get("reason"), "steps": steps, "cold_over_hand": document.get("cold_over_hand"),
            "cpu_cold_over_hand": document.get("cpu_cold_over_hand"), "same": document.get("same_ops_and_symbols")}


def build_bench_reason(summary: Mapping[str, Any]) -> str:
    """One line: which ops (and of how many), each step's wall, the ratios, whether the wheels agree."""
    ops, of = summary.get("ops") or [], summary.get("of") or []
    text = f"ops {','.join(ops)}" + (f" ({len(ops)} of {len(of)}: cut to fit the cap)" if summary.get("cut") else "")
    for name, step in (summary.get("steps") or {}).items():
        text += f"; {name} {step['wall']} s" + ("" if step["finished"] else " (not finished)")
    if summary.get("cold_over_hand") is not None:
        text += f"; ours/hand: wall {summary['cold_over_hand']}x, CPU {summary['cpu_cold_over_hand']}x"
    if summary.get("same") is not None:
        text += "; same ops and symbols" if summary["same"] else "; the wheels DIFFER"
    return text


def verify_reason(summary: Mapping[str, Any]) -> str:
    counts = summary.get("counts") or {}
    failed = [c["name"] for c in summary.get("checks") or [] if c["status"] == "fail"]
    text = f"{counts.get('pass', 0)} pass, {counts.get('fail', 0)} fail, {counts.get('skip', 0)} skip"
    return text + (f"; failed: {', '.join(failed)}" if failed else "")


def bench_reason(summary: Mapping[str, Any]) -> str:
    parts = []
    for run in summary.get("runs") or []:
        label = f"{run['stage']}@{run['world_size']}"
        if run["status"] == "ok" and run["samples_per_s"] is not None:
            parts.append(f"{label} {run['samples_per_s']:.1f} samples/s")
        else:
            parts.append(f"{label} {run['status']}" + (f" ({run['reason']})" if run["reason"] else ""))
    return "; ".join(parts)


def build_report(machine: Mapping[str, Any], steps: Sequence[Step], *, options: Mapping[str, Any], started: float,
                 finished: float, exit_code: int, verdict: str, note: str = "") -> dict[str, Any]:
    """The one document of a run: the machine, every step with its time and verdict, verify's checks and the
    bench numbers lifted out of their steps for reading."""
    summaries = {s.name: s.summary or None for s in steps}
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(finished - started, 1),
        "verdict": verdict,
        "exit_code": exit_code,
        "note": note,
        "options": dict(options),
        "machine": dict(machine),
        "steps": [asdict(s) for s in steps],
        "verify": summaries.get("verify"),
        "bench": summaries.get("bench"),
        "wheel": summaries.get("keep-wheel"),
    }


def _cell(value: object) -> str:
    """A markdown table cell: one line, pipes escaped."""
    text = "" if value is None else str(value)
    return " ".join(text.split()).replace("|", "\\|")


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def machine_line(machine: Mapping[str, Any]) -> str:
    gpus = machine.get("gpus") or []
    names = sorted({g["name"] for g in gpus})
    arch = sorted({g.get("gfx") or f"sm_{str(g.get('capability', '')).replace('.', '')}" for g in gpus})
    memory = sorted({g.get("memory_gib") for g in gpus if g.get("memory_gib") is not None})
    parts = [f"{len(gpus)} x {', '.join(names)} ({', '.join(arch)}, {', '.join(f'{m} GiB' for m in memory)})"
             if gpus else "no GPU visible"]
    if machine.get("driver"):
        parts.append(f"driver {machine['driver']}")
    if machine.get("hip"):
        parts.append(f"HIP {machine['hip']}")
    elif machine.get("cuda"):
        parts.append(f"CUDA {machine['cuda']}")
    if machine.get("compiler"):
        parts.append(str(machine["compiler"]))
    parts.append(f"torch {machine.get('torch') or '-'}")
    parts.append(f"Python {machine.get('python') or '-'}")
    parts.append(f"{machine.get('cores')} cores, {_number(machine.get('memory_gib'))} GiB")
    return "; ".join(parts)


def render_markdown(report: Mapping[str, Any]) -> str:
    """report.md: the machine, a table of steps, verify's per-check table and the bench numbers."""
    lines = [f"# GPU check: {report['verdict'].upper()} (exit {report['exit_code']})", "",
             f"{report['date']}, {report['seconds']:.0f} s in all. {machine_line(report['machine'])}."]
    if report.get("note"):
        lines += ["", _cell(report["note"])]
    lines += ["", "| step | seconds | exit | verdict | note |", "|---|---|---|---|---|"]
    for step in report["steps"]:
        code = "-" if step["exit_code"] is None else step["exit_code"]
        lines.append(f"| {step['title']} | {step['seconds']:.0f} | {code} | {step['verdict']} "
                     f"| {_cell(step['reason'])} |")
    verify = report.get("verify")
    if verify and verify.get("checks"):
        counts = verify.get("counts") or {}
        lines += ["", f"## verify ({counts.get('pass', 0)} pass, {counts.get('fail', 0)} fail, "
                      f"{counts.get('skip', 0)} skip; world size {verify.get('world_size')})", "",
                  "| check | status | seconds | reason |", "|---|---|---|---|"]
        lines += [f"| {c['name']} | {c['status']} | {c['seconds']:.1f} | {_cell(c['reason'])} |"
                  for c in verify["checks"]]
    bench = report.get("bench")
    if bench and bench.get("runs"):
        spec = bench.get("spec") or {}
        model = spec.get("model")
        name = model.get("name") if isinstance(model, dict) else model
        lines += ["", f"## bench ({_cell(name)}, micro-batch {spec.get('micro_batch')}, "
                      f"seq {spec.get('seq_len')}, {spec.get('steps')} timed steps)", "",
                  "| world size | stage | status | samples/s | tokens/s | model TFLOP/s | peak memory GB | seconds |",
                  "|---|---|---|---|---|---|---|---|"]
        for run in bench["runs"]:
            status = run["status"] + (f": {run['reason']}" if run["reason"] else "")
            lines.append(f"| {run['world_size']} | {run['stage']} | {_cell(status)} | {_number(run['samples_per_s'])} "
                         f"| {_number(run['tokens_per_s'], 0)} | {_number(run['tflops'])} "
                         f"| {_number(run['peak_gb'], 2)} | {_number(run['seconds'], 0)} |")
    failing = [s for s in report["steps"] if s["verdict"] == "fail" and s.get("tail")]
    for step in failing:
        lines += ["", f"## {step['title']}: the end of its output", "", "```", step["tail"][-1500:].rstrip(), "```"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Running steps


class Clock:
    """One budget for the whole run: each step's limit is its own or what is left, whichever is smaller."""

    def __init__(self, budget_s: float, *, capped: bool = True) -> None:
        self.started = time.time()
        self.budget_s = budget_s
        self.capped = capped  # False: a rehearsal on a CPU box, which has no slot to fit, only the budget

    def elapsed(self) -> float:
        return time.time() - self.started

    def limit(self, name: str) -> float:
        left = self.budget_s - RESERVE_S - self.elapsed()
        return min(LIMITS[name], left) if self.capped else left


def say(clock: Clock, text: str) -> None:
    print(f"gpu_check [{clock.elapsed():6.1f} s] {text}", flush=True)


def _tail(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - limit))
        return handle.read().decode("utf-8", "replace")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End the step's whole process group: SIGTERM first (the tool then ends what it started), SIGKILL after."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
            return


def run_commands(step: Step, commands: Sequence[list[str]], *, env: Mapping[str, str], cwd: Path, logs: Path,
                 clock: Clock) -> str:
    """Run the step's commands one after another (each must exit 0 for the next to start), stdout of the last
    returned, stdout and stderr of each to logs/<step>.log. Sets the step's time, exit code and tail."""
    step.limit_s = clock.limit(step.name)
    if step.limit_s < 5:
        step.reason = "skipped: the time budget is spent"
        return ""
    log = logs / f"{step.name}.log"
    step.log = log.name
    started = time.monotonic()
    stdout = b""
    say(clock, f"start {step.title} (limit {step.limit_s:.0f} s)")
    with log.open("ab") as sink:
        for argv in commands:
            step.argv = argv
            sink.write(f"$ {' '.join(argv)}\n".encode())
            sink.flush()
            left = step.limit_s - (time.monotonic() - started)
            out_path = logs / f"{step.name}.stdout"
            with out_path.open("wb") as out:
                process = subprocess.Popen(argv, stdout=out, stderr=sink, stdin=subprocess.DEVNULL, cwd=cwd,
                                           env=dict(env), start_new_session=True)
                try:
                    step.exit_code = process.wait(timeout=max(left, 1))
                except subprocess.TimeoutExpired:
                    _stop(process)
                    step.exit_code = process.returncode
                    step.reason = f"timed out after {step.limit_s:.0f} s (killed)"
                except BaseException:
                    _stop(process)
                    raise
            stdout = out_path.read_bytes()
            sink.write(b"--- stdout ---\n" + stdout[-LOG_TAIL_BYTES:] + b"\n")
            out_path.unlink()
            if step.exit_code != 0 or step.reason:
                break
    step.seconds = round(time.monotonic() - started, 1)
    step.tail = _tail(log, TAIL_CHARS)
    step.verdict = "pass" if step.exit_code == 0 and not step.reason else "fail"
    if step.verdict == "fail" and not step.reason:
        step.reason = f"exit {step.exit_code}: {last_line(step.tail)}"
    return stdout.decode("utf-8", "replace")


def last_line(text: str) -> str:
    """The most telling line of a failure's output: the tool's `error:` line, else the last non-empty one."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("--- stdout")]
    errors = [line for line in lines if line.startswith(("error:", "ERROR:", "E ")) or "Error" in line]
    return (errors or lines or [""])[-1][:300]


def json_document(text: str) -> dict[str, Any] | None:
    """The one JSON document a `--json` command printed (None when it printed none)."""
    text = text.strip()
    start = text.find("{")
    if start < 0:
        return None
    try:
        document = json.loads(text[start:])
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def skip(step: Step, reason: str) -> Step:
    step.verdict, step.reason = "skipped", reason
    return step


# ---------------------------------------------------------------------------------------------------------
# The machine


def _first_line(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[0] if done.returncode == 0 and lines else None


def _compiler() -> str | None:
    """nvcc's or hipcc's version, from PATH or CUDA_HOME/ROCM_PATH (the ops are compiled with it)."""
    for name, home in (("nvcc", "CUDA_HOME"), ("hipcc", "ROCM_PATH")):
        found = shutil.which(name) or shutil.which(name, path=str(Path(os.environ.get(home) or "/nonexistent") / "bin"))
        if found is None:
            continue
        try:
            done = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return f"{name} (version unreadable)"
        version = re.search(r"(?:release [\d.]+, V|HIP version: )([\w.\-]+)", done.stdout)
        return f"{name} {version.group(1) if version else '(version unreadable)'}"
    return None


def _meminfo_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def probe_machine(python: str) -> dict[str, Any]:
    """The machine as the target interpreter's torch sees it, plus what the host says (driver, compiler)."""
    machine: dict[str, Any] = {"host": platform.node(), "kernel": platform.release(), "arch": platform.machine(),
                               "cores": os.cpu_count(), "cpu": _cpu_model(), "memory_gib": _meminfo_gib(),
                               "target_python": python}
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        machine["torch_error"] = f"{python} could not be run: {exc}"
        return machine
    probed = json_document(done.stdout)
    if done.returncode != 0 or probed is None:
        machine["torch_error"] = f"{python} -c <probe> exited {done.returncode}: {last_line(done.stderr)}"
        return machine
    machine.update(probed)
    nvidia = _first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    amdgpu = Path("/sys/module/amdgpu/version")
    machine["driver"] = nvidia or (amdgpu.read_text().strip() if amdgpu.is_file() else None)
    machine["compiler"] = _compiler()
    machine["env"] = {k: os.environ.get(k) for k in ("TORCH_CUDA_ARCH_LIST", "PYTORCH_ROCM_ARCH", "CXX", "CUDA_HOME",
                                                     "ROCM_PATH", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
    return machine


def no_gpu_reason(machine: Mapping[str, Any]) -> str | None:
    """Why this machine cannot be checked (None: it has a GPU that torch sees)."""
    if machine.get("torch_error"):
        return f"torch cannot be imported by {machine['target_python']} ({machine['torch_error']})"
    if not machine.get("available") or not machine.get("gpus"):
        return (f"no GPU visible to {machine['target_python']}: torch {machine.get('torch')} answers "
                "torch.cuda.is_available() = False")
    return None


# ---------------------------------------------------------------------------------------------------------
# Wheels in and out


def wheel_names(wheels: Path) -> tuple[Path, list[str]]:
    """The tool's wheel in the directory, and the project names of every other wheel there."""
    tools = sorted(wheels.glob("mlstack_ds-*.whl"), key=lambda p: p.stat().st_mtime)
    if not tools:
        raise UsageProblem(f"no mlstack_ds-*.whl in {wheels}", f"fill it on a networked machine: scripts/gpu_wheels.sh "
                           f"{wheels}")
    names = sorted({p.name.split("-")[0] for p in wheels.glob("*.whl")} - {"mlstack_ds", "deepspeed"}
                   - set(client_names()))
    return tools[-1], names


def client_pins() -> list[str]:
    """requirements/clients.txt's pins (transformers, accelerate, peft, lightning)."""
    lines = (REPO / "requirements" / "clients.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# Requirements of the clients that a GPU image may lack or hold too old, which gpu_wheels.sh adds and the clients
# step installs beside them, from those very files: regex (transformers 5.23 needs >= 2025.10.22), and Lightning's
# own three (the image's torch brings the rest).
CLIENT_REQUIREMENT_WHEELS = ("regex", "lightning_utilities", "torchmetrics", "pytorch_lightning")


def client_names() -> list[str]:
    """The wheel names the clients step installs (and the tool step leaves alone): the pinned clients and
    CLIENT_REQUIREMENT_WHEELS."""
    pinned = [re.split(r"[=<>!~ ]", pin, maxsplit=1)[0].replace("-", "_") for pin in client_pins()]
    return pinned + list(CLIENT_REQUIREMENT_WHEELS)


def client_requirement_wheels(wheels: Path) -> list[str]:
    """The newest file of each CLIENT_REQUIREMENT_WHEELS name in the directory, as paths: a path makes pip put
    that version in even where the image holds an older one."""
    found = []
    for name in CLIENT_REQUIREMENT_WHEELS:
        files = sorted(wheels.glob(f"{name}-*.whl"), key=lambda p: p.stat().st_mtime)
        found += [str(files[-1])] if files else []
    return found


def split_file(source: Path, out: Path, *, part_bytes: int = PART_BYTES, max_parts: int) -> list[str]:
    """Copy `source` into out/wheel.part00, part01... of at most `part_bytes` each (the device returns files
    of at most 16 MiB). Refuses (ValueError) rather than write more than `max_parts`."""
    size = source.stat().st_size
    count = max(1, -(-size // part_bytes))
    if count > max_parts:
        raise ValueError(f"{size / 2**20:.1f} MiB needs {count} parts of {part_bytes / 2**20:.0f} MiB; "
                         f"only {max_parts} more files can come back")
    names = []
    with source.open("rb") as handle:
        for index in range(count):
            name = f"{PART_PREFIX}{index:02d}"
            (out / name).write_bytes(handle.read(part_bytes))
            names.append(name)
    return names


def joined_parts(first: Path) -> list[Path]:
    """wheel.part00 and its siblings in order (a file not named like a part is its own list)."""
    match = re.fullmatch(re.escape(PART_PREFIX) + r"(\d+)", first.name)
    if not match:
        return [first]
    parts = sorted(first.parent.glob(f"{PART_PREFIX}[0-9]*"), key=lambda p: int(p.name[len(PART_PREFIX):]))
    expected = [f"{PART_PREFIX}{i:02d}" for i in range(len(parts))]
    if [p.name for p in parts] != expected:
        raise UsageProblem(f"the parts beside {first} are not {expected[0]}..{expected[-1]} without a gap: "
                           f"{[p.name for p in parts]}", "copy every part of the --keep-wheel run")
    return parts


def unpack_wheel_index(source: Path, dest: Path) -> Path:
    """The wheel index a --keep-wheel run saved (a directory, its tarball, or the tarball's parts) as a
    directory that `install --index` reads."""
    if source.is_dir():
        return source
    dest.parent.mkdir(parents=True, exist_ok=True)
    tarball = dest.parent / "wheel-index.tar"
    with tarball.open("wb") as out:
        for part in joined_parts(source):
            with part.open("rb") as handle:
                shutil.copyfileobj(handle, out)
    try:
        with tarfile.open(tarball) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(dest, filter="data")
            else:  # Python 3.10/3.11 before the filters: refuse what could leave dest
                for member in archive.getmembers():
                    if member.name.startswith("/") or ".." in Path(member.name).parts or not (member.isfile()
                                                                                           or member.isdir()):
                        raise tarfile.TarError(f"unsafe member {member.name}")
                archive.extractall(dest)
    except (tarfile.TarError, OSError) as exc:
        raise UsageProblem(f"--wheel {source}: not a wheel index saved by --keep-wheel ({exc})",
                           "pass wheel.part00 (its siblings beside it), the joined tarball or the index directory"
                           ) from exc
    if not (dest / "simple").is_dir():
        raise UsageProblem(f"--wheel {source}: the archive holds no simple/ index",
                           "pass what a --keep-wheel run wrote (wheel.part00...)")
    return dest


# ---------------------------------------------------------------------------------------------------------
# The run


def tool(python: str, *args: str) -> list[str]:
    return [python, "-m", "mlstack_ds", *args]


def pytest_counts(text: str) -> dict[str, int]:
    """pytest's last summary line (`1 passed, 2 skipped in 3.1s`) as counts."""
    counts: dict[str, int] = {}
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)", text):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(number)
    return counts


class Run:
    """One GPU check: the options, the clock, the steps so far, and where files go."""

    def __init__(self, options: Options, work: Path) -> None:
        self.options = options
        self.clock = Clock(options.budget_s, capped=not options.allow_cpu)
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir()
        self.steps: list[Step] = []
        self.machine: dict[str, Any] = {}
        self.note = ""
        self.finished = False  # until then the report's verdict is "running" (a killed run says so)
        self.parts: list[str] = []
        self.env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(options.wheels),
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore", "PYTHONUNBUFFERED": "1",
                    "NO_COLOR": "1"}

    def step(self, name: str, title: str) -> Step:
        made = Step(name, title)
        self.steps.append(made)
        return made

    def exec(self, step: Step, *commands: list[str], cwd: Path | None = None,
             env: Mapping[str, str] | None = None) -> str:
        stdout = run_commands(step, commands, env=env or self.env, cwd=cwd or self.work, logs=self.logs,
                              clock=self.clock)
        if step.verdict != "skipped":
            say(self.clock, f"end {step.title}: {step.verdict} in {step.seconds:.0f} s"
                            + (f" ({step.reason})" if step.reason else ""))
        else:
            say(self.clock, f"skip {step.title}: {step.reason}")
        self.write()
        return stdout

    def skip(self, step: Step, reason: str) -> Step:
        say(self.clock, f"skip {step.title}: {reason}")
        return skip(step, reason)

    def tool_step(self, step: Step, *args: str) -> dict[str, Any] | None:
        """Run `mlstack-ds ARGS --json` as the step; its document, and the tool's own error message as the
        reason when it failed with one."""
        document = json_document(self.exec(step, tool(self.options.python, *args)))
        error = document.get("error") if document else None
        if step.verdict == "fail" and isinstance(error, dict) and not step.reason.startswith("timed out"):
            step.reason = f"exit {step.exit_code}: {error.get('message')}"
        return document

    def verdict(self) -> tuple[str, int]:
        if no_gpu_reason(self.machine) is not None and not (self.options.allow_cpu and self.steps
                                                             and self.steps[0].verdict != "skipped"):
            return "no-gpu", EXIT_NO_GPU
        if not self.finished:
            return "running", EXIT_FAILED
        if self.steps and all(s.verdict != "fail" for s in self.steps) and any(s.passed for s in self.steps):
            return "pass", EXIT_OK
        return "fail", EXIT_FAILED

    def report(self) -> dict[str, Any]:
        verdict, code = self.verdict()
        options = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.options).items()}
        return build_report(self.machine, self.steps, options=options, started=self.clock.started,
                            finished=time.time(), exit_code=code, verdict=verdict, note=self.note)

    def write(self) -> None:
        """report.json, report.md and logs.tar.gz, rewritten after every step (a killed run leaves them)."""
        out = self.options.out
        report = self.report()
        _atomic(out / "report.json", json.dumps(report, indent=2).encode() + b"\n")
        _atomic(out / "report.md", render_markdown(report).encode())
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
            for log in sorted(self.logs.iterdir()):
                data = _tail(log, LOG_TAIL_BYTES).encode()
                info = tarfile.TarInfo(f"logs/{log.name}")
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
        _atomic(out / "logs.tar.gz", buffer.getvalue())

    def main(self) -> int:
        options = self.options
        say(self.clock, f"GPU check of {options.python}, wheels {options.wheels}, budget {options.budget_s:.0f} s")
        self.machine = probe_machine(options.python)
        reason = no_gpu_reason(self.machine)
        if reason is not None and options.allow_cpu and not self.machine.get("torch_error"):
            self.note = f"a rehearsal without a GPU (--allow-cpu): {reason}"
            say(self.clock, self.note)
        elif reason is not None:
            self.note = f"{reason}; nothing was installed"
            print(f"gpu_check: {self.note}", file=sys.stderr, flush=True)
            for name, title in STEP_TITLES:
                skip(self.step(name, title), "no GPU visible")
            self.finished = True
            self.write()
            return EXIT_NO_GPU
        gpus = self.machine.get("gpus") or []
        say(self.clock, f"machine: {machine_line(self.machine)}")
        self.install_tool()
        tool_ok = self.steps[-1].passed
        self.install_clients(tool_ok)
        for name, args in (("detect", ("detect", "--json")), ("doctor", ("doctor", "--json"))):
            step = self.step(name, name)
            if not tool_ok:
                self.skip(step, "the tool did not install")
                continue
            document = self.tool_step(step, *args)
            if document is not None and "error" not in document:
                step.summary = summarize_doctor(document) if name == "doctor" else summarize_detect(document)
                if name == "doctor" and step.verdict == "fail" and step.summary.get("errors"):
                    step.reason = "doctor found errors: " + "; ".join(step.summary["errors"])
        installed = self.install_deepspeed(tool_ok)
        self.verify(installed, len(gpus))
        self.bench(installed)
        self.pytest(installed, tool_ok)
        self.build_bench(tool_ok)
        self.keep_wheel(installed)
        self.finished = True
        self.write()
        verdict, code = self.verdict()
        failed = [s.name for s in self.steps if s.verdict == "fail"]
        say(self.clock, f"done: {verdict}" + (f" (failed: {', '.join(failed)})" if failed else "")
            + f"; report in {options.out}")
        return code

    def install_tool(self) -> None:
        options = self.options
        step = self.step("tool", "tool install (offline)")
        wheel, names = wheel_names(options.wheels)
        constraints = self.work / "constraints.txt"
        constraints.write_text(f"torch=={self.machine['torch']}\n")
        pip = [options.python, "-m", "pip", "install", "-c", str(constraints)]
        self.exec(step, [*pip, str(wheel), *names], [*pip, "--no-deps", "--force-reinstall", str(wheel)])
        step.summary = {"wheel": wheel.name, "also": names}
        stale = stale_files(wheel)
        if stale:
            step.summary["stale"] = stale
            self.note = (f"the tool's wheel {wheel.name} differs from this checkout in {len(stale)} file(s) "
                         f"({', '.join(stale[:5])}): rebuild it with scripts/gpu_wheels.sh")

    def install_clients(self, tool_ok: bool) -> None:
        """The client libraries verify's client checks run, at the project's pins (requirements/clients.txt): what
        the README's main command does with --with-clients. An image's own transformers may be one a DeepSpeed
        release breaks (issue 40: 5.17 with 0.19.5). Installed without their requirements, which a GPU image
        holds: on the H100 image pip's resolver rejected the image's own torch as soon as accelerate (torch>=2.0)
        had to be resolved, even with a constraint naming that torch (ResolutionImpossible); `pip check`'s view
        of the environment goes into the log."""
        step = self.step("clients", "clients (requirements/clients.txt)")
        if not tool_ok:
            self.skip(step, "the tool did not install")
            return
        python = self.options.python
        pins = client_pins()
        self.exec(step, [python, "-m", "pip", "install", "--no-deps", *pins,
                         *client_requirement_wheels(self.options.wheels)],
                  [python, "-c", CLIENTS_PROBE])
        step.summary = {"pins": pins}
        if step.passed:
            step.reason = "installed " + ", ".join(pins)

    def install_deepspeed(self, tool_ok: bool) -> Step:
        options = self.options
        step = self.step("install", "DeepSpeed install (build the ops)" if options.wheel is None
                         else "DeepSpeed install (the kept wheel)")
        if not tool_ok:
            return self.skip(step, "the tool did not install")
        sdist = options.wheels / f"deepspeed-{options.pin}.tar.gz"
        args = ["install", "--recipe", options.pin, "--no-verify", "--json"]
        if sdist.is_file():
            args += ["--source", str(sdist)]
        if options.cache_dir is not None:
            args += ["--cache-dir", str(options.cache_dir)]
        if options.wheel is not None:
            index = unpack_wheel_index(options.wheel, self.work / "wheel-index")
            args += ["--index", str(index), "--index-only"]
        document = self.tool_step(step, *args)
        self.keep_build_logs(step)
        if document is not None and "error" not in document:
            plan, receipt = document.get("plan") or {}, document.get("receipt") or {}
            step.summary = {"action": document.get("action"), "ops": plan.get("built_ops"),
                            "archs": plan.get("archs"), "wheel": receipt.get("wheel"),
                            "cache_key": receipt.get("cache_key") or plan.get("cache_key"),
                            "deepspeed": receipt.get("deepspeed_version")}
        if step.passed:
            archs = step.summary.get("archs") or []
            step.reason = f"{step.summary.get('action')}: ops {', '.join(step.summary.get('ops') or []) or 'none'}" \
                          + (f"; targets {', '.join(archs)}" if archs else "")
        return step

    def keep_build_logs(self, step: Step) -> None:
        """The build log the install names (its ops' compiler output) into logs.tar.gz, tail only."""
        if not step.log:
            return
        named = re.findall(r"(/[^\s()'\"]+\.log)\b", (self.logs / step.log).read_text("utf-8", "replace"))
        for index, path in enumerate(dict.fromkeys(named)):
            found = Path(path)
            if found.is_file() and index < 5:
                (self.logs / f"{step.name}-build-{index}.log").write_text(_tail(found, LOG_TAIL_BYTES))

    def verify(self, installed: Step, world_size: int) -> None:
        step = self.step("verify", f"verify (world size {world_size or 'default'})")
        if not installed.passed:
            self.skip(step, f"DeepSpeed did not install ({installed.reason or installed.verdict})")
            return
        timeout = max(30, int(min(LIMITS["verify"], self.clock.limit("verify")) - 30))
        size = ["--world-size", str(world_size)] if world_size else []  # none: the tool's own (2 on CPU)
        document = self.tool_step(step, "verify", *size, "--json", "--timeout", str(timeout))
        if document is not None and document.get("checks") is not None:
            step.summary = summarize_verify(document)
            if not step.reason.startswith("timed out"):
                step.reason = verify_reason(step.summary)

    def bench(self, installed: Step) -> None:
        options = self.options
        step = self.step("bench", f"bench ({options.bench_model}, {options.bench_stages})")
        if not installed.passed:
            self.skip(step, f"DeepSpeed did not install ({installed.reason or installed.verdict})")
            return
        stages = max(1, len(options.bench_stages.split(",")))
        stage_timeout = max(30, int((min(LIMITS["bench"], self.clock.limit("bench")) - 15) / stages))
        document = self.tool_step(step, "bench", "--model", options.bench_model, "--stages", options.bench_stages,
                                  "--steps", str(options.bench_steps), "--warmup", "1", "--world-size", "1", "--json",
                                  "--timeout", str(stage_timeout))
        if document is not None and document.get("runs") is not None:
            step.summary = summarize_bench(document)
            if not step.reason.startswith("timed out"):
                step.reason = bench_reason(step.summary)

    def pytest(self, installed: Step, tool_ok: bool) -> None:
        step = self.step("pytest", "pytest -m gpu tests/gpu")
        if self.options.skip_pytest:
            self.skip(step, "--skip-pytest")
            return
        if not tool_ok:  # the tests import the checkout's mlstack_ds, which needs the tool's requirements
            self.skip(step, "the tool did not install")
            return
        env = dict(self.env)
        if not installed.passed:
            env[NO_DEEPSPEED_ENV] = f"DeepSpeed did not install ({installed.reason or installed.verdict})"
        stdout = self.exec(step, [self.options.python, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rsP",
                                  "-p", "no:cacheprovider"], cwd=REPO, env=env)
        step.summary = pytest_counts(stdout.splitlines()[-1] if stdout.strip() else "")
        if step.exit_code == 5:
            skip(step, "no test carries the gpu marker")
        elif not step.reason.startswith("timed out") and step.summary:
            step.reason = ", ".join(f"{n} {w}" for w, n in step.summary.items())

    def build_bench(self, tool_ok: bool) -> None:
        """Our build against DeepSpeed's documented hand build, same ops, one run (scripts/bench_build.py),
        capped at what the step may take: the op set is cut to what the hand build can finish."""
        options = self.options
        step = self.step("build-bench", "build: ours against the hand build")
        sdist = options.wheels / f"deepspeed-{options.pin}.tar.gz"
        if options.skip_build_bench:
            self.skip(step, "--skip-build-bench")
            return
        if not tool_ok:
            self.skip(step, "the tool did not install")
            return
        if not sdist.is_file():
            self.skip(step, f"no {sdist.name} in --wheels (the hand build builds the sdist)")
            return
        cap = self.clock.limit("build-bench") - 15  # kept for the bench to stop its steps and write its result
        if cap < BUILD_BENCH_MIN_S:
            self.skip(step, f"skipped: {max(cap, 0):.0f} s left, two builds need {BUILD_BENCH_MIN_S:.0f}")
            return
        result = self.work / "build-bench.json"
        self.exec(step, build_bench_command(options.python, sdist, cap, result))
        document = json_document(result.read_text()) if result.is_file() else None
        if document is not None:
            step.summary = summarize_build_bench(document)
            if not step.reason.startswith("timed out"):
                step.reason = build_bench_reason(step.summary)

    def keep_wheel(self, installed: Step) -> None:
        options = self.options
        step = self.step("keep-wheel", "keep the wheel (--keep-wheel)")
        if not options.keep_wheel:
            self.skip(step, "not asked (--keep-wheel)")
            return
        built = installed.summary.get("wheel") or installed.summary.get("cache_key")
        if not installed.passed or not built:
            self.skip(step, "DeepSpeed did not install: no wheel to keep")
            return
        index = self.work / "kept-index"
        args = ["publish", str(built), "--to", str(index), "--json"]
        if options.cache_dir is not None:
            args += ["--cache-dir", str(options.cache_dir)]
        self.tool_step(step, *args)
        if not step.passed:
            return
        tarball = self.work / "wheel-index.tar"
        with tarfile.open(tarball, "w") as archive:
            archive.add(index, arcname=".")
        try:
            self.parts = split_file(tarball, options.out, max_parts=min(MAX_OUT_FILES - len(REPORT_FILES),
                                                                         (MAX_OUT_BYTES - REPORT_ROOM) // PART_BYTES))
        except ValueError as exc:  # a convenience, not a check: too big to bring back is not a failure
            step.verdict, step.reason = "skipped", f"not kept: {exc}"
            return
        step.summary = {"parts": self.parts, "bytes": tarball.stat().st_size, "wheel": Path(str(built)).name}
        step.reason = f"{tarball.stat().st_size / 2**20:.1f} MiB in {len(self.parts)} part(s): " \
                      f"--wheel {options.out / self.parts[0]} installs it"


STEP_TITLES = (("tool", "tool install (offline)"), ("clients", "clients (requirements/clients.txt)"),
               ("detect", "detect"), ("doctor", "doctor"),
               ("install", "DeepSpeed install"), ("verify", "verify"), ("bench", "bench"),
               ("pytest", "pytest -m gpu tests/gpu"), ("build-bench", "build: ours against the hand build"),
               ("keep-wheel", "keep the wheel"))


def build_bench_command(python: str, sdist: Path, cap_s: float, result: Path) -> list[str]:
    """`bench.py build` with the target interpreter (its torch, nothing installed into it), offline."""
    return [python, str(REPO / "scripts" / "bench.py"), "build", "--python", python, "--sdist", str(sdist),
            "--time-cap", f"{cap_s:.0f}", "--json-out", str(result)]


def summarize_detect(document: Mapping[str, Any]) -> dict[str, Any]:
    torch = document.get("torch") or {}
    return {"platform": document.get("platform"), "gpus": len(document.get("gpus") or []),
            "torch": torch.get("version"), "arch_list": torch.get("arch_list"),
            "warnings": list(document.get("warnings") or [])[:10]}


def summarize_doctor(document: Mapping[str, Any]) -> dict[str, Any]:
    findings = document.get("findings") or []
    by = {s: [f"{f.get('rule_id')}: {f.get('title')}" for f in findings if f.get("severity") == s]
          for s in ("error", "warning", "info")}
    return {"errors": by["error"], "warnings": by["warning"], "infos": by["info"]}


def stale_files(wheel: Path) -> list[str]:
    """The checkout's mlstack_ds/*.py files that the wheel holds differently or not at all: a wheel built
    before the latest edits tests old code (a warning in the report, not a failure)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            held = {n: archive.read(n) for n in archive.namelist() if n.startswith("mlstack_ds/") and n.endswith(".py")}
    except (OSError, zipfile.BadZipFile):
        return ["(unreadable wheel)"]
    package = REPO / "mlstack_ds"
    if not package.is_dir():
        return []
    return sorted(p.relative_to(REPO).as_posix() for p in package.rglob("*.py")
                  if held.get(p.relative_to(REPO).as_posix()) != p.read_bytes())


def _atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def parse(argv: Sequence[str]) -> Options:
    parser = Parser(prog="scripts/gpu_check.sh", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter, epilog="Exit codes: 0 every step passed, "
                    "2 usage, 3 no GPU visible (nothing installed), 8 a step or check failed.")
    parser.add_argument("--wheels", required=True, type=Path, metavar="DIR",
                        help="wheels and the DeepSpeed sdist (scripts/gpu_wheels.sh DIR)")
    parser.add_argument("--out", type=Path, default=Path("gpu-check-out"), metavar="DIR",
                        help="where report.json, report.md, logs.tar.gz (and wheel.partNN) go")
    parser.add_argument("--python", default=sys.executable, metavar="PY", help="the target interpreter (with torch)")
    parser.add_argument("--pin", default="0.19.5", help="the DeepSpeed recipe's version")
    parser.add_argument("--bench-model", default="350m", help="bench --model")
    parser.add_argument("--bench-stages", default="ddp,3", help="bench --stages")
    parser.add_argument("--bench-steps", type=int, default=3, help="bench --steps (timed steps per stage)")
    parser.add_argument("--skip-pytest", action="store_true", help="leave out pytest -m gpu tests/gpu")
    parser.add_argument("--skip-build-bench", action="store_true",
                        help="leave out the build comparison (scripts/bench.py build, ours against the hand build)")
    parser.add_argument("--keep-wheel", action="store_true",
                        help="save the built DeepSpeed wheel (its index, from publish) as OUT/wheel.partNN")
    parser.add_argument("--wheel", type=Path, metavar="FILE",
                        help="install what --keep-wheel saved (wheel.part00, the joined tarball or the directory) "
                             "instead of building")
    parser.add_argument("--cache-dir", type=Path, metavar="DIR", help="the tool's cache (default: its own)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="rehearse on a machine without a GPU (the CPU platform) instead of exit 3")
    parser.add_argument("--budget", type=float, default=540.0, metavar="SECONDS",
                        help="the whole run's time, every step's limit taken from it (default 540)")
    args = parser.parse_args(argv)
    wheels = args.wheels.resolve()
    if not wheels.is_dir():
        raise UsageProblem(f"--wheels {args.wheels}: no such directory",
                           f"fill one on a networked machine: scripts/gpu_wheels.sh {args.wheels}")
    wheel_names(wheels)  # the tool's wheel is there, or a usage error before anything runs
    python = shutil.which(args.python) or args.python
    if not os.access(python, os.X_OK) or Path(python).is_dir():
        raise UsageProblem(f"--python {args.python}: not an executable interpreter", "e.g. --python python3")
    if args.budget < 60:
        raise UsageProblem(f"--budget {args.budget:g}: too short for anything", "e.g. --budget 540 (seconds)")
    if args.bench_steps < 1:
        raise UsageProblem(f"--bench-steps {args.bench_steps}: must be at least 1", "e.g. --bench-steps 3")
    if args.wheel is not None and not args.wheel.exists():
        raise UsageProblem(f"--wheel {args.wheel}: no such file", "pass wheel.part00 of a --keep-wheel run")
    if args.wheel is None and not (wheels / f"deepspeed-{args.pin}.tar.gz").is_file():
        raise UsageProblem(f"no deepspeed-{args.pin}.tar.gz in {wheels}",
                           f"fill it on a networked machine: scripts/gpu_wheels.sh {args.wheels} --pin {args.pin}")
    out = args.out.resolve()
    if out.exists() and not out.is_dir():
        raise UsageProblem(f"--out {args.out}: not a directory", "name a directory (made if absent)")
    return Options(python=python, wheels=wheels, out=out, pin=args.pin, bench_model=args.bench_model,
                   bench_stages=args.bench_stages, bench_steps=args.bench_steps, skip_pytest=args.skip_pytest,
                   skip_build_bench=args.skip_build_bench, keep_wheel=args.keep_wheel,
                   wheel=args.wheel.resolve() if args.wheel else None,
                   cache_dir=args.cache_dir.resolve() if args.cache_dir else None, budget_s=args.budget,
                   allow_cpu=args.allow_cpu)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGTERM (the slot's end) and SIGINT raise Interrupted, so the report is written with what finished."""
    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous: dict[int, Callable[..., Any] | int | None] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
        options.out.mkdir(parents=True, exist_ok=True)
        stale = [p for p in options.out.iterdir() if p.name.startswith(PART_PREFIX)]
        for part in stale:  # parts of an earlier run would be taken for this run's
            part.unlink()
    except UsageProblem as problem:
        print(f"error: {problem}", file=sys.stderr)
        print(f"hint: {problem.hint}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: --out: {exc}", file=sys.stderr)
        print("hint: name a directory you can write", file=sys.stderr)
        return EXIT_USAGE
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        run = Run(options, Path(work))
        try:
            with interrupts_raise():
                return run.main()
        except UsageProblem as problem:  # found late (a --wheel archive): still a report
            run.note = f"{problem} ({problem.hint})"
            print(f"error: {problem}", file=sys.stderr)
            print(f"hint: {problem.hint}", file=sys.stderr)
            run.write()
            return EXIT_USAGE
        except Interrupted as stop:
            run.note = f"interrupted by {stop} after {run.clock.elapsed():.0f} s; the steps after it did not run"
            print(f"gpu_check: {run.note}", file=sys.stderr, flush=True)
            run.write()
            return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
