"""tests/gpu: what needs a real accelerator. Every test collected here is marked `gpu` and, where torch is
missing or sees no GPU (CI, a CPU-only box), skipped with that reason, so a plain `pytest` stays green
and `pytest -rs` says why. scripts/gpu_check.sh runs them on a GPU machine (`pytest -m gpu tests/gpu`).
ROCm's torch answers through `torch.cuda` too, so one check covers both platforms.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# Set by scripts/gpu_check.py when its DeepSpeed install failed: the tests that need DeepSpeed skip with it.
NO_DEEPSPEED_ENV = "MLSTACK_GPU_CHECK_NO_DEEPSPEED"


def no_gpu_reason() -> str | None:
    """Why the tests here cannot run on this machine (None: torch sees a GPU)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed: the gpu tests need a CUDA or ROCm build of PyTorch and a GPU"
    import torch

    if not torch.cuda.is_available():
        return (f"no GPU visible: torch {torch.__version__} sees no CUDA or ROCm device "
                "(torch.cuda.is_available() is False)")
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m gpu` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not here:
        return
    reason = no_gpu_reason()
    for item in here:
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def device() -> Any:
    """The GPU the tests use: the current CUDA/ROCm device."""
    import torch

    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="session")
def installed_deepspeed() -> ModuleType:
    """DeepSpeed as installed in this interpreter (by `mlstack-ds install`); the test skips when the GPU
    check's install failed (with its reason) or when DeepSpeed is not installed."""
    failed = os.environ.get(NO_DEEPSPEED_ENV)
    if failed:
        pytest.skip(failed)
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed here: run mlstack-ds install first (scripts/gpu_check.sh does)")
    return importlib.import_module("deepspeed")
