"""Print the -std flags DeepSpeed's op builders give the host compiler and hipcc, per torch version.

Runs inside the test interpreter with DeepSpeed imported from a source tree (PYTHONPATH). Only absent
hardware is faked: torch is told it is a ROCm build (torch.version.hip, the ROCm root torch found, with
AMD's .info/version) and, per case, which version it is. op_builder.builder reads TORCH_MAJOR/MINOR from
torch.__version__ once, at import, so op_builder is imported afresh for each version. DeepSpeed's own
cxx_args()/nvcc_args() run for real. For quantizer and fused_adam, the flags also go through the
installed torch's own JIT ninja-file writer (its HIP branch), which reports the -std hipcc finally gets:
the last one on its command line. That part is the installed torch's (2.13.0) code whatever version is pretended.

argv[1]: JSON list of torch versions, e.g. ["2.11.0+rocm6.4", "2.13.0+rocm7.2"]
"""

import importlib
import json
import os
import sys
import tempfile

import torch
from fake_rocm_torch import FAKE_ROCM_ROOT, cpp_extension  # noqa: F401  (first: torch acts as ROCm)

os.environ["PYTORCH_ROCM_ARCH"] = "gfx90a"  # torch's HIP flags want a target; no GPU here

# Builders whose ROCm nvcc_args() come from CUDAOpBuilder, and fused_adam, which passes no -std at all
# (torch's cpp_extension then adds its own default).
BUILDERS = {
    "quantizer": ("op_builder.quantizer", "QuantizerBuilder"),
    "transformer": ("op_builder.transformer", "TransformerBuilder"),
    "transformer_inference": ("op_builder.transformer_inference", "InferenceBuilder"),
    "fused_adam": ("op_builder.fused_adam", "FusedAdamBuilder"),
}


def std_flags(args):
    return [arg for arg in args if arg.startswith("-std=")]


def hipcc_std_in_torch_ninja_file(cxx_args, nvcc_args):
    """The last -std on the hipcc line of the build.ninja torch writes for a one-.cu extension."""
    directory = tempfile.mkdtemp(prefix="ninja-")
    path = os.path.join(directory, "build.ninja")
    cpp_extension._write_ninja_file_to_build_library(
        path, "probe_op", sources=[os.path.join(directory, "kernel.cu")], extra_cflags=cxx_args,
        extra_cuda_cflags=nvcc_args, extra_sycl_cflags=[], extra_ldflags=[], extra_include_paths=[],
        with_cuda=True, with_sycl=False, is_standalone=False)
    with open(path) as ninja_file:
        hipcc_line = next(line for line in ninja_file if line.startswith("cuda_cflags ="))
    return std_flags(hipcc_line.split())[-1]


def flags_for(version):
    torch.__version__ = version
    for name in [name for name in sys.modules if name == "op_builder" or name.startswith("op_builder.")]:
        del sys.modules[name]
    flags = {}
    for op, (module_name, class_name) in BUILDERS.items():
        builder = getattr(importlib.import_module(module_name), class_name)()
        flags[op] = {"cxx": std_flags(builder.cxx_args()), "hipcc": std_flags(builder.nvcc_args())}
        if op in ("quantizer", "fused_adam"):
            flags[op]["hipcc_effective"] = hipcc_std_in_torch_ninja_file(builder.cxx_args(), builder.nvcc_args())
    return flags


results = {version: flags_for(version) for version in json.loads(sys.argv[1])}
print("RESULTS " + json.dumps(results))
