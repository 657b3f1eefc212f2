"""Every model, input and reference a check makes is on the rank's device (issue 39).

On an H100 `activation_checkpointing` failed with "Expected all tensors to be on the same device, but got
weight is on cpu, different from other tensors on cuda:0": the check built its block on the CPU. There is no
GPU here, so the checks' own computations run on the `meta` device, which refuses a CPU tensor in the same
way ("Tensor on device cpu is not on the expected device meta!"): whatever they leave on the CPU fails here
as it failed there.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlstack_ds.worker import optimizer_checks, pipeline_checks, training

torch = pytest.importorskip("torch")
DEVICE = "meta"


def on_device(tensors) -> bool:
    return all(t is not None and t.device.type == DEVICE for t in tensors)


def test_meta_refuses_a_cpu_tensor_as_a_gpu_does() -> None:
    """The premise: a CPU module given a meta input fails, as a CPU module given a CUDA input does."""
    with pytest.raises(RuntimeError, match="not on the expected device"):
        torch.nn.LayerNorm(8)(torch.zeros(2, 8, device=DEVICE))


def test_activation_checkpointing_runs_its_block_and_inputs_on_the_device() -> None:
    ctx = SimpleNamespace(torch=torch)
    outputs = pipeline_checks.checkpoint_gradients(ctx, lambda fn, x: fn(x), DEVICE)
    assert len(outputs) == 2 + len(list(training.build_model(torch).blocks[0].parameters()))
    assert on_device(outputs)  # the output, the input's gradient and every parameter's gradient


def test_the_paired_runs_reference_and_batch_are_on_the_device() -> None:
    model, reference, optimizer = training.paired_models(torch, DEVICE, seed=1234)
    assert on_device(reference.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())  # DeepSpeed places the engine's model
    assert optimizer.param_groups[0]["params"][0].device.type == DEVICE
    tokens, targets = training.global_batch(torch, 2, DEVICE)
    assert on_device([tokens, targets]) and tokens.shape == (2 * training.MICRO_BATCH, training.SEQ)
    reference(tokens, targets).backward()  # the whole reference step computes there
    assert on_device(p.grad for p in reference.parameters())


def test_the_paired_models_start_equal_and_the_batch_is_the_same_everywhere() -> None:
    model, reference, _ = training.paired_models(torch, "cpu", seed=1234)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))
    again, _, _ = training.paired_models(torch, "cpu", seed=1234)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    cpu_tokens, _ = training.global_batch(torch, 2, "cpu")
    meta_tokens, _ = training.global_batch(torch, 2, DEVICE)
    assert meta_tokens.shape == cpu_tokens.shape  # drawn on the CPU from one seed, then placed


def test_pipeline_batches_are_on_the_device() -> None:
    batches = pipeline_checks.pipeline_batches(torch, 2, DEVICE)
    assert len(batches) == pipeline_checks.PIPELINE_STEPS
    assert on_device(t for batch in batches for t in batch)


def test_optimizer_inputs_are_on_the_device() -> None:
    start, grads = optimizer_checks.optimizer_case(torch, DEVICE)
    assert on_device(start) and on_device(g for step in grads for g in step)
    assert len(grads) == training.OPTIMIZER_STEPS
    cpu_start, _ = optimizer_checks.optimizer_case(torch, "cpu")
    assert [tuple(t.shape) for t in cpu_start] == [tuple(t.shape) for t in start]
