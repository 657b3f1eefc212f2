"""The verify report: one result per check (merged over ranks), as JSON or a rich table.

Merging rules: a check passes only if every rank passed it; it fails if any rank failed it or if a
rank never reported it (time-out, crash), and the reason says which rank and why; it is skipped when
every rank skipped it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from rich.console import Console
from rich.text import Text

from mlstack_ds.console import print_records
from mlstack_ds.detect.client_pairs import BadPair, known_cause

Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    reason: str
    duration_s: float  # the slowest rank's time
    details: Mapping[str, Any] = field(default_factory=dict)  # rank 0's details (or the first failing rank's)
    ranks: Mapping[int, Status] = field(default_factory=dict)
    peak_memory_bytes: Mapping[int, int | None] = field(default_factory=dict)  # accelerator peak, per rank
    peak_rss_bytes: Mapping[int, int | None] = field(default_factory=dict)  # process peak so far, per rank


@dataclass(frozen=True)
class LaunchRecord:
    """One launcher run: what ran, how it ended."""

    argv: tuple[str, ...]
    checks: tuple[str, ...]
    returncode: int | None
    duration_s: float
    timed_out: bool
    log_tail: str = ""
    nodes: tuple[Mapping[str, Any], ...] = ()  # multi-node: each node's host, ranks and how files got there


@dataclass(frozen=True)
class VerifyReport:
    python: str
    world_size: int
    checks: tuple[CheckResult, ...]
    launches: tuple[LaunchRecord, ...]
    duration_s: float
    clients: Mapping[str, str] = field(default_factory=dict)  # transformers, accelerate, ... the checks ran with

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in ("pass", "fail", "skip")}

    def per_node(self) -> list[dict[str, Any]]:
        """Multi-node runs: each node with its ranks, how the launch files got there, and the checks that
        failed on any of its ranks (empty on one node)."""
        nodes = next((launch.nodes for launch in self.launches if launch.nodes), ())
        summary = []
        for node in nodes:
            ranks = set(node["ranks"])
            failed = [c.name for c in self.checks if any(c.ranks.get(r) == "fail" for r in ranks)]
            summary.append({**node, "failed": failed, "ok": not failed})
        return summary

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["ok"] = self.ok
        document["counts"] = self.counts()
        document["nodes"] = self.per_node()
        return document


def merge_check(name: str, per_rank: Mapping[int, Mapping[str, Any]], world_size: int,
                missing_reason: Mapping[int, str]) -> CheckResult:
    """Merge one check's per-rank records; `missing_reason[rank]` explains a rank that did not report."""
    ranks: dict[int, Status] = {}
    reasons: list[str] = []
    for rank in range(world_size):
        record = per_rank.get(rank)
        if record is None:
            ranks[rank] = "fail"
            reasons.append(f"rank {rank}: {missing_reason.get(rank, 'did not report')}")
            continue
        ranks[rank] = record["status"]
        if record["status"] == "fail":
            reasons.append(f"rank {rank}: {record.get('reason') or 'failed'}")
    statuses = set(ranks.values())
    if "fail" in statuses:
        status: Status = "fail"
        reason = _dedupe_rank_reasons(reasons)
    elif statuses == {"skip"}:
        status, reason = "skip", str(per_rank[0].get("reason", "")) if 0 in per_rank else "skipped"
    elif "skip" in statuses:
        status = "fail"
        reason = "ranks disagree: some skipped, some passed"
    else:
        status, reason = "pass", ""
    detail_rank = next((r for r in sorted(per_rank) if per_rank[r]["status"] == "fail"), 0)
    details = dict(per_rank.get(detail_rank, {}).get("details") or {})
    return CheckResult(
        name=name, status=status, reason=reason,
        duration_s=max((float(r.get("duration_s") or 0.0) for r in per_rank.values()), default=0.0),
        details=details, ranks=ranks,
        peak_memory_bytes={r: rec.get("peak_memory_bytes") for r, rec in sorted(per_rank.items())},
        peak_rss_bytes={r: rec.get("peak_rss_bytes") for r, rec in sorted(per_rank.items())},
    )


def _dedupe_rank_reasons(reasons: Sequence[str]) -> str:
    """`rank 0: X; rank 1: X` -> `ranks 0,1: X` (the same failure on every rank is one message)."""
    by_text: dict[str, list[str]] = {}
    for item in reasons:
        rank, _, text = item.partition(": ")
        by_text.setdefault(text, []).append(rank.removeprefix("rank "))
    parts = []
    for text, ranks in by_text.items():
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(ranks)}"
        parts.append(f"{label}: {text}")
    return "; ".join(parts)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


STATUS_STYLE = {"pass": ("pass", "green"), "fail": ("FAIL", "bold red"), "skip": ("skip", "yellow")}
COLUMNS = ("check", "status", "time s", "peak MiB/rank", "reason / notes")
NODE_COLUMNS = ("node", "ranks", "launch files", "checks")


def render_report(report: VerifyReport, console: Console) -> None:
    """The report as a table on a terminal it fits, else one line per check (reasons are never cut)."""
    rows = []
    for check in report.checks:
        peaks = [v for v in check.peak_memory_bytes.values() if v is not None]
        peak = "/".join(_mib(v) for v in check.peak_memory_bytes.values()) if peaks else "n/a"
        label, style = STATUS_STYLE[check.status]
        rows.append((check.name, Text(label, style=style), f"{check.duration_s:.1f}", peak,
                     check.reason or _note(check)))
    nodes = report.per_node()
    where = f" over {len(nodes)} node(s)" if nodes else ""
    print_records(console, COLUMNS, rows, title=f"mlstack-ds verify: {report.python} on {report.world_size} rank(s)"
                  f"{where}", caption=_caption(report))
    if nodes:
        node_rows = [(n["host"], ",".join(map(str, n["ranks"])), n["files"], _node_checks(n)) for n in nodes]
        print_records(console, NODE_COLUMNS, node_rows, title="per node")


def _node_checks(node: Mapping[str, Any]) -> Text:
    if node["ok"]:
        return Text("ok", style="green")
    return Text("FAIL: " + ", ".join(node["failed"]), style="bold red")


def _caption(report: VerifyReport) -> str:
    counts = report.counts()
    skipped = [c.name for c in report.checks if c.status == "skip"]
    clients = ", ".join(f"{name} {version}" for name, version in report.clients.items())
    return (f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
            f"{' (' + ', '.join(skipped) + ': each says why)' if skipped else ''} in "
            f"{report.duration_s:.1f} s over {len(report.launches)} launch(es); peak memory is the "
            f"accelerator's (n/a on CPU){'; clients: ' + clients if clients else ''}")


def with_known_cause(result: CheckResult, pairs: Sequence[BadPair]) -> CheckResult:
    """A failure whose reason carries the error text of a known bad client/DeepSpeed pair, with that pair's
    doctor rule and first fix appended: the user reads the cause where the failure is."""
    pair = known_cause(result.reason, pairs) if result.status == "fail" else None
    if pair is None:
        return result
    fix = pair.fix[0].split("#", 1)[0].strip()
    return replace(result, reason=f"{result.reason} [known cause {pair.id}: {pair.title}; fix: {fix}]")


def _note(check: CheckResult) -> str:
    details = check.details
    if details.get("losses"):
        losses = details["losses"]
        return f"loss {losses[0]:.4f} -> {losses[-1]:.4f} (matches torch reference)"
    if "max_abs_diff" in details:
        ties = f", {details['tied_elements']} sign tie(s) left out" if details.get("tied_elements") else ""
        return f"max |Δ| vs torch {details['max_abs_diff']:.2g}{ties}"
    if "max_error_in_steps" in details:
        return f"round trip within {details['max_error_in_steps']:.2g} quantization step(s)"
    if "ops" in details and isinstance(details["ops"], Mapping):
        return ", ".join(f"{n} {v['load_s'] * 1000:.0f} ms" for n, v in details["ops"].items())
    if "deepspeed" in details:
        return (f"DeepSpeed {details.get('deepspeed')} ({details.get('deepspeed_git_hash')}), torch "
                f"{details.get('torch')}, accelerator {details.get('accelerator')}")
    return ""
