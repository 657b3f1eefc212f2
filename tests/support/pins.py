"""The torch pin and DeepSpeed's runtime requirements, as requirements/*.txt spell them (pip
requirement files, which scripts/test.sh hands to pip before any venv exists; everything in Python reads
them here)."""

from __future__ import annotations

from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"
TORCH_REQUIREMENTS = REQUIREMENTS / "torch.txt"
DEEPSPEED_RUNTIME_REQUIREMENTS = REQUIREMENTS / "deepspeed-runtime.txt"
CLIENT_REQUIREMENTS = REQUIREMENTS / "clients.txt"


def requirements(path: Path) -> tuple[str, ...]:
    """The requirement lines of a pip requirements file (comments and blank lines left out)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line)


(TORCH_PIN,) = requirements(TORCH_REQUIREMENTS)  # "torch==2.13.0"
TORCH_VERSION = TORCH_PIN.removeprefix("torch==")
# DeepSpeed 0.19.5's requirements/requirements.txt, minus torch (pinned above).
DEEPSPEED_RUNTIME_DEPS = requirements(DEEPSPEED_RUNTIME_REQUIREMENTS)
# What verify's client checks run on top of DeepSpeed (transformers, accelerate, peft, lightning), pinned; installed
# in the same pip call as TORCH_PIN (tests) or with the target's torch as a constraint (the wrapper's --with-clients).
CLIENT_PACKAGES = requirements(CLIENT_REQUIREMENTS)
