"""The pure parts of the pipeline, activation-checkpointing, zero_to_fp32 and NVMe checks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mlstack_ds.worker import pipeline_checks, training, zero_checks


@pytest.mark.parametrize(("world_size", "layout"), [
    (1, None),  # one rank cannot hold two stages
    (2, (2, 1)),
    (4, (2, 2)),  # two stages, the rest data parallel
    (6, (2, 3)),
    (3, (3, 1)),  # odd: the smallest prime factor as stage count
    (9, (3, 3)),
    (5, None),  # 5 stages for a 4-layer model: no layer for one of them
    (7, None),
])
def test_pipeline_layout(world_size: int, layout: tuple[int, int] | None) -> None:
    assert pipeline_checks.pipeline_layout(world_size) == layout


def test_every_layout_covers_the_world_and_gives_each_stage_a_layer() -> None:
    for world_size in range(2, 65):
        layout = pipeline_checks.pipeline_layout(world_size)
        if layout is not None:
            stages, replicas = layout
            assert stages * replicas == world_size and 2 <= stages <= pipeline_checks.PIPELINE_LAYERS


def _stream_bug_module(tmp_path: Path):
    """A real module file named like DeepSpeed's, failing on the same line shape on an accelerator without
    streams (Stream is None), so the traceback is a genuine one."""
    path = tmp_path / "checkpointing.py"
    path.write_text(
        "class Cpu:\n"
        "    Stream = None\n"
        "def get_accelerator():\n"
        "    return Cpu()\n"
        "def forward(cuda_device='cpu'):\n"
        "    transport_stream = get_accelerator().Stream(device=cuda_device)\n"
        "    return transport_stream\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("mlstack_test_checkpointing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop(spec.name, None)
    spec.loader.exec_module(module)
    return module


def test_the_stream_type_error_is_named_with_its_upstream_fix(tmp_path: Path) -> None:
    module = _stream_bug_module(tmp_path)
    with pytest.raises(TypeError) as info:
        module.forward()
    message = pipeline_checks.describe_failure("checkpoint", info.value)
    assert "asks the accelerator for a stream it does not have" in message
    assert "PR #8611" in message and "patch 0005" in message
    assert "'NoneType' object is not callable" in message


def test_other_type_errors_are_reported_as_they_are() -> None:
    def broken():
        missing = None
        return missing(device="cpu")  # a TypeError from a line that asks for no stream

    try:
        broken()
    except TypeError as exc:
        message = pipeline_checks.describe_failure("non_reentrant_checkpoint", exc)
    assert "stream" not in message and message.startswith("deepspeed.checkpointing.non_reentrant_checkpoint: "
                                                          "TypeError")


def test_gradient_comparison_counts_differing_tensors() -> None:
    torch = pytest.importorskip("torch")
    plain = [torch.zeros(3), torch.ones(2)]
    assert pipeline_checks.compare_gradients(plain, [torch.zeros(3), torch.ones(2)]) == (0.0, 0.0, 0)
    worst, relative, differing = pipeline_checks.compare_gradients(plain, [torch.zeros(3), torch.tensor([1.0, 1.5])])
    assert (worst, relative, differing) == (0.5, 0.5, 1)
    scaled = [torch.zeros(3), torch.full((2,), 200.0)]
    worst, relative, _ = pipeline_checks.compare_gradients(scaled, [torch.zeros(3), torch.tensor([200.0, 200.02])])
    assert worst == pytest.approx(0.02, rel=1e-3) and relative == pytest.approx(1e-4, rel=1e-3)  # judged relative
    assert pipeline_checks.compare_gradients(plain, [torch.zeros(3), None])[0] == float("inf")


def test_consolidated_state_dict_must_match_bitwise() -> None:
    torch = pytest.importorskip("torch")
    live = [torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64)]
    names = ["a.weight", "b.bias"]
    same = {"a.weight": torch.tensor([1.0, 2.0]), "b.bias": torch.tensor([3.0])}
    verdict, problems = zero_checks.compare_consolidated(torch, same, names, live)
    assert problems == [] and verdict["mismatches"] == 0 and verdict["tensors"] == 2
    off_by_one_ulp = {"a.weight": torch.tensor([1.0, 2.0]),
                      "b.bias": torch.nextafter(torch.tensor([3.0]), torch.tensor([4.0]))}
    verdict, problems = zero_checks.compare_consolidated(torch, off_by_one_ulp, names, live)
    assert verdict["mismatches"] == 1 and "1 of 2 consolidated tensors differ" in problems[0]
    assert 0 < verdict["max_abs_diff"] < 1e-6
    missing = {"a.weight": torch.tensor([1.0, 2.0]), "c": torch.tensor([0.0])}
    verdict, problems = zero_checks.compare_consolidated(torch, missing, names, live)
    assert verdict["missing"] == ["b.bias"] and verdict["unexpected"] == ["c"] and "missing ['b.bias']" in problems[0]
    half = {"a.weight": torch.tensor([1.0, 2.0], dtype=torch.float16), "b.bias": torch.tensor([3.0])}
    assert any("not fp32" in p for p in zero_checks.compare_consolidated(torch, half, names, live)[1])


def test_nvme_buffers_hold_the_largest_parameter_on_one_rank(tmp_path: Path) -> None:
    config = zero_checks.nvme_config(tmp_path)
    param = config["zero_optimization"]["offload_param"]
    assert param["device"] == "nvme" and param["nvme_path"] == str(tmp_path)
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "nvme"
    assert config["zero_optimization"]["stage"] == 3
    # the largest ZeRO-3 partition is a whole fc1/fc2 weight when one rank holds everything
    assert param["buffer_size"] >= training.D_MODEL * training.D_FF
    assert config["aio"]["block_size"] > 0
