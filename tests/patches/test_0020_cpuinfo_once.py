"""Patch 0020: DeepSpeed's op builders ask py-cpuinfo once per process, with the same flags as before.

`cpu_arch()` and `simd_width()` each call py-cpuinfo's `get_cpu_info()`, which runs py-cpuinfo again in a
subprocess of about a second; every CPU op's `cxx_args()` calls both. Counted here with py-cpuinfo's real
answer (the counter wraps it), for CPU ops built by setup.py and one loaded at run time.
"""

from __future__ import annotations

from pathlib import Path

from support.ds_patch import probe_result

PROBE = """
import json
import cpuinfo
calls = []
real = cpuinfo.get_cpu_info
def counted():
    calls.append(1)
    return real()
cpuinfo.get_cpu_info = counted
from op_builder.cpu import CPUAdamBuilder, FusedAdamBuilder, AsyncIOBuilder
from deepspeed.ops.op_builder.cpu import CPUAdamBuilder as RuntimeCPUAdamBuilder
flags = {type(b).__name__: b.cxx_args() for b in (CPUAdamBuilder(), FusedAdamBuilder(), AsyncIOBuilder())}
setup_calls = len(calls)
runtime_flags = RuntimeCPUAdamBuilder().cxx_args()
print("RESULT " + json.dumps({"setup_calls": setup_calls, "runtime_calls": len(calls) - setup_calls,
                              "flags": flags, "runtime_flags": runtime_flags}))
"""


def test_py_cpuinfo_is_asked_once_per_process(ds_tree: tuple[str, Path]) -> None:
    kind, tree = ds_tree
    found = probe_result(tree, "-c", PROBE)
    # the flags come from py-cpuinfo's answer either way: -march=native and this CPU's SIMD width
    assert all("-march=native" in args and any(a.startswith("-D__") for a in args)
               for args in [*found["flags"].values(), found["runtime_flags"]]), found
    calls = found["setup_calls"] + found["runtime_calls"]
    if kind == "pristine":  # twice per op: 4 builders here, each call a subprocess of about a second
        assert calls == 8, found
    else:  # once for the process (in a source tree both import paths reach one op_builder module)
        assert calls == 1, found
