"""Start-up shim for a build rehearsal: the build interpreter's torch reports itself as a ROCm build.

Copied as `sitecustomize.py` into a directory put on PYTHONPATH of the rehearsal's build processes
only. It changes nothing until torch is imported; then it sets what a ROCm wheel of the chosen
release reports (`torch.version.hip`, `torch.version.cuda = None`, `torch.__version__`) and, when
given, the archs the wheel was built for (`torch._C._cuda_getArchFlags`). torch's cpp_extension looks for ROCm only
when torch was compiled with a GPU runtime, which a CPU wheel was not, so its three ROCm globals
(`ROCM_HOME`, `HIP_HOME`, `IS_HIP_EXTENSION`) are set the way its own code sets them on a ROCm wheel,
right after it is imported. The runtime itself stays a CPU one (faking it would send torch's compiler
stack after CUDA entry points). Everything else (cpp_extension's compile logic, hipify, the C++
headers) is the real installed torch. Stdlib only.

One change is for speed alone: py-cpuinfo's `get_cpu_info()` is answered once per process. DeepSpeed's
builders ask it for every CPU op (`cxx_args`, `simd_width`), each time in a fresh subprocess of over a
second; the answer cannot change within a process, and this halves the rehearsal's time.
"""

import copy
import importlib.abc
import importlib.util
import json
import os
import sys

_SETTINGS = json.loads(os.environ.get("MLSTACK_REHEARSAL_TORCH", "{}"))


def _patch_version(module):
    module.hip = _SETTINGS.get("hip")
    module.cuda = _SETTINGS.get("cuda")
    module.__version__ = _SETTINGS["version"]


def _patch_c(module):
    arch_flags = _SETTINGS.get("arch_flags")
    if arch_flags is not None:
        module._cuda_getArchFlags = lambda: arch_flags


def _patch_cpp_extension(module):
    if not _SETTINGS.get("hip"):
        return
    guess = os.environ.get("MLSTACK_REHEARSAL_ROCM_GUESS")
    if guess and not (os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH")):
        # A ROCm-wheels venv: what this torch release's own _find_rocm_home() would answer there (the venv
        # root through `which hipcc` without pytorch#196503, the devel tree with it).
        module._find_rocm_home = lambda: guess
    module.ROCM_HOME = module._find_rocm_home()
    module.HIP_HOME = module._join_rocm_home("hip") if module.ROCM_HOME else None
    module.IS_HIP_EXTENSION = module.ROCM_HOME is not None


def _patch_cpuinfo(module):
    original = module.get_cpu_info
    answer = []

    def get_cpu_info():
        if not answer:
            answer.append(original())
        return copy.deepcopy(answer[0])

    module.get_cpu_info = get_cpu_info


_PATCHES = {"torch.version": _patch_version, "torch._C": _patch_c,
            "torch.utils.cpp_extension": _patch_cpp_extension, "cpuinfo": _patch_cpuinfo}


class _TorchFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module):
            original_exec(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _SETTINGS:
    sys.meta_path.insert(0, _TorchFinder())
