"""Parse DeepSpeed configs with an amd_specific section (no engine, no ops built); print JSON outcomes.

argv[1]: JSON object {case name: amd_specific section}. Prints `RESULTS {name: outcome}`, an outcome being
{"amd_config": {...} or null when the tree has none} or {"error": "<type>: <message>"}, then
`HELPERS <json>`: the amd_specific module's pure functions on fake ROCm facts (null without the module).
"""

import json
import sys

from deepspeed.runtime.config import DeepSpeedConfig

results = {}
for name, section in json.loads(sys.argv[1]).items():
    try:
        config = DeepSpeedConfig({"train_batch_size": 1, "zero_optimization": {"stage": 2},
                                  "amd_specific": section})
    except Exception as exc:  # the outcome under test, reported as data
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    else:
        amd_config = getattr(config, "amd_config", None)
        results[name] = {"amd_config": amd_config.model_dump() if amd_config is not None else None}
print("RESULTS " + json.dumps(results), flush=True)

try:
    from deepspeed.runtime import amd_specific
except ImportError:
    helpers = None
else:
    rocm_hip_version = "6.2.41134-65d174c3e"  # torch.version.hip of a ROCm 6.2 wheel
    helpers = {
        "rocm_on_cuda_accelerator": amd_specific.runs_on_rocm(rocm_hip_version, "cuda"),
        "cuda_torch": amd_specific.runs_on_rocm(None, "cuda"),
        "rocm_torch_on_cpu_accelerator": amd_specific.runs_on_rocm(rocm_hip_version, "cpu"),
        "highest_priority": amd_specific.highest_stream_priority((0, -1)),
        "highest_priority_wide": amd_specific.highest_stream_priority((0, -5)),
        "reservation_overlap_bf16": amd_specific.zero_bucket_reservation_bytes(
            100_000_000, 100_000_000, True, 2),
        "reservation_no_overlap_fp32": amd_specific.zero_bucket_reservation_bytes(
            500_000_000, 500_000_000, False, 4),
    }
print("HELPERS " + json.dumps(helpers), flush=True)
