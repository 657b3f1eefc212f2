"""Stand-in of the `torch/_rocm_init.py` TheRock's torch wheels generate: the ROCm version check at import."""
import json
import os

import rocm_sdk

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_standin.json"), encoding="utf-8") as _file:
    rocm_sdk.initialize_process(check_version=json.load(_file)["rocm_version"])
