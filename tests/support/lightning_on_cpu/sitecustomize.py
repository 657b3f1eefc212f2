"""Test-only: lift Lightning's CPU refusal of DeepSpeed in a verify rank, so the `lightning_deepspeed` check's GPU
path (Trainer.fit under DeepSpeedStrategy, compared with plain torch) runs for real on this GPU-less machine.

Put this directory on PYTHONPATH; Python imports `sitecustomize` at start-up. Only the ranks (RANK is set) are
changed. Three gates stand between Lightning 2.6 and a CPU run, each lifted here and nowhere in the product:
the strategy's `isinstance(accelerator, CUDAAccelerator)` test, its device-index validation (CPU devices have
no index), and the `device_rank=root_device.index` (None on the CPU) it hands to `deepspeed.initialize`.
"""

import os

if os.environ.get("RANK") is not None:
    import deepspeed
    import lightning.fabric.strategies.deepspeed as fabric_deepspeed
    import lightning.pytorch.strategies.deepspeed as pytorch_deepspeed
    from lightning.fabric.accelerators import CPUAccelerator as FabricCPU
    from lightning.pytorch.accelerators import CPUAccelerator as PytorchCPU

    pytorch_deepspeed.CUDAAccelerator = (pytorch_deepspeed.CUDAAccelerator, PytorchCPU)
    fabric_deepspeed.CUDAAccelerator = (fabric_deepspeed.CUDAAccelerator, FabricCPU)
    pytorch_deepspeed._validate_device_index_selection = lambda devices: None
    initialize = deepspeed.initialize

    def initialize_with_a_rank(*args, **kwargs):
        if getattr(kwargs.get("args"), "device_rank", 0) is None:
            kwargs["args"].device_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return initialize(*args, **kwargs)

    deepspeed.initialize = initialize_with_a_rank
