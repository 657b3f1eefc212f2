"""DeepSpeed's own record of how it was built: `deepspeed/git_version_info_installed.py`.

DeepSpeed's setup.py writes it into every wheel (version, `installed_ops`, the torch/HIP/CUDA it was
built against). Both `install` (is the right build in place?) and `doctor` (does the build match the
machine?) need it, so it is read in one place, as literals, never executed: a broken or foreign
install must not run code in our process.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

RECORD_NAME = "git_version_info_installed.py"


@dataclass(frozen=True)
class DeepSpeedBuild:
    """What the build record says."""

    path: str
    version: str
    installed_ops: Mapping[str, bool]
    torch_version: str  # "2.3" or "0.0" when the wheel was built without torch
    hip_version: str  # "6.0" or "0.0"
    cuda_version: str
    accelerator: str

    @property
    def prebuilt_ops(self) -> list[str]:
        return sorted(name for name, on in self.installed_ops.items()
                      if on and name != "deepspeed_not_implemented")


def parse_git_version_info(text: str) -> dict[str, object]:
    """The literal assignments of `git_version_info_installed.py`, read without executing it."""
    values: dict[str, object] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return values
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def read_deepspeed_build(package_dir: Path, warnings: list[str]) -> DeepSpeedBuild | None:
    """The build record of the `deepspeed` package in `package_dir`, or None with a warning when it is
    absent (a source checkout, a broken install) or unreadable."""
    path = package_dir / RECORD_NAME
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        warnings.append(f"DeepSpeed build record {path} not found (a source checkout or a broken install)")
        return None
    values = parse_git_version_info(text)
    ops = values.get("installed_ops")
    torch_info = values.get("torch_info")
    if not isinstance(ops, dict) or not isinstance(torch_info, dict):
        warnings.append(f"DeepSpeed build record {path} has no installed_ops/torch_info")
        return None
    return DeepSpeedBuild(
        path=str(path),
        version=str(values.get("version", "")).strip(),
        installed_ops={str(k): bool(v) for k, v in ops.items()},
        torch_version=str(torch_info.get("version", "0.0")),
        hip_version=str(torch_info.get("hip_version", "0.0")),
        cuda_version=str(torch_info.get("cuda_version", "0.0")),
        accelerator=str(values.get("accelerator_name", "")),
    )
