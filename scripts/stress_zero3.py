#!/usr/bin/env python3
"""Count how often DeepSpeed ZeRO-3 corrupts the loss on two CPU ranks.

DeepSpeed 0.19.5 waits on only the last async all-gather when it re-gathers persistent ZeRO-3
parameters; on gloo the other gathers may still be running, and the next forward reads half-written
buffers (research: docs/patches.md, 0001). The race shows only in some launches, so this script makes
N independent two-rank launches and compares every step's loss with a plain `torch.optim.Adam` copy
of the same model trained beside it in the same process. A run is *corrupted* when any step's loss
is non-finite or differs from the reference by more than `atol + rtol * |reference|`.

    scripts/stress_zero3.py --runs 60 --python /tmp/ds-venv/bin/python [--deepspeed-tree DIR] [--json]

The parent needs only the standard library and this checkout's `mlstack_ds.runner` (its patience rule:
a launch is stopped when its processes have done nothing for `--stall` seconds, a hang, or at `--timeout`;
a loaded machine makes launches slow, not stopped); each launch runs
`PYTHON -m torch.distributed.run --nproc-per-node 2` on this file in `--worker` mode (gloo,
`DS_ACCELERATOR=cpu`), so PYTHON needs torch and DeepSpeed (installed, or a source tree given with
`--deepspeed-tree`, which goes first on PYTHONPATH). `--stages 1,2,3` makes one engine per listed
stage, one after another, in the same process (to test whether engines in one process are safe).

Exit status: 0 all runs clean, 1 some run corrupted, 3 some launch failed or timed out (no verdict),
2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _repo import REPO  # noqa: F401  (this checkout's mlstack_ds importable)

from mlstack_ds.errors import ToolTimedOut
from mlstack_ds.patience import Patience
from mlstack_ds.runner import wait_patiently

WORLD_SIZE = 2
EXIT_CLEAN, EXIT_CORRUPTED, EXIT_USAGE, EXIT_LAUNCH_FAILED = 0, 1, 2, 3
# Healthy fp32 runs agree with the reference to ~1e-6 relative (gradients are averaged over two
# ranks that saw the same batch); corrupted ones are NaN, 1e7 spikes or off by 10-50 %.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-5


# ----------------------------------------------------------------------------------------------
# Worker: runs inside each rank (needs torch + deepspeed)
# ----------------------------------------------------------------------------------------------


def _zero_config(stage: int, zero_options: dict[str, object]) -> dict[str, object]:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        # torch_adam: the same torch.optim.Adam as the reference, no op build needed.
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True, "adam_w_mode": False}},
        "zero_optimization": {"stage": stage, **zero_options},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def run_worker(args: argparse.Namespace) -> None:
    """Train one engine per stage in args.stages beside a plain Adam reference; write the losses."""
    import copy  # noqa: PLC0415

    import deepspeed  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    if args.skip_shm_op:
        # shm_comm only serves inference_all_reduce, never training; from a source tree it would be
        # JIT-compiled (~100 s on 2 cores) before the first step. Through sys.modules: the attribute
        # `deepspeed.comm.torch` is the real torch package (deepspeed/comm/__init__ star-imports it).
        import importlib  # noqa: PLC0415

        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    zero_options = json.loads(args.zero_options)
    engines = []
    for index, stage in enumerate(args.stages):
        started = time.monotonic()
        torch.manual_seed(args.seed + index)
        model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
        reference = copy.deepcopy(model)  # before DeepSpeed partitions the original in place
        reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-3)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=_zero_config(stage, zero_options))
        # Every rank draws the same global batch; with --batches distinct each trains on its own slice
        # and the reference on all of it (the mean of the ranks' gradients is the global gradient).
        batches = torch.Generator().manual_seed(1000 + args.seed + index)
        ranks = torch.distributed.get_world_size() if args.batches == "distinct" else 1
        local = slice(4 * rank, 4 * rank + 4) if args.batches == "distinct" else slice(0, 4)
        ds_losses: list[float] = []
        ref_losses: list[float] = []
        for _ in range(args.steps):
            all_inputs = torch.randn(4 * ranks, 128, generator=batches)
            all_targets = torch.randn(4 * ranks, 128, generator=batches)
            inputs, targets = all_inputs[local], all_targets[local]
            loss = torch.nn.functional.mse_loss(engine(inputs), targets)
            engine.backward(loss)
            engine.step()
            ds_losses.append(loss.item())
            with torch.no_grad():
                ref_losses.append(torch.nn.functional.mse_loss(reference(inputs), targets).item())
            reference_optimizer.zero_grad()
            torch.nn.functional.mse_loss(reference(all_inputs), all_targets).backward()
            reference_optimizer.step()
        engine.destroy()
        del engine
        engines.append({"stage": stage, "ds_losses": ds_losses, "ref_losses": ref_losses,
                        "seconds": round(time.monotonic() - started, 3)})
    result = {"rank": rank, "deepspeed_version": deepspeed.__version__,
              "deepspeed_file": deepspeed.__file__, "engines": engines}
    Path(args.result_dir, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # Leave without finalization: a gloo worker can still race it and abort the rank (`terminate called
    # without an active exception`, docs/abort-at-exit.md) even after destroy_process_group(), as a probe did
    # under load; one launch in CI ended with a bare ChildFailedError after both ranks had written results.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------------------------
# Parent: launches, compares, counts (standard library only)
# ----------------------------------------------------------------------------------------------


@dataclass
class Deviation:
    """The first step (1-based) at which one engine's loss left the reference."""

    rank: int
    engine: int
    stage: int
    step: int
    loss: float | str
    reference: float


@dataclass
class RunOutcome:
    index: int
    status: str  # "ok" | "corrupted" | "failed"
    seconds: float
    deviation: Deviation | None = None
    detail: str = ""
    engine_seconds: list[float] = field(default_factory=list)
    corrupted_engines: list[int] = field(default_factory=list)


def first_deviation(ds_losses: list[float], ref_losses: list[float], rtol: float,
                    atol: float) -> tuple[int, float] | None:
    """(step, loss) of the first non-finite or out-of-tolerance loss, steps counted from 1."""
    for step, (loss, ref) in enumerate(zip(ds_losses, ref_losses, strict=True), start=1):
        if not math.isfinite(loss) or abs(loss - ref) > atol + rtol * abs(ref):
            return step, loss
    return None


def deviations(results: list[dict], rtol: float, atol: float) -> list[Deviation]:
    """The first deviation of every engine on every rank, earliest engine and step first."""
    found: list[Deviation] = []
    for result in results:
        for engine_index, engine in enumerate(result["engines"]):
            hit = first_deviation(engine["ds_losses"], engine["ref_losses"], rtol, atol)
            if hit is not None:
                step, loss = hit
                shown: float | str = loss if math.isfinite(loss) else repr(loss)
                found.append(Deviation(result["rank"], engine_index, engine["stage"], step, shown,
                                       engine["ref_losses"][step - 1]))
    return sorted(found, key=lambda d: (d.engine, d.step, d.rank))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(deepspeed_tree: Path | None) -> dict[str, str]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if deepspeed_tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(deepspeed_tree), os.environ.get("PYTHONPATH", "")) if p)
    return env


def descendants(pid: int) -> list[int]:
    """All live descendants of pid (Linux /proc), children first found first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        kids = children.get(pending.pop(), [])
        found.extend(kids)
        pending.extend(kids)
    return found


def kill_launch(proc: subprocess.Popen[str]) -> None:
    """Kill torchrun and its ranks; torchrun starts each rank in a session of its own, so killing
    the launcher's process group alone would leave the ranks running."""
    victims = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def launch_once(index: int, args: argparse.Namespace) -> RunOutcome:
    """One two-rank launch; the whole process group is killed if it outlives args.timeout."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stress-zero3-") as result_dir:
        argv = [args.python, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD_SIZE),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                str(Path(__file__).resolve()), "--worker", "--result-dir", result_dir,
                "--stages", ",".join(map(str, args.stages)), "--steps", str(args.steps),
                "--seed", str(args.seed), "--zero-options", json.dumps(args.zero_options),
                "--batches", args.batches]
        if args.skip_shm_op:
            argv.append("--skip-shm-op")
        proc = subprocess.Popen(argv, env=worker_env(args.deepspeed_tree), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = wait_patiently(proc, lambda seconds: proc.communicate(timeout=seconds), tuple(argv),
                                       started=started, patience=Patience(args.timeout, args.stall))
        except ToolTimedOut as exc:
            kill_launch(proc)
            output, _ = proc.communicate()
            return RunOutcome(index, "failed", time.monotonic() - started,
                              detail=f"{exc.message}; launcher and ranks killed")
        seconds = time.monotonic() - started
        files = sorted(Path(result_dir).glob("rank*.json"))
        if proc.returncode != 0 or len(files) != WORLD_SIZE:
            # what says which rank died and how (torchrun's "exitcode : -6", "Signal 6 (SIGABRT)", libstdc++'s
            # "terminate called ..."), else the last error lines: a bare ChildFailedError says neither
            why = [line.strip() for line in output.splitlines()
                   if any(mark in line for mark in ("exitcode", "Signal ", "terminate called", "Traceback"))]
            errors = [line for line in output.splitlines() if "Error" in line or "error" in line]
            tail = " | ".join(why[-6:] + (errors or output.strip().splitlines())[-3:])
            return RunOutcome(index, "failed", seconds,
                              detail=f"launcher exit {proc.returncode}, {len(files)} result files: {tail}")
        results = [json.loads(f.read_text()) for f in files]
    found = deviations(results, args.rtol, args.atol)
    engine_seconds = [e["seconds"] for e in results[0]["engines"]]
    origin = f"deepspeed {results[0]['deepspeed_version'].strip()} from {results[0]['deepspeed_file']}"
    return RunOutcome(index, "corrupted" if found else "ok", seconds, found[0] if found else None,
                      detail=origin, engine_seconds=engine_seconds,
                      corrupted_engines=sorted({d.engine for d in found}))


def describe(outcome: RunOutcome) -> str:
    line = f"run {outcome.index + 1:3d}: {outcome.status:9s} {outcome.seconds:6.1f}s"
    if outcome.deviation is not None:
        d = outcome.deviation
        line += (f"  engine {d.engine} (ZeRO-{d.stage}) rank {d.rank} step {d.step}: "
                 f"loss {d.loss} vs reference {d.reference:.6f}")
        if len(outcome.corrupted_engines) > 1:
            line += f"; corrupted engines {outcome.corrupted_engines}"
    elif outcome.status == "failed":
        line += f"  {outcome.detail}"
    return line


def summarise(outcomes: list[RunOutcome], args: argparse.Namespace) -> dict[str, object]:
    judged = [o for o in outcomes if o.status != "failed"]
    corrupted = [o for o in judged if o.status == "corrupted"]
    return {
        "runs": len(outcomes),
        "judged": len(judged),
        "corrupted": len(corrupted),
        "failed": len(outcomes) - len(judged),
        "corrupted_rate": (len(corrupted) / len(judged)) if judged else None,
        "engines_per_run": len(args.stages),
        "corrupted_engines": sum(len(o.corrupted_engines) for o in judged),
        "stages": args.stages,
        "steps": args.steps,
        "zero_options": args.zero_options,
        "batches": args.batches,
        "rtol": args.rtol,
        "atol": args.atol,
        "python": args.python,
        "deepspeed_tree": str(args.deepspeed_tree) if args.deepspeed_tree else None,
        "skip_shm_op": args.skip_shm_op,
        "deepspeed": next((o.detail for o in judged), None),
        "mean_launch_seconds": (sum(o.seconds for o in judged) / len(judged)) if judged else None,
        "outcomes": [asdict(o) for o in outcomes],
    }


def parse_zero_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (VALUE as JSON), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"VALUE of {key} is not JSON: {value!r}") from exc


def parse_stages(text: str) -> list[int]:
    try:
        stages = [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected e.g. 3 or 1,2,3, got {text!r}") from exc
    if not stages or any(s not in (1, 2, 3) for s in stages):
        raise argparse.ArgumentTypeError(f"stages must be 1, 2 or 3, got {text!r}")
    return stages


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="independent two-rank launches (default 20)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter with torch + deepspeed for the ranks (default: this one)")
    parser.add_argument("--deepspeed-tree", type=Path, default=None,
                        help="DeepSpeed source tree to import instead of the installed one (via PYTHONPATH)")
    parser.add_argument("--stages", type=parse_stages, default=[3],
                        help="ZeRO stage per engine, made one after another in one process (default 3)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per engine (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", choices=("same", "distinct"), default="same",
                        help="same batch on every rank (default, as in the research) or a slice each "
                             "(also catches a skipped gradient all-reduce)")
    parser.add_argument("--zero-option", dest="zero_option_list", type=parse_zero_option, action="append",
                        default=[], metavar="KEY=JSON",
                        help="extra zero_optimization entry, e.g. contiguous_gradients=false (repeatable)")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL)
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL)
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds per launch before it is killed, however busy (default 1800)")
    parser.add_argument("--stall", type=float, default=120.0,
                        help="seconds a launch may do nothing (no CPU time, page faults or reads in any of its "
                             "processes: a hang) before it is killed (default 120)")
    parser.add_argument("--stop-after-corrupted", type=int, default=0, metavar="K",
                        help="stop once K runs were corrupted (0: never)")
    parser.add_argument("--skip-shm-op", action="store_true",
                        help="skip DeepSpeed's shm_comm op (inference only; saves its JIT build from a tree)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    # worker mode (used by the launcher, not by people)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-dir", help=argparse.SUPPRESS)
    parser.add_argument("--zero-options", default="{}", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return EXIT_CLEAN
    if args.runs < 1 or args.steps < 1 or args.timeout <= 0 or args.stall <= 0:
        parser.error("--runs, --steps, --timeout and --stall must be positive")
    if args.deepspeed_tree is not None and not (args.deepspeed_tree / "deepspeed" / "__init__.py").is_file():
        parser.error(f"--deepspeed-tree {args.deepspeed_tree} has no deepspeed/__init__.py")
    args.zero_options = dict(args.zero_option_list)
    outcomes: list[RunOutcome] = []
    for index in range(args.runs):
        outcome = launch_once(index, args)
        outcomes.append(outcome)
        if not args.json:
            print(describe(outcome), flush=True)
        corrupted = sum(o.status == "corrupted" for o in outcomes)
        if args.stop_after_corrupted and corrupted >= args.stop_after_corrupted:
            break
    summary = summarise(outcomes, args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        rate = summary["corrupted_rate"]
        shown = "n/a" if rate is None else f"{rate:.1%}"
        print(f"corrupted: {summary['corrupted']}/{summary['judged']} judged runs ({shown}); "
              f"failed launches: {summary['failed']}")
    if summary["failed"]:
        return EXIT_LAUNCH_FAILED
    return EXIT_CORRUPTED if summary["corrupted"] else EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
