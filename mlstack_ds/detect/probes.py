"""Run ROCm/NVIDIA tools and collect what they report; every failure becomes a warning.

Tools are looked up on the caller's PATH first, then under `<rocm root>/bin`, so a user's own
ROCm build on PATH wins over the system one, and a bare `/opt/rocm` still works without PATH set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlstack_ds.detect import nvidia, rocminfo, smi, versions
from mlstack_ds.detect.model import GpuAgent, RocmInstall
from mlstack_ds.errors import ToolError
from mlstack_ds.patience import WAITS, Patience
from mlstack_ds.runner import RunResult, run, which

DEFAULT_ROCM_ROOT = Path("/opt/rocm")


@dataclass
class ToolContext:
    """Where to find tools and what environment to run them in; collects warnings as it goes."""

    environ: Mapping[str, str]
    rocm_root: Path | None
    patience: Patience = WAITS["rocm tool"]  # a hung driver uses no CPU; a slow machine does
    warnings: list[str] = field(default_factory=list)
    # Searched before PATH: the target venv's bin when it holds TheRock's ROCm wheels (their rocminfo,
    # amd-smi and hipcc trampolines are on PATH only while the venv is activated).
    first_dirs: tuple[Path, ...] = ()

    def find(self, tool: str) -> Path | None:
        for directory in self.first_dirs:
            candidate = directory / tool
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        extra = [self.rocm_root / "bin"] if self.rocm_root else []
        return which(tool, extra_dirs=extra, path=self.environ.get("PATH", ""))

    def run_tool(self, tool: str, *args: str) -> RunResult | None:
        """The tool's result when it ran and exited 0; None (with a warning if it exists) otherwise."""
        executable = self.find(tool)
        if executable is None:
            return None
        try:
            result = run([executable, *args], patience=self.patience, env=dict(self.environ))
        except ToolError as exc:
            self.warnings.append(f"{tool}: {exc.message}")
            return None
        if not result.ok:
            tail = result.tail(1) or "no output"
            command = " ".join([tool, *args])
            self.warnings.append(f"{command} exited with {result.returncode}: {tail}")
            return None
        return result


def find_rocm_root(environ: Mapping[str, str], default: Path = DEFAULT_ROCM_ROOT) -> Path | None:
    """`$ROCM_PATH`, else `$ROCM_HOME`, else `/opt/rocm`: the first that exists. A `/opt/rocm` that holds
    no ROCm of its own but `core-X.Y` directories (the 2026 system packages, `amdrocm-*`) gives the newest
    of those."""
    for candidate in (environ.get("ROCM_PATH"), environ.get("ROCM_HOME")):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    if not default.is_dir():
        return None
    if any((default / marker).exists() for marker in ("bin", ".info", "include", "lib")):
        return default
    cores = [p for p in default.glob("core-*") if p.is_dir() and versions.major_minor_key(p.name[5:])]
    return max(cores, key=lambda p: versions.major_minor_key(p.name[5:]) or (0, 0)) if cores else default


def rocm_version(ctx: ToolContext, torch_hip: str | None) -> RocmInstall | None:
    """Ask every source in order of trust; record which one answered."""
    root = ctx.rocm_root
    if root:
        for relative in (".info/version", ".info/version-dev"):
            version = _read_version_file(root / relative, versions.parse_info_version)
            if version:
                return RocmInstall(str(root), version, f"{root}/{relative}", version)
        for relative in ("include/rocm-core/rocm_version.h", "include/rocm_version.h"):
            version = _read_version_file(root / relative, versions.parse_rocm_version_header)
            if version:
                return RocmInstall(str(root), version, f"{root}/{relative}", version)
    result = ctx.run_tool("hipconfig", "--version")
    parsed = versions.parse_hip_version(result.stdout) if result else None
    if parsed:
        return _from_hip(ctx, root, parsed, "hipconfig --version")
    result = ctx.run_tool("amd-smi", "version")
    version = versions.parse_amd_smi_version(result.stdout) if result else None
    if version:
        return RocmInstall(str(root) if root else None, version, "amd-smi version", result.stdout.strip())
    parsed = versions.parse_hip_version(torch_hip) if torch_hip else None
    if parsed:
        return _from_hip(ctx, root, parsed, "torch.version.hip")
    if root:
        ctx.warnings.append(f"ROCm at {root}: could not determine its version from any source")
        return RocmInstall(str(root), None, None, None)
    return None


def _from_hip(ctx: ToolContext, root: Path | None, parsed: tuple[str, str], source: str) -> RocmInstall:
    """A HIP version names the ROCm release only up to ROCm 7.2 (the legacy stream numbered both alike);
    from TheRock's 7.14 on it does not (ROCm 10.1 reports HIP 7.16), so it is kept as the raw string only."""
    version, raw = parsed
    if versions.hip_names_rocm(version):
        return RocmInstall(str(root) if root else None, version, source, raw)
    ctx.warnings.append(f"{source} says HIP {version}, which does not name the ROCm release (ROCm 7.14 and later "
                        "number HIP apart): ROCm version unknown")
    return RocmInstall(str(root) if root else None, None, source, raw)


def _read_version_file(path: Path, parse: object) -> str | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parse(text)  # type: ignore[operator]


def amd_gpus(ctx: ToolContext, hsa_override: str | None) -> list[GpuAgent]:
    """rocminfo first; if it is missing or fails, amd-smi list + rocm-smi + rocm_agent_enumerator."""
    result = ctx.run_tool("rocminfo")
    if result is not None:
        agents = rocminfo.parse_rocminfo(result.stdout)
        if agents:
            return rocminfo.gpu_agents(agents, hsa_override)
        ctx.warnings.append("rocminfo printed no agents; trying the other ROCm tools")
    listed_result = ctx.run_tool("amd-smi", "list")
    named_result = ctx.run_tool("rocm-smi", "--showproductname")
    enum_result = ctx.run_tool("rocm_agent_enumerator")
    listed = smi.parse_amd_smi_list(listed_result.stdout) if listed_result else []
    named = smi.parse_rocm_smi_productname(named_result.stdout) if named_result else []
    archs = smi.parse_rocm_agent_enumerator(enum_result.stdout) if enum_result else []
    used = [name for name, res in (("amd-smi", listed_result), ("rocm-smi", named_result),
                                   ("rocm_agent_enumerator", enum_result)) if res is not None]
    gpus = smi.merge(listed, named, archs, source="+".join(used) or "none")
    if hsa_override:
        gpus = [GpuAgent(**{**g.__dict__, "spoofed": True}) for g in gpus]
    return gpus


def nvidia_gpus(ctx: ToolContext) -> list[GpuAgent]:
    result = ctx.run_tool("nvidia-smi", *nvidia.NVIDIA_SMI_QUERY)
    return nvidia.parse_nvidia_smi_csv(result.stdout) if result else []
