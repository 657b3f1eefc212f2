"""Stub torch reporting a ROCm build linked against TheRock's wheels (mlstack-ds rehearsal)."""
import json
import os

from torch import _rocm_init  # noqa: F401  (TheRock's torch wheels generate this module; it checks ROCm's version)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_standin.json"), encoding="utf-8") as _file:
    _VALUES = json.load(_file)

__version__ = _VALUES["version"]


class version:
    hip = _VALUES["hip"]
    cuda = None
    git_version = "stand-in"


class _C:
    @staticmethod
    def _cuda_getArchFlags():
        return _VALUES["arch_flags"]


class cuda:
    @staticmethod
    def get_arch_list():
        return _VALUES["arch_flags"].split()

    @staticmethod
    def device_count():
        return 0

    @staticmethod
    def is_available():
        return False
