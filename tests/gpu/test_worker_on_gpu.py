"""The verify worker's computations on a real accelerator (issue 39), run by scripts/gpu_check.sh.

`verify` runs the same code through DeepSpeed's launcher; these call it directly, so a failure names the
function, and they print what they measured (pytest -s, or the gpu check's log)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from mlstack_ds.worker import optimizer_checks, pipeline_checks, training
from mlstack_ds.worker.optimizer_references import ReferenceOptimizer, lamb_update, lion_update

torch = pytest.importorskip("torch")
DEVICE = "cuda"  # ROCm's torch answers through torch.cuda too


def on_device(tensors) -> bool:
    return all(t is not None and t.device.type == DEVICE for t in tensors)


def test_checkpointed_block_inputs_and_gradients_are_on_the_gpu() -> None:
    outputs = pipeline_checks.checkpoint_gradients(SimpleNamespace(torch=torch), lambda fn, x: fn(x), DEVICE)
    assert on_device(outputs)


def test_the_paired_reference_trains_on_the_gpu() -> None:
    _, reference, optimizer = training.paired_models(torch, DEVICE, seed=1234)
    tokens, targets = training.global_batch(torch, 2, DEVICE)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = reference(tokens, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert on_device(reference.parameters()) and losses[-1] < losses[0]


@pytest.mark.parametrize("name", ["lamb", "lion"])
def test_the_references_agree_on_the_gpu_and_the_cpu(name: str) -> None:
    """The references are plain tensor arithmetic: a device changes only their rounding."""
    update = {"lamb": lambda p, g, s: lamb_update(p, g, s, **optimizer_checks.LAMB),
              "lion": lambda p, g, s: lion_update(p, g, s, **optimizer_checks.LION)}[name]
    results = {}
    for device in ("cpu", DEVICE):
        start, grads = optimizer_checks.optimizer_case(torch, device)
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = ReferenceOptimizer(params, update)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g
            opt.step()
        results[device] = [p.detach().cpu() for p in params]
    worst = max(float((a - b).abs().max()) for a, b in zip(results["cpu"], results[DEVICE], strict=True))
    print(f"{name} reference, cuda vs cpu after {training.OPTIMIZER_STEPS} steps: max |diff| {worst:g}")
    # Lion: an element whose c is a rounding tie on one device moves 2*lr away (optimizer_checks.LION_TIE)
    assert worst <= (2 * optimizer_checks.LION["lr"] if name == "lion" else training.OPTIMIZER_ATOL)


def fused(deepspeed, op: str, module: str, cls: str):
    """The optimizer class, or a skip when its op was not built ahead of time (its module is the builder's
    absolute_name(), e.g. deepspeed.ops.lamb.fused_lamb_op, as verify's prebuilt_ops reads it)."""
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    builder = ALL_OPS.get(op)
    if not installed_ops.get(op) or builder is None or importlib.util.find_spec(builder.absolute_name()) is None:
        pytest.skip(f"{op} is not prebuilt in this DeepSpeed {deepspeed.__version__}")
    return getattr(importlib.import_module(module), cls)


FUSED = {"fused_lamb": ("deepspeed.ops.lamb", "FusedLamb", lamb_update, optimizer_checks.LAMB),
         "fused_lion": ("deepspeed.ops.lion", "FusedLion", lion_update, optimizer_checks.LION)}


@pytest.mark.parametrize("op", sorted(FUSED))
def test_fused_optimizer_matches_its_reference_on_the_gpu(installed_deepspeed, op: str) -> None:
    module, cls, update, hyper = FUSED[op]
    optimizer = fused(installed_deepspeed, op, module, cls)
    details = optimizer_checks.optimizer_against_reference(
        SimpleNamespace(torch=torch), lambda ps: optimizer(ps, **hyper),
        lambda ps: ReferenceOptimizer(ps, lambda p, g, s: update(p, g, s, **hyper)), label=cls,
        reference="reference", device=DEVICE, ties=optimizer_checks.lion_ties if op == "fused_lion" else None)
    print(f"{cls} vs the plain-PyTorch reference: {details}")
    assert details["max_abs_diff"] <= training.OPTIMIZER_ATOL


def test_each_gpu_is_read_as_a_target_and_covered_by_its_own() -> None:
    """The environment check's terms on a real GPU: a capability (`9.0`) or a gfx target id, never the
    device's name (which CUDA builds of torch put in gcnArchName)."""
    from mlstack_ds.worker.gpu_targets import coverage, device_targets, parse_cuda_target

    targets = device_targets(torch)
    print(f"device targets: {targets} ({torch.cuda.get_device_name(0)})")
    assert len(targets) == torch.cuda.device_count() > 0
    if torch.version.hip:
        assert all(t.startswith("gfx") for t in targets)
        assert all(coverage([t.split(":")[0]], [t])[t] for t in targets)  # a target without features covers
    else:
        major, minor = torch.cuda.get_device_capability(0)
        assert targets[0] == f"{major}.{minor}" and parse_cuda_target(targets[0]) is not None
        assert coverage([f"{major}.{minor}a"], targets[:1])[targets[0]]
        assert coverage([f"{major + 1}.0"], targets[:1])[targets[0]] is None
