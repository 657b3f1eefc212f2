"""What a doctor rule is, what it sees, and what it reports.

A rule is data (id, severity, title, symptom, fix, the failure it comes from, the log texts that
betray it) plus one small check function. The check returns a `Hit` (what it saw); the rule turns
that into a `Finding`, so ids, titles and doc links live in exactly one place: the registry.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from mlstack_ds.detect.model import Environment
from mlstack_ds.doctor.bundle import BundleCoverage
from mlstack_ds.doctor.facts import SystemFacts
from mlstack_ds.recipe import find_recipe

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}
RULE_ID_RE = re.compile(r"^MLS-(TORCH|DEV|GPU|ARCH|ENV|ROCM|BUILD|DS|SYS|NET|MN|SLURM|LOG)-\d{3}$")
DOCS_PAGE = "docs/troubleshooting.md"

def default_min_rocm() -> str:
    """The oldest ROCm the default recipe supports, read from it (its `min_rocm` is the authority), for
    callers that have not loaded a recipe of their own."""
    return find_recipe().min_rocm


def docs_link(rule_id: str) -> str:
    return f"{DOCS_PAGE}#{rule_id.lower()}"


@dataclass(frozen=True)
class DoctorInput:
    """Everything a rule may look at: detect's `Environment`, the extra system facts, the recipe's
    minimum ROCm and whether the user's DeepSpeed config offloads to NVMe."""

    env: Environment
    facts: SystemFacts
    min_rocm: str = field(default_factory=default_min_rocm)
    nvme_offload: bool = False
    # `doctor --index` (or MLSTACK_DS_INDEX): the index wheel that fits this machine, if one does; compiling
    # is then not needed, and a missing compiler is no error.
    prebuilt: str | None = None
    # `doctor --offline DIR`: whether the bundle covers installing the recipe here (install --offline's check).
    bundle: BundleCoverage | None = None


@dataclass(frozen=True)
class Hit:
    """What a check saw. `fix`/`severity` override the rule's generic ones when the machine's
    state allows a more exact answer (e.g. the actual GPU index to keep visible)."""

    evidence: str
    fix: tuple[str, ...] = ()
    severity: Severity | None = None


@dataclass(frozen=True)
class Finding:
    rule_id: str
    severity: Severity
    title: str
    evidence: str
    fix: tuple[str, ...]
    docs: str
    origin: str = "system"  # "system" (machine state) or "log" (matched in --log FILE)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": list(self.fix),
            "docs": self.docs,
            "origin": self.origin,
        }


Check = Callable[[DoctorInput], "Hit | None"]
# A check across the nodes of a hostfile (`doctor --hostfile`); its input is `doctor.cluster.ClusterInput`,
# typed loosely here so that this module does not depend on the multi-node code.
ClusterCheck = Callable[[Any], "Hit | None"]
LogFix = Callable[[str], tuple[str, ...]]  # the first matching log line -> fix steps naming what it names


@dataclass(frozen=True)
class Rule:
    """One known way DeepSpeed breaks on ROCm. `source` names the real failure it comes from
    (an entry of the failure catalogue and the upstream thread), so every rule can be traced."""

    id: str
    severity: Severity
    title: str
    symptom: str
    fix: tuple[str, ...]
    source: str
    check: Check | None = None
    log_patterns: tuple[re.Pattern[str], ...] = field(default=())
    severity_note: str = ""  # when a finding's severity can differ from the default, say when
    log_fix: LogFix | None = None  # a log finding's exact fix, read from its first matching line
    cluster_check: ClusterCheck | None = None  # checked by `doctor --hostfile` over all nodes

    def log_finding(self, evidence: str, line: str) -> Finding:
        """The finding for a log whose first matching line is `line`."""
        return self.finding(Hit(evidence, fix=self.log_fix(line) if self.log_fix else ()), origin="log")

    def finding(self, hit: Hit, origin: str = "system") -> Finding:
        return Finding(
            rule_id=self.id,
            severity=hit.severity or self.severity,
            title=self.title,
            evidence=hit.evidence,
            fix=hit.fix or self.fix,
            docs=docs_link(self.id),
            origin=origin,
        )


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; by rule id within a severity (stable output)."""
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.rule_id, f.origin))
