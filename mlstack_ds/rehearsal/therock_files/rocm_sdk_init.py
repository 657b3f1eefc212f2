"""Stand-in of TheRock's rocm_sdk (mlstack-ds rehearsal): version, start-up version check."""
import json
import os
import re
import warnings

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_standin.json"), encoding="utf-8") as _values:
    __version__ = json.load(_values)["version"]


def initialize_process(*, check_version=None, fail_on_version_mismatch=False, **_kwargs):
    if check_version and not re.match("^" + re.escape(check_version).replace("\\*", ".*") + "$", __version__):
        message = (f"The program was compiled against a ROCm version matching '{check_version}' but the installed "
                   f"ROCm version in this Python environment is {__version__}.")
        if fail_on_version_mismatch:
            raise RuntimeError(message)
        warnings.warn(message)  # noqa: B028  (as the real one: the warning names this file)
