"""mlstack-ds: install upstream DeepSpeed on AMD GPUs (ROCm), patched, prebuilt and verified."""

__version__ = "0.1.0"
