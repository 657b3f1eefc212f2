"""Run DeepSpeed's OpBuilder.installed_rocm_version() against fake ROCm roots; print one JSON result each.

Runs inside the test interpreter with DeepSpeed imported from a source tree (PYTHONPATH). Only absent
software is faked: torch is told it is a ROCm build (torch.version.hip, torch.__version__, the ROCm root
torch found), and each ROCm root holds only the files a scenario gives it (.info/version, rocm_version.h,
a bin/hipconfig that prints a real capture). DeepSpeed's own detection runs for real.

argv[1]: JSON list of {"name", "files": {relative path: content}, "hipconfig": output or null,
         "torch_version", "hip_version"}
"""

import contextlib
import io
import json
import os
import stat
import sys
import tempfile

import torch

torch.version.hip = "6.2.41134-65d174c3e"  # a ROCm torch; each scenario sets its own below
from op_builder.builder import OpBuilder  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402


def fake_rocm_root(files, hipconfig):
    root = tempfile.mkdtemp(prefix="fake-rocm-")
    for relative, content in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(content)
    if hipconfig is not None:
        os.makedirs(os.path.join(root, "bin"), exist_ok=True)
        tool = os.path.join(root, "bin", "hipconfig")
        with open(tool, "w") as out:
            out.write(f"#!/bin/sh\nprintf '%s' '{hipconfig}'\n")
        os.chmod(tool, os.stat(tool).st_mode | stat.S_IXUSR)
    return root


def run_scenario(scenario):
    torch.version.hip = scenario["hip_version"]
    torch.__version__ = scenario["torch_version"]
    cpp_extension.ROCM_HOME = fake_rocm_root(scenario["files"], scenario["hipconfig"])
    OpBuilder._rocm_version = None  # per-process cache: one fake machine per scenario
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output):
            version = OpBuilder.installed_rocm_version()
    except Exception as exc:  # the outcome under test, reported as data
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"version": list(version), "printed": output.getvalue().strip()}


results = {s["name"]: run_scenario(s) for s in json.loads(sys.argv[1])}
print("RESULTS " + json.dumps(results))
