"""One rank of the verify suite: `python -m mlstack_verify_worker --checks a,b --out DIR` under a launcher.

`--list` prints the check table as JSON instead (the tool's tests compare it with its own table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

from .context import Context, accelerator, import_targets, init_distributed
from .protocol import (
    PROTOCOL_VERSION,
    SUMMARY_FILE,
    CheckFailed,
    ResultLog,
    SkipCheck,
    die_with_parent,
    fire_fault,
    import_beats,
    parse_fault,
)
from .registry import all_checks, by_name


def peak_memory(ctx):
    """Peak accelerator memory since the last reset, where the accelerator reports it (not on CPU)."""
    if ctx.deepspeed is None:
        return None
    with contextlib.suppress(Exception):
        acc = accelerator()
        if acc._name != "cpu":
            return int(acc.max_memory_allocated())
    return None


def reset_peak(ctx):
    if ctx.deepspeed is None:
        return
    with contextlib.suppress(Exception):
        acc = accelerator()
        if acc._name != "cpu":
            acc.reset_peak_memory_stats()


def run_one(ctx, check):
    started = time.monotonic()
    reset_peak(ctx)
    status, reason, details = "pass", "", {}
    try:
        details = check.run(ctx) or {}
    except SkipCheck as exc:
        status, reason = "skip", str(exc)
    except CheckFailed as exc:
        status, reason, details = "fail", str(exc), exc.details
    except Exception as exc:
        status, reason = "fail", f"{type(exc).__name__}: {exc}".strip()
        details = {"traceback": traceback.format_exc(limit=6)[-4000:]}
    return {"event": "result", "check": check.name, "rank": ctx.rank, "status": status, "reason": reason,
            "duration_s": round(time.monotonic() - started, 4), "details": details,
            "peak_memory_bytes": peak_memory(ctx),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def write_summary(ctx, log):
    """Rank 0 gathers every rank's results, so ranks on other nodes are reported too."""
    torch = ctx.torch
    if torch is None or not torch.distributed.is_initialized():
        return
    gathered = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, log.records)
    if ctx.rank == 0:
        summary = {"protocol": PROTOCOL_VERSION, "world_size": ctx.world_size,
                   "ranks": {str(r): recs for r, recs in enumerate(gathered)}}
        tmp = ctx.out_dir / f"{SUMMARY_FILE}.tmp"
        tmp.write_text(json.dumps(summary, default=str), encoding="utf-8")
        tmp.replace(ctx.out_dir / SUMMARY_FILE)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the check table as JSON and exit")
    parser.add_argument("--checks", default="", help="comma-separated check names, run in this order")
    parser.add_argument("--out", default="", help="directory for the per-rank result files")
    parser.add_argument("--receipt", default="",
                        help="receipt path (default: <sys.prefix>/share/mlstack-ds/receipt.json)")
    parser.add_argument("--ds-config", default="", help="the user's DeepSpeed config (JSON) for the config check")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective time-out, seconds")
    parser.add_argument("--allow-jit", action="store_true", help="let DeepSpeed JIT-compile missing ops")
    parser.add_argument("--run-id", default="", help="marker that identifies this launch's processes")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        print(json.dumps([check.row() for check in all_checks()]))
        return 0
    if not args.checks or not args.out:
        sys.stderr.write("mlstack_verify_worker: --checks and --out are required (or --list)\n")
        return 2
    die_with_parent()
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    log = ResultLog(args.out, rank)
    log.write({"event": "hello", "rank": rank, "world_size": world_size, "pid": os.getpid(),
               "protocol": PROTOCOL_VERSION, "host": os.uname().nodename})
    fault = parse_fault(os.environ.get("MLSTACK_VERIFY_TEST_FAULT", ""), rank)
    ctx = Context(args, rank, world_size, log=log)
    with import_beats(log, rank):
        import_targets(ctx, args.allow_jit)
    log.write({"event": "imported", "rank": rank})  # progress: importing takes minutes on a busy machine
    init_distributed(ctx, args.timeout)
    names = [n for n in args.checks.split(",") if n]
    table = by_name()
    for index, name in enumerate(names):
        log.write({"event": "start", "check": name, "rank": rank})
        fire_fault(fault, name, index == 0)
        if name not in table:
            record = {"event": "result", "check": name, "rank": rank, "status": "fail",
                      "reason": "unknown check (worker and tool versions differ?)", "duration_s": 0.0,
                      "details": {}, "peak_memory_bytes": None, "peak_rss_bytes": None}
        else:
            record = run_one(ctx, table[name])
        log.write(record)
    write_summary(ctx, log)
    if ctx.torch is not None and ctx.torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            ctx.torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Every record is on disk (fsynced). No interpreter teardown: a gloo worker thread can still race it and
    # abort the rank (`terminate called without an active exception`, docs/abort-at-exit.md), also after
    # destroy_process_group() when engines that hold process groups are only collected by finalization's GC.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
