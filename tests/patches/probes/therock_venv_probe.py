"""Run DeepSpeed's ROCm detection (OpBuilder.installed_rocm_version(), get_rocm_gpu_arch(),
get_rocm_wavefront_size()) inside a fake TheRock venv; print one JSON result per scenario.

Runs as the fake venv's own interpreter (so sysconfig's scripts directory is that venv's bin/, where the
ROCm wheels put their trampolines), with DeepSpeed imported from a source tree (PYTHONPATH) and torch from
the test interpreter's site-packages (a .pth file of the fake venv chains them). Only absent software is
faked: torch is told it is a ROCm build (torch.version.hip, torch.__version__, the ROCm root torch found),
`_rocm_sdk_core/bin/rocminfo` replays a real capture, `rocm_sdk` is a package with a `__version__`.
DeepSpeed's own detection runs for real. PATH holds no rocminfo unless the scenario activates the venv
(then it holds the venv's bin/, as `source bin/activate` does); there is no /opt/rocm.

argv[1]: JSON {"venv": dir, "site_packages": dir, "scenarios": [{"name", "rocm_home": "core" | "devel" |
         "venv", "activated": bool, "env": {var: value}, "torch_version", "hip_version",
         "rocminfo": {"output", "status"}}]}
"""

import json
import os
import shutil
import stat
import sys
import sysconfig
import tempfile

import torch

torch.version.hip = "7.16.0"  # a ROCm torch; each scenario sets its own below
from op_builder.builder import OpBuilder  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

SPEC = json.loads(sys.argv[1])
VENV = SPEC["venv"]
SITE = SPEC["site_packages"]
ROOTS = {"core": os.path.join(SITE, "_rocm_sdk_core"), "devel": os.path.join(SITE, "_rocm_sdk_devel"),
         "venv": VENV}
BASE_ENV = dict(os.environ)
NOTHING_ON_PATH = tempfile.mkdtemp(prefix="empty-path-")
CAT = shutil.which("cat")  # the replay runs with the scenario's PATH, which has no /bin


def install_rocminfo(output, status):
    """The wheel's real tool, _rocm_sdk_core/bin/rocminfo, as a replay of a capture."""
    tool = os.path.join(ROOTS["core"], "bin", "rocminfo")
    with open(tool + ".out", "w") as out:
        out.write(output)
    with open(tool, "w") as out:
        out.write(f"#!/bin/sh\n'{CAT}' '{tool}.out'\nexit {status}\n")
    os.chmod(tool, os.stat(tool).st_mode | stat.S_IXUSR)


def outcome(method):
    try:
        return {"value": method()}
    except Exception as exc:  # the outcome under test, reported as data
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_scenario(scenario):
    os.environ.clear()
    os.environ.update(BASE_ENV)
    os.environ.update(scenario["env"])
    path = [os.path.join(VENV, "bin")] if scenario["activated"] else []
    os.environ["PATH"] = os.pathsep.join([*path, NOTHING_ON_PATH])
    install_rocminfo(scenario["rocminfo"]["output"], scenario["rocminfo"]["status"])
    torch.__version__ = scenario["torch_version"]
    torch.version.hip = scenario["hip_version"]
    cpp_extension.ROCM_HOME = ROOTS[scenario["rocm_home"]]
    # per-process caches: one fake machine per scenario
    OpBuilder._is_rocm_pytorch = None
    OpBuilder._rocm_version = None
    OpBuilder._rocm_gpu_arch = None
    OpBuilder._rocm_wavefront_size = None
    version = outcome(OpBuilder.installed_rocm_version)
    if "value" in version:
        version["value"] = list(version["value"])
    return {"version": version, "arch": outcome(OpBuilder.get_rocm_gpu_arch),
            "wavefront": outcome(OpBuilder.get_rocm_wavefront_size)}


results = {s["name"]: run_scenario(s) for s in SPEC["scenarios"]}
results["scripts_dir"] = sysconfig.get_path("scripts")
print("RESULTS " + json.dumps(results))
