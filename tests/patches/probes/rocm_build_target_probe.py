"""Run DeepSpeed's op builder set-up for fake ROCm machines; print one JSON result per scenario.

Runs inside the test interpreter with DeepSpeed imported from a source tree (PYTHONPATH). Only absent
hardware is faked: torch is told it is a ROCm build (torch.version.hip, the ROCm root torch found) and
`rocminfo` on PATH prints a real capture. DeepSpeed's own code (FusedLambBuilder.builder(), torch's
hipify and CUDAExtension) runs for real, in a scratch directory holding a copy of csrc/.

argv[1]: JSON list of {"name", "env": {var: value}, "path": dir with the fake rocminfo}
"""

import json
import os
import shutil
import sys
import tempfile

from fake_rocm_torch import FAKE_ROCM_ROOT, cpp_extension  # noqa: F401  (first: torch acts as ROCm)
from op_builder.builder import OpBuilder
from op_builder.fused_lamb import FusedLambBuilder

TREE = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["op_builder"].__file__)))
BASE_ENV = dict(os.environ)


def run_scenario(scenario):
    os.environ.clear()
    os.environ.update(BASE_ENV)
    os.environ.update(scenario["env"])
    os.environ["PATH"] = scenario["path"] + os.pathsep + BASE_ENV["PATH"]
    OpBuilder._rocm_gpu_arch = None  # per-process caches: one fake machine per scenario
    OpBuilder._rocm_wavefront_size = None
    scratch = tempfile.mkdtemp(prefix="ds-build-")
    shutil.copytree(os.path.join(TREE, "csrc"), os.path.join(scratch, "csrc"))
    os.chdir(scratch)
    try:
        extension = FusedLambBuilder().builder()
    except Exception as exc:  # the outcome under test, reported as data
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        os.chdir(TREE)
        shutil.rmtree(scratch)
    flags = [f for f in extension.extra_compile_args["nvcc"] if f.startswith("-DROCM_WAVEFRONT_SIZE=")]
    return {"wavefront_flags": flags, "PYTORCH_ROCM_ARCH": os.environ.get("PYTORCH_ROCM_ARCH")}


results = {s["name"]: run_scenario(s) for s in json.loads(sys.argv[1])}
print("RESULTS " + json.dumps(results))
