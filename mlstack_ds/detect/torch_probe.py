"""Probe the *target* interpreter for torch (and an installed DeepSpeed) in a subprocess.

Why a subprocess: the target is often another venv, importing torch costs seconds and hundreds of
MB, and a broken torch must not take the CLI down with it. The probe prints one marked JSON line.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.detect.model import DeepSpeedInfo, PythonInfo, TorchDevice, TorchInfo
from mlstack_ds.errors import ToolError
from mlstack_ds.runner import Background, run_in_background

MARKER = "MLSTACK_PROBE_JSON:"
PROBE_TIMEOUT_S = 120.0

PROBE_SCRIPT = r"""
import json, platform, sys, sysconfig
out = {"python": {"executable": sys.executable, "version": platform.python_version(), "prefix": sys.prefix,
                  "include_dir": sysconfig.get_paths().get("include")},
       "torch": None, "torch_error": None, "deepspeed": None}
try:
    from importlib import metadata
    dist = metadata.distribution("deepspeed")
    out["deepspeed"] = {"version": dist.version, "location": str(dist.locate_file(""))}
except Exception:
    pass
try:
    import torch
except ModuleNotFoundError as exc:
    if exc.name != "torch":
        out["torch_error"] = "import torch failed: %s" % exc
except Exception as exc:
    out["torch_error"] = "import torch failed: %s: %s" % (type(exc).__name__, exc)
else:
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    info = {"version": str(torch.__version__), "hip": hip, "cuda": cuda, "arch_list": [],
            "device_count": 0, "devices": [], "path": str(getattr(torch, "__file__", "") or "")}
    if hip or cuda:
        try:
            # The archs the wheel was compiled for, read where get_arch_list() reads them: older torch
            # releases return [] from get_arch_list() on a host without a device (a build host).
            arch_flags = getattr(torch._C, "_cuda_getArchFlags", None)
            arch_flags = arch_flags() if arch_flags is not None else None
            info["arch_list"] = arch_flags.split() if arch_flags else list(torch.cuda.get_arch_list())
            info["device_count"] = int(torch.cuda.device_count())
            for i in range(info["device_count"]):
                props = torch.cuda.get_device_properties(i)
                info["devices"].append({"name": props.name,
                                        "gcn_arch_name": getattr(props, "gcnArchName", None)})
        except Exception as exc:
            out["torch_error"] = "torch device query failed: %s: %s" % (type(exc).__name__, exc)
    out["torch"] = info
print("MLSTACK_PROBE_JSON:" + json.dumps(out))
"""


@dataclass(frozen=True)
class ProbeResult:
    python: PythonInfo
    torch: TorchInfo | None
    deepspeed: DeepSpeedInfo | None
    warnings: list[str]


def parse_probe_output(stdout: str, python: Path) -> ProbeResult:
    """Turn the probe's marked line into dataclasses; junk gives warnings, not exceptions."""
    fallback_python = PythonInfo(executable=str(python), version="unknown")
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARKER)), None)
    if line is None:
        return ProbeResult(fallback_python, None, None, [f"{python}: the torch probe printed no result"])
    try:
        data = json.loads(line[len(MARKER):])
        py = data["python"]
        python_info = PythonInfo(executable=str(py["executable"]), version=str(py["version"]),
                                 prefix=py.get("prefix"), include_dir=py.get("include_dir"))
        torch_data = data.get("torch")
        torch_info = None
        if torch_data:
            torch_info = TorchInfo(
                version=str(torch_data["version"]),
                hip=torch_data.get("hip") or None,
                cuda=torch_data.get("cuda") or None,
                arch_list=[str(a) for a in torch_data.get("arch_list") or []],
                device_count=int(torch_data.get("device_count") or 0),
                devices=[
                    TorchDevice(name=str(d.get("name", "")), gcn_arch_name=d.get("gcn_arch_name"))
                    for d in torch_data.get("devices") or []
                ],
                path=torch_data.get("path") or None,
            )
        ds = data.get("deepspeed")
        ds_info = DeepSpeedInfo(version=str(ds["version"]), location=ds.get("location")) if ds else None
        warnings = [str(data["torch_error"])] if data.get("torch_error") else []
        return ProbeResult(python_info, torch_info, ds_info, warnings)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return ProbeResult(fallback_python, None, None, [f"{python}: unreadable torch probe result ({exc})"])


def start_probe(python: Path, env: dict[str, str],
                timeout: float = PROBE_TIMEOUT_S) -> AbstractContextManager[Background]:
    """Start the probe in `python`; collect it with `finish_probe` inside the block."""
    return run_in_background([python, "-c", PROBE_SCRIPT], timeout=timeout, env=env)


def finish_probe(python: Path, pending: Background) -> ProbeResult:
    """The probe's result; a missing, failing or hanging interpreter becomes a warning."""
    fallback = PythonInfo(executable=str(python), version="unknown")
    try:
        result = pending.result()
    except ToolError as exc:
        return ProbeResult(fallback, None, None, [f"torch probe: {exc.message}"])
    if not result.ok:
        tail = result.tail(3).replace("\n", " | ")
        return ProbeResult(
            fallback, None, None, [f"torch probe: {python} exited with {result.returncode}: {tail}"]
        )
    return parse_probe_output(result.stdout, python)
