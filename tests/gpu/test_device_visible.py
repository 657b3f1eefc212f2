"""The accelerator the GPU check runs on is usable: torch sees it, memory moves both ways, and a matmul
computed on it agrees with the CPU's (a broken driver, a wrong-arch torch or a bad device fails here first,
before any DeepSpeed check does)."""

from __future__ import annotations

from typing import Any


def test_a_matmul_on_the_gpu_agrees_with_the_cpu(device: Any) -> None:
    import torch

    assert torch.cuda.device_count() >= 1
    generator = torch.Generator().manual_seed(0)
    # float64: no TF32 or reduced-precision path, so the only difference is the order of the sums.
    a = torch.randn(512, 384, generator=generator, dtype=torch.float64)
    b = torch.randn(384, 256, generator=generator, dtype=torch.float64)
    on_gpu = a.to(device) @ b.to(device)
    assert on_gpu.device.type == "cuda"
    torch.cuda.synchronize(device)
    torch.testing.assert_close(on_gpu.cpu(), a @ b, rtol=1e-10, atol=1e-10)


def test_every_visible_gpu_reports_a_name_and_memory() -> None:
    import torch

    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        assert properties.name, f"GPU {index} has no name"
        assert properties.total_memory > 2**30, f"GPU {index} ({properties.name}) reports under 1 GiB"
