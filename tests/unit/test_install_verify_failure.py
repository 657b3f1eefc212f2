"""An install whose verify failed: the install stands, the command exits 8 naming the failed checks."""

from __future__ import annotations

from mlstack_ds.cli.install_cmd import verify_failure
from mlstack_ds.errors import ExitCode
from mlstack_ds.verify.report import CheckResult, VerifyReport


def report(*statuses: str, reason: str = "") -> VerifyReport:
    checks = tuple(CheckResult(f"check{i}", status, reason if status == "fail" else "", 0.1)  # type: ignore[arg-type]
                   for i, status in enumerate(statuses))
    return VerifyReport("/venv/bin/python", 2, checks, (), 1.0)


def test_failed_checks_are_named_with_the_hint() -> None:
    failure = verify_failure(report("pass", "fail", "skip", "fail"), "DeepSpeed was installed on every node", "h")
    assert failure is not None and failure.exit_code == ExitCode.VERIFY
    assert failure.message == "DeepSpeed was installed on every node, but 2 verify check(s) failed: check1, check3"
    assert failure.hint == "h"


def test_the_first_failure_says_why() -> None:
    """Every check failed at once under load (issue 28's runs): the message said only which, not why."""
    failure = verify_failure(report("fail", "fail", reason="rank never started (exit code 1): EADDRINUSE"), "x", "h")
    assert failure is not None
    assert failure.message == ("x, but 2 verify check(s) failed: check0, check1 "
                               "(check0: rank never started (exit code 1): EADDRINUSE)")


def test_no_failure_without_a_failed_check_or_a_report() -> None:
    assert verify_failure(report("pass", "skip"), "x", "h") is None
    assert verify_failure(None, "x", "h") is None
