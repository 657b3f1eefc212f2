"""A Markdown block to paste into a bug report: the environment in brief, then the findings
(the idea of `spack debug report`: everything a maintainer asks for first, in one paste)."""

from __future__ import annotations

import platform

from mlstack_ds import __version__
from mlstack_ds.doctor.engine import Diagnosis


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def environment_lines(diagnosis: Diagnosis) -> list[str]:
    env, facts = diagnosis.env, diagnosis.facts
    rocm = env.rocm
    lines = [
        f"- mlstack-ds: {__version__}",
        f"- OS: {platform.platform()}",
        f"- Python: {env.python.version} ({env.python.executable})",
        f"- Platform: {env.platform}",
        "- ROCm: " + (f"{rocm.version or 'unknown version'} at {rocm.root or '?'} "
                      f"(from {rocm.version_source})" if rocm else "not found"),
    ]
    if env.gpus:
        lines.append("- GPUs:")
        lines += [
            f"  - {g.index}: {g.arch or '?'} {g.name} (wave{g.wavefront_size}, {g.family}"
            + (", integrated" if g.integrated else "") + (", spoofed" if g.spoofed else "") + ")"
            for g in env.gpus
        ]
    else:
        lines.append("- GPUs: none visible")
    torch = env.torch
    lines.append("- PyTorch: " + (f"{torch.version} (hip {torch.hip}, cuda {torch.cuda}, "
                                  f"{torch.device_count} device(s), archs {';'.join(torch.arch_list) or '-'})"
                                  if torch else "not installed"))
    ds, build = env.deepspeed, facts.ds_build
    if ds:
        ops = ", ".join(build.prebuilt_ops) if build and build.prebuilt_ops else "none"
        built = f", compiled w. torch {build.torch_version}, hip {build.hip_version}" if build else ""
        lines.append(f"- DeepSpeed: {ds.version} (prebuilt ops: {ops}{built}; "
                     f"receipt: {'yes' if facts.receipt_exists else 'no'})")
    else:
        lines.append("- DeepSpeed: not installed")
    tracked = [f"{k}={v}" for k, v in env.env.items() if v]
    tracked_text = ", ".join(f"`{t}`" for t in tracked) or "none of interest set"
    lines.append(f"- Environment variables: {tracked_text}")
    kfd = "accessible" if facts.kfd_accessible else "present" if facts.kfd_exists else "missing"
    lines.append(f"- /dev/kfd: {kfd}; user groups: {', '.join(facts.user_groups) or '-'}")
    return lines


def render_markdown(diagnosis: Diagnosis) -> str:
    findings = diagnosis.findings
    out = ["### mlstack-ds doctor report", "", "**Environment**", "", *environment_lines(diagnosis), ""]
    out += ["**Findings**", ""]
    if not findings:
        out.append("No problems found.")
    else:
        out += ["| Severity | Rule | Problem | Evidence |", "|---|---|---|---|"]
        out += [f"| {f.severity} | {f.rule_id} | {_cell(f.title)} | {_cell(f.evidence)} |" for f in findings]
        out += ["", "**Suggested fixes**", ""]
        for f in findings:
            out.append(f"- {f.rule_id}: " + "; ".join(f"`{step}`" for step in f.fix))
    warnings = [*diagnosis.env.warnings, *diagnosis.facts.warnings]
    if warnings:
        out += ["", "<details><summary>Detection notes</summary>", ""]
        out += [f"- {_cell(w)}" for w in warnings]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"
