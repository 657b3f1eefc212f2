"""Environment detection: pure parsers of tool output, probes that run the tools, and the `Environment`."""

from mlstack_ds.detect.environment import detect
from mlstack_ds.detect.model import Environment

__all__ = ["Environment", "detect"]
