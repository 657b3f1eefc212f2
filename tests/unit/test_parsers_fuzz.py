"""Parsers are pure functions of text: on any input they return data, never raise."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fakemachine import REAL

from mlstack_ds.detect import nvidia, rocminfo, smi, versions
from mlstack_ds.detect.target_probe import parse_target_output

CAPTURES = sorted(REAL.glob("*.txt"))
PARSERS = [
    lambda t: rocminfo.gpu_agents(rocminfo.parse_rocminfo(t), None),
    lambda t: rocminfo.gpu_agents(rocminfo.parse_rocminfo(t), "10.3.0"),
    smi.parse_amd_smi_list,
    smi.parse_rocm_agent_enumerator,
    smi.parse_rocm_smi_productname,
    versions.parse_info_version,
    versions.parse_rocm_version_header,
    versions.parse_hip_version,
    versions.parse_amd_smi_version,
    nvidia.parse_nvidia_smi_csv,
    lambda t: parse_target_output(t, REAL),
]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_parsers_never_raise_on_arbitrary_text(text: str) -> None:
    for parse in PARSERS:
        parse(text)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(CAPTURES) - 1), st.randoms(use_true_random=False),
       st.sampled_from(["cut", "drop", "shuffle", "junk"]))
def test_parsers_never_raise_on_damaged_captures(index: int, rnd: random.Random, damage: str) -> None:
    lines = CAPTURES[index].read_text().splitlines()
    if damage == "cut" and lines:
        lines = lines[: rnd.randrange(len(lines))]
    elif damage == "drop":
        lines = [ln for ln in lines if rnd.random() > 0.2]
    elif damage == "shuffle":
        rnd.shuffle(lines)
    else:
        lines = [ln if rnd.random() > 0.1 else ln + "\x1b[0m\x00\ufffd]]" for ln in lines]
    text = "\n".join(lines)
    for parse in PARSERS:
        parse(text)
    # Damage can lose GPUs but never invent them.
    real = len(rocminfo.gpu_agents(rocminfo.parse_rocminfo(CAPTURES[index].read_text())))
    if damage != "shuffle":
        assert len(rocminfo.gpu_agents(rocminfo.parse_rocminfo(text))) <= real
