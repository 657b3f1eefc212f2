"""`doctor` = detect + facts + every rule (+ a log, when given)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_ds.bundle.offline import here
from mlstack_ds.detect.environment import detect_with_target, resolve_python
from mlstack_ds.detect.host import cpu_flags
from mlstack_ds.detect.model import Environment
from mlstack_ds.doctor.bundle import BundleCoverage, BundleQuestion, bundle_coverage, covered_note
from mlstack_ds.doctor.facts import SystemFacts, collect_facts
from mlstack_ds.doctor.logs import match_log
from mlstack_ds.doctor.model import DoctorInput, Finding, Rule, default_min_rocm, sort_findings
from mlstack_ds.doctor.rules import RULES
from mlstack_ds.errors import MlstackError
from mlstack_ds.index.choose import choose
from mlstack_ds.index.match import Here
from mlstack_ds.plan.buildplan import rocm_major_minor
from mlstack_ds.plan.targets import select_rocm_targets


@dataclass(frozen=True)
class Diagnosis:
    env: Environment
    facts: SystemFacts
    findings: list[Finding]
    notes: tuple[str, ...] = ()  # what doctor --index found (or why it could not ask the index)
    bundle: BundleCoverage | None = None  # doctor --offline DIR

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "environment": self.env.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "warnings": [*self.env.warnings, *self.facts.warnings, *self.notes],
            **({"offline": self.bundle.to_dict()} if self.bundle is not None else {}),
        }


def run_rules(inp: DoctorInput, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every rule's finding for this machine, most severe first."""
    findings = []
    for rule in rules:
        hit = rule.check(inp) if rule.check else None
        if hit is not None:
            findings.append(rule.finding(hit))
    return sort_findings(findings)


def diagnose(
    *,
    environ: Mapping[str, str] | None = None,
    python: str | Path | None = None,
    log_text: str | None = None,
    log_findings: Iterable[Finding] = (),
    root: Path = Path("/"),
    min_rocm: str | None = None,
    nvme_offload: bool = False,
    index: str | None = None,
    bundle: BundleQuestion | None = None,
) -> Diagnosis:
    """Detect, collect facts, run every rule. A log is matched by the caller (`match_log_stream`, in
    bounded memory) and passed as `log_findings`; `log_text` is the same for a log already in memory."""
    environ = dict(os.environ if environ is None else environ)
    target_python = resolve_python(python)
    # One start of the target interpreter: detect's probe also answers the facts (its first line needs no
    # torch, so a torch that hangs or crashes still leaves doctor the headers, prefix and RECORD).
    detection = detect_with_target(environ=environ, python=target_python)
    env = detection.environment
    facts = collect_facts(env, environ=environ, root=root, target=detection.target)
    prebuilt, notes = index_fit(env, index) if index else (None, ())
    coverage = bundle_coverage(bundle, here(env.python.version)) if bundle else None
    if bundle and coverage and coverage.covered:
        notes = (*notes, covered_note(coverage, bundle.recipe, "here"))
    inp = DoctorInput(env=env, facts=facts, min_rocm=min_rocm or default_min_rocm(), nvme_offload=nvme_offload,
                      prebuilt=prebuilt, bundle=coverage)
    findings = [*run_rules(inp), *log_findings]
    if log_text is not None:
        findings += match_log(log_text, RULES)
    findings = sort_findings(findings)
    return Diagnosis(env=env, facts=facts, findings=findings, notes=notes, bundle=coverage)


def index_fit(env: Environment, index: str) -> tuple[str | None, tuple[str, ...]]:
    """An index wheel made for this machine (platform, torch, Python, ROCm, wavefront, GPU targets, CPU), if
    there is one, and what to say about it. Doctor never plans a build (it must run where nothing can be
    built), so the recipe, pin and series are left to `install --index`; doctor never fails on the index."""
    try:
        targets = select_rocm_targets(env, None) if env.platform == "rocm" else None
    except MlstackError as exc:
        return None, (f"index {index}: not checked ({exc.message})",)
    torch = env.torch
    here = {"platform": env.platform, "python_version": env.python.version,
            "torch_version": torch.version if torch else None, "torch_hip": torch.hip if torch else None,
            "torch_cuda": torch.cuda if torch else None,
            "rocm_version": rocm_major_minor(env) if env.platform == "rocm" else None,
            "archs": list(targets.archs) if targets else [], "wavefront": targets.wavefront if targets else None}
    try:
        choice = choose(index, Here(here, platform.machine(), cpu_flags()), facts_only=True)
    except MlstackError as exc:
        return None, (f"index {index}: not checked ({exc.message})",)
    if choice.chosen is None:
        return None, (f"index {index}: no wheel fits this machine: {choice.why_not()}",)
    return choice.chosen.link.filename, (f"index {index}: {choice.chosen.link.filename} fits this machine's torch, "
                                         "Python, ROCm and GPU targets (install --index checks the recipe and "
                                         "patch series too)",)
