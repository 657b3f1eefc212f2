"""Build DeepSpeedZeroConfig objects on fake GPUs; print their bucket sizes as JSON.

Runs with DeepSpeed imported from a source tree and DS_ACCELERATOR=cuda (DeepSpeed's accelerator for
both CUDA and ROCm). Only absent hardware is faked: torch is told it is a ROCm build with one visible
GPU of the given memory. DeepSpeed's config parsing and validators run for real.

argv[1]: JSON list of {"gpu_gib": float | null (no ROCm GPU), "zero": {zero_optimization section}}
"""

import json
import sys
import types

import torch

torch.version.hip = "6.2.41134-65d174c3e"  # torch.version.hip of a ROCm 6.2 wheel
fake_gpu = types.SimpleNamespace(name="AMD Radeon RX 7900 XTX", total_memory=0)
torch.cuda.is_available = lambda: fake_gpu.total_memory > 0
torch.cuda.device_count = lambda: int(fake_gpu.total_memory > 0)
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_properties = lambda device=None: fake_gpu

from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402
from deepspeed.utils.logging import set_log_level_from_string  # noqa: E402

set_log_level_from_string("info")
results = []
for case in json.loads(sys.argv[1]):
    fake_gpu.total_memory = int((case["gpu_gib"] or 0) * 2**30)
    zero = DeepSpeedZeroConfig(**case["zero"])
    results.append([zero.reduce_bucket_size, zero.allgather_bucket_size])
print("RESULTS " + json.dumps(results), flush=True)
