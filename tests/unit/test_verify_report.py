"""Merging per-rank results into one verdict per check, and the JSON/table renderings."""

from __future__ import annotations

import io
import json

from rich.console import Console

from mlstack_ds.verify.report import CheckResult, LaunchRecord, VerifyReport, merge_check, render_report


def record(status: str, reason: str = "", duration: float = 1.0, **details: object) -> dict[str, object]:
    return {"status": status, "reason": reason, "duration_s": duration, "details": details,
            "peak_memory_bytes": None, "peak_rss_bytes": 1 << 20}


def test_pass_only_when_every_rank_passes() -> None:
    result = merge_check("zero1", {0: record("pass", duration=1.0), 1: record("pass", duration=2.5)}, 2, {})
    assert result.status == "pass" and result.reason == "" and result.duration_s == 2.5
    assert result.ranks == {0: "pass", 1: "pass"}


def test_one_failing_rank_fails_the_check_and_its_details_are_kept() -> None:
    per_rank = {0: record("pass"), 1: record("fail", "step 4: loss is nan", step=4)}
    result = merge_check("zero3", per_rank, 2, {})
    assert result.status == "fail"
    assert result.reason == "rank 1: step 4: loss is nan"
    assert result.details == {"step": 4}


def test_the_same_failure_on_all_ranks_is_one_message() -> None:
    per_rank = {0: record("fail", "boom"), 1: record("fail", "boom")}
    assert merge_check("x", per_rank, 2, {}).reason == "ranks 0,1: boom"


def test_a_rank_that_did_not_report_fails_with_the_given_reason() -> None:
    result = merge_check("zero2", {0: record("pass")}, 2, {1: "timed out after 30 s (while running it)"})
    assert result.status == "fail"
    assert result.reason == "rank 1: timed out after 30 s (while running it)"


def test_skipped_on_all_ranks_is_a_skip_with_the_reason() -> None:
    per_rank = {0: record("skip", "fused_lamb is not built"), 1: record("skip", "fused_lamb is not built")}
    result = merge_check("fused_lamb", per_rank, 2, {})
    assert (result.status, result.reason) == ("skip", "fused_lamb is not built")


def test_mixed_skip_and_pass_is_a_failure() -> None:
    assert merge_check("x", {0: record("skip", "r"), 1: record("pass")}, 2, {}).status == "fail"


def make_report(*statuses: str) -> VerifyReport:
    checks = tuple(CheckResult(f"c{i}", s, "why" if s != "pass" else "", 0.5)  # type: ignore[arg-type]
                   for i, s in enumerate(statuses))
    launch = LaunchRecord(("python", "-m", "torch.distributed.run"), tuple(c.name for c in checks), 0, 3.0,
                          False)
    return VerifyReport("/venv/bin/python", 2, checks, (launch,), 4.0)


def test_report_ok_ignores_skips_but_not_failures() -> None:
    assert make_report("pass", "skip").ok
    assert not make_report("pass", "fail", "skip").ok


def test_json_is_serialisable_and_carries_verdict_and_counts() -> None:
    document = json.loads(json.dumps(make_report("pass", "fail", "skip").to_json()))
    assert document["ok"] is False
    assert document["counts"] == {"pass": 1, "fail": 1, "skip": 1}
    assert [c["status"] for c in document["checks"]] == ["pass", "fail", "skip"]
    assert document["launches"][0]["argv"][1:] == ["-m", "torch.distributed.run"]


def test_table_shows_every_check_and_the_failure_reason() -> None:
    console = Console(file=io.StringIO(), width=200)
    render_report(make_report("pass", "fail"), console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "c0" in text and "c1" in text and "FAIL" in text and "why" in text
    assert "1 passed, 1 failed" in text


def test_caption_names_the_skipped_checks() -> None:
    console = Console(file=io.StringIO(), width=200)
    render_report(make_report("pass", "skip", "skip"), console)
    assert "1 passed, 0 failed, 2 skipped (c1, c2: each says why)" in console.file.getvalue()  # type: ignore[attr-defined]


def test_the_table_notes_what_the_op_checks_measured() -> None:
    """fused_lion's ties and the quantizer's round trip are shown, not only 'pass' (issue 39)."""
    checks = [CheckResult("fused_lion", "pass", "", 0.1, details={"max_abs_diff": 1.2e-7, "tied_elements": 2}),
              CheckResult("quantizer", "pass", "", 0.1, details={"max_error_in_steps": 0.5})]
    report = VerifyReport(python="py", world_size=1, checks=checks, launches=[], duration_s=1.0)
    console = Console(file=io.StringIO(), width=200)
    render_report(report, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "max |Δ| vs torch 1.2e-07, 2 sign tie(s) left out" in text
    assert "round trip within 0.5 quantization step(s)" in text
