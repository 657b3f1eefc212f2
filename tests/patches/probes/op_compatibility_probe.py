"""Ask DeepSpeed's op builders whether their op can be built, on a fake ROCm machine; print JSON.

Runs inside the test interpreter with DeepSpeed imported from a source tree (PYTHONPATH). Only absent
hardware and toolkits are faked: torch is told it is a ROCm build (torch.version.hip, the ROCm root torch
found). evoformer_attn is asked twice: as the machine is (CUTLASS_PATH unset) and with CUTLASS_PATH naming
a minimal CUTLASS tree (include/cutlass/cutlass.h and a CHANGELOG.md naming 3.1.0, which is all its
is_compatible() looks at). Each builder's real is_compatible(verbose=True) runs; its warnings (printed on
stdout) are captured per op.
"""

import contextlib
import importlib
import io
import json
import os
import tempfile

from fake_rocm_torch import FAKE_ROCM_ROOT, cpp_extension  # noqa: F401  (first: torch acts as ROCm)

FAKE_CUTLASS = tempfile.mkdtemp(prefix="fake-cutlass-")
os.makedirs(os.path.join(FAKE_CUTLASS, "include", "cutlass"))
with open(os.path.join(FAKE_CUTLASS, "include", "cutlass", "cutlass.h"), "w") as header:
    header.write("#pragma once\n")
with open(os.path.join(FAKE_CUTLASS, "CHANGELOG.md"), "w") as changelog:
    changelog.write("# NVIDIA CUTLASS Changelog\n\n## [3.1.0] (2023-04-14)\n")

BUILDERS = {
    "cutlass_ops": ("op_builder.inference_cutlass_builder", "InferenceCutlassBuilder"),
    "ragged_device_ops": ("op_builder.ragged_ops", "RaggedOpsBuilder"),
    "inference_core_ops": ("op_builder.inference_core_ops", "InferenceCoreBuilder"),
    "evoformer_attn": ("op_builder.evoformer_attn", "EvoformerAttnBuilder"),
    "evoformer_attn+cutlass": ("op_builder.evoformer_attn", "EvoformerAttnBuilder"),
    "fused_adam": ("op_builder.fused_adam", "FusedAdamBuilder"),
    "fused_lamb": ("op_builder.fused_lamb", "FusedLambBuilder"),
    "quantizer": ("op_builder.quantizer", "QuantizerBuilder"),
    "ragged_ops": ("op_builder.ragged_utils", "RaggedUtilsBuilder"),
}

results = {}
for op, (module_name, class_name) in BUILDERS.items():
    if op == "evoformer_attn+cutlass":
        os.environ["CUTLASS_PATH"] = FAKE_CUTLASS  # read when the builder is made
    builder = getattr(importlib.import_module(module_name), class_name)()
    os.environ.pop("CUTLASS_PATH", None)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        compatible = builder.is_compatible(verbose=True)
    results[op] = {"compatible": compatible, "warnings": output.getvalue().strip()}
    if op in ("cutlass_ops", "ragged_device_ops"):  # what building them needs first: the dskernels package
        try:
            builder.extra_ldflags()
        except Exception as exc:  # the outcome under test, reported as data
            results[op]["extra_ldflags"] = f"{type(exc).__name__}: {exc}"
print("RESULTS " + json.dumps(results))
