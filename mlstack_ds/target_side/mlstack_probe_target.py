"""The target probe, run in the *target* interpreter: `python mlstack_probe_target.py [quick] [receipt]`.

It prints `MLSTACK_TARGET_BASE:` (all that needs no torch, flushed before torch is imported) and then,
unless `quick`, `MLSTACK_TARGET_TORCH:`; detect/target_probe.py says why and reads both. `receipt` first
prints `MLSTACK_NODE_RECEIPT:`, the install receipt read where installed/receipt.py puts it: doctor
--hostfile sends this file's text to a node as one `python - receipt` here-document. Why an option and not
a second module's text glued in front: the node's answer stays one run of one file, and two files' top-level
names and `__main__` blocks never meet in one namespace.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import platform
import sys
import sysconfig
from importlib import metadata
from typing import Any

BASE_MARKER = "MLSTACK_TARGET_BASE:"
TORCH_MARKER = "MLSTACK_TARGET_TORCH:"
RECEIPT_MARKER = "MLSTACK_NODE_RECEIPT:"

# The libraries users train DeepSpeed through, whose versions decide whether a known DeepSpeed/client
# incompatibility applies (doctor's client rules, verify's report). Read from metadata: nothing is imported.
CLIENT_PACKAGES = ("transformers", "accelerate", "peft", "lightning", "pytorch-lightning")


def record_path(name: str) -> str | None:
    """Where the installed distribution's RECORD is, through importlib.metadata's public API."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    for item in dist.files or ():
        if item.name == "RECORD" and item.parent.name.endswith(".dist-info"):
            return str(dist.locate_file(item))
    return None


def receipt_answer(prefix: str) -> dict[str, Any]:
    """The receipt at `<prefix>/share/mlstack-ds/receipt.json` as text, or why it could not be read; a
    missing receipt is no error (nothing was installed by mlstack-ds)."""
    path = os.path.join(prefix, "share", "mlstack-ds", "receipt.json")
    try:
        with open(path, encoding="utf-8") as stream:
            text, error = stream.read(), None
    except FileNotFoundError:
        text, error = None, None
    except OSError as exc:
        text, error = None, str(exc)
    return {"path": path, "text": text, "error": error}


def rocm_sdk_facts(names: set[str]) -> dict[str, Any] | None:
    """TheRock's ROCm wheels, found without importing torch; package names carry a nonce, so globbed."""
    spec = importlib.util.find_spec("rocm_sdk")
    if spec is None or not spec.origin:
        return None
    site = os.path.dirname(os.path.dirname(spec.origin))
    info: dict[str, Any] = {
        "version": None, "version_source": None, "core": None, "devel_installed": False, "devel_root": None,
        "devel_expanded": False, "problem": None, "libraries": any(n.startswith("rocm-sdk-libraries") for n in names),
        "devices": sorted(n[len("rocm-sdk-device-"):] for n in names if n.startswith("rocm-sdk-device-gfx")),
        "scripts": sysconfig.get_paths().get("scripts")}
    try:
        import rocm_sdk
        info["version"], info["version_source"] = str(rocm_sdk.__version__), "rocm_sdk.__version__"
    except Exception as exc:
        info["problem"] = f"import rocm_sdk failed: {type(exc).__name__}: {exc}"

    def package(pattern: str) -> str | None:
        found = sorted(p for p in glob.glob(os.path.join(site, pattern))
                       if os.path.isfile(os.path.join(p, "__init__.py")))
        return found[0] if found else None

    info["core"] = package("_rocm_sdk_core*")
    if info["version"] is None and info["core"]:
        try:
            with open(os.path.join(info["core"], ".info", "version")) as stream:
                info["version"], info["version_source"] = stream.read().strip(), "_rocm_sdk_core/.info/version"
        except OSError:
            pass
    devel = importlib.util.find_spec("rocm_sdk_devel")
    info["devel_installed"] = devel is not None
    info["devel_root"] = package("_rocm_sdk_devel*")
    tarballs: list[str] = []
    if devel is not None and devel.origin:
        here = os.path.dirname(devel.origin)
        tarballs = [t for t in ("_devel.tar", "_devel.tar.xz") if os.path.exists(os.path.join(here, t))]
    info["devel_expanded"] = bool(info["devel_root"]) and not tarballs
    return info


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except Exception:
        return None


def base_facts() -> dict[str, Any]:
    """The first line's facts: the interpreter, DeepSpeed, torch's distribution, all without importing either."""
    paths = sysconfig.get_paths()
    base: dict[str, Any] = {
        "python": {"executable": sys.executable, "version": platform.python_version(), "prefix": sys.prefix,
                   "include_dir": paths.get("include"),
                   "site_packages": list(dict.fromkeys(p for p in (paths.get("purelib"), paths.get("platlib"))
                                                       if p))},
        "deepspeed": None, "deepspeed_package": None, "deepspeed_record": None,
        "torch_version": _version("torch"), "nvidia": []}
    try:
        dist = metadata.distribution("deepspeed")
        base["deepspeed"] = {"version": dist.version, "location": str(dist.locate_file(""))}
        base["deepspeed_record"] = record_path("deepspeed")
    except Exception:
        pass
    try:  # where `import deepspeed` would load from (found, not imported)
        spec = importlib.util.find_spec("deepspeed")
        if spec is not None and spec.submodule_search_locations:
            base["deepspeed_package"] = next(iter(spec.submodule_search_locations))
    except Exception:
        pass
    names = set()
    for d in metadata.distributions():
        with contextlib.suppress(Exception):
            names.add((d.metadata["Name"] or "").lower())
    base["nvidia"] = sorted(n for n in names if n.startswith("nvidia-"))
    # What builds the wheel (setuptools' bdist_wheel): setuptools, and before 70.1 the `wheel` package.
    base["python"]["setuptools"] = _version("setuptools")
    base["python"]["wheel_package"] = "wheel" in names
    base["rocm_sdk"] = rocm_sdk_facts(names)
    base["clients"] = {n: _version(n) for n in CLIENT_PACKAGES if _version(n)}
    return base


def torch_facts() -> dict[str, Any]:
    """The second line's facts, after `import torch`: its version, HIP/CUDA, the built archs, the devices."""
    out: dict[str, Any] = {"torch": None, "error": None}
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            out["error"] = f"import torch failed: {exc}"
        return out
    except Exception as exc:
        out["error"] = f"import torch failed: {type(exc).__name__}: {exc}"
        return out
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    info: dict[str, Any] = {"version": str(torch.__version__), "hip": hip, "cuda": cuda, "arch_list": [],
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
                info["devices"].append({"name": props.name, "gcn_arch_name": getattr(props, "gcnArchName", None)})
        except Exception as exc:
            out["error"] = f"torch device query failed: {type(exc).__name__}: {exc}"
    out["torch"] = info
    return out


def search_like_python_c() -> None:
    """Run by path, Python puts this file's directory first on sys.path; `python -c` (how this probe ran
    before) and `python -` (how a node gets it) put the current directory there. Kept so: what `import
    deepspeed` finds must not depend on how the probe was started."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main(argv: list[str]) -> int:
    search_like_python_c()
    if "receipt" in argv:
        print(RECEIPT_MARKER + json.dumps(receipt_answer(sys.prefix)), flush=True)
    print(BASE_MARKER + json.dumps(base_facts()), flush=True)
    if "quick" in argv:
        return 0
    print(TORCH_MARKER + json.dumps(torch_facts()), flush=True)
    return 0


def exit_without_teardown(code: int) -> None:
    """End the process once the answer is out: the interpreter's teardown of torch takes 0.3 s after it, and
    every install, build and doctor waits for this process. A probe that fails raises before this and ends
    as Python ends (its traceback, its exit status)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1:]))
