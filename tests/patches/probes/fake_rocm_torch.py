"""Imported first by the probes: the test interpreter's torch acts as a ROCm 6.2 wheel.

Only absent hardware is faked: `torch.version.hip` is set, and torch's cpp_extension gets the ROCm root
it computes at import on a ROCm build (a temporary one with `.info/version`). DeepSpeed's code runs for
real. The probes run as scripts, so this directory is on sys.path.
"""

import os
import tempfile

import torch

torch.version.hip = "6.2.41134-65d174c3e"  # torch.version.hip of a ROCm 6.2 wheel
from torch.utils import cpp_extension  # noqa: E402

FAKE_ROCM_ROOT = tempfile.mkdtemp(prefix="fake-rocm-")
os.makedirs(os.path.join(FAKE_ROCM_ROOT, ".info"))
with open(os.path.join(FAKE_ROCM_ROOT, ".info", "version"), "w") as version_file:
    version_file.write("6.2.4-120\n")
cpp_extension.ROCM_HOME = FAKE_ROCM_ROOT  # what torch computes at import on a ROCm build
cpp_extension.IS_HIP_EXTENSION = True
