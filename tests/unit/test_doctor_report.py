"""The bug-report Markdown: environment summary + findings table + fixes, table-safe."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from support.doctor_inputs import MI210X4, ds_build, gpus_from, healthy_facts, make_env

from mlstack_ds.detect.model import DeepSpeedInfo
from mlstack_ds.doctor.engine import Diagnosis
from mlstack_ds.doctor.logs import match_log
from mlstack_ds.doctor.model import Finding
from mlstack_ds.doctor.report import render_markdown
from mlstack_ds.doctor.rules import RULES


def test_report_summarises_the_environment_and_findings() -> None:
    env = make_env(gpus_from(MI210X4), env_vars={"HIP_VISIBLE_DEVICES": "0,1"},
                   deepspeed=DeepSpeedInfo("0.19.5", "/venv/site-packages"))
    finding = Finding("MLS-DS-002", "error", "DeepSpeed's ops were built against another torch/HIP",
                      "ops built with HIP 6.0 | torch's HIP is 6.2", ("mlstack-ds install",),
                      "docs/troubleshooting.md#mls-ds-002")
    text = render_markdown(Diagnosis(env, healthy_facts(ds_build=ds_build()), [finding]))
    assert text.startswith("### mlstack-ds doctor report\n")
    assert text.count("  - ") == 4 and "gfx90a AMD Instinct MI210 (wave64, CDNA2)" in text
    assert "- ROCm: 6.2.2 at /opt/rocm-6.2.2 (from /opt/rocm-6.2.2/.info/version)" in text
    assert ("- DeepSpeed: 0.19.5 (prebuilt ops: cpu_adam, fused_adam, compiled w. torch 2.5, hip 6.2; "
            "receipt: yes)") in text
    assert "`HIP_VISIBLE_DEVICES=0,1`" in text
    # a "|" inside evidence must not split the table row
    assert "| error | MLS-DS-002 | DeepSpeed's ops were built against another torch/HIP | " \
           "ops built with HIP 6.0 \\| torch's HIP is 6.2 |" in text
    assert "- MLS-DS-002: `mlstack-ds install`" in text


def test_report_without_findings() -> None:
    text = render_markdown(Diagnosis(make_env(torch=None), healthy_facts(), []))
    assert "- PyTorch: not installed" in text
    assert "No problems found." in text


@given(st.text())
def test_log_matching_never_crashes_on_junk(text: str) -> None:
    for finding in match_log(text, RULES):
        assert finding.evidence.startswith("log line ")
