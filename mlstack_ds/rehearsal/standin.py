"""Recording stand-in for hipcc and the host compiler/linker in a build rehearsal (stdlib only).

Installed as `hipcc` in the fake ROCm root and as `c++`/`g++`/`gcc`/`cc` on PATH. A compile or link
whose output lands in the source tree being built is recorded (argv, cwd, which tool) as one JSON file
in $MLSTACK_REHEARSAL_RECORDS and answered with an empty output file: nothing is compiled for real.
Everything else (DeepSpeed's `has_function` library probes in a temp dir, `-v`/`--version` queries)
runs the real host compiler named in $MLSTACK_REHEARSAL_REAL_CXX / _CC, so those answers stay true.

With $MLSTACK_REHEARSAL_SYNTAX_HIPCC set (Debian's hipcc), a hipcc compile is also checked for real
while its hipified source exists: device side only, for the first target, `-fsyntax-only`, with the
recorded flags and the stub headers in $MLSTACK_REHEARSAL_SYNTAX_STUBS first. The verdict is recorded.
"""

import json
import os
import subprocess
import sys
import time
import uuid

TOOL = os.path.basename(sys.argv[0])
ARGS = sys.argv[1:]


def output_path():
    for i, arg in enumerate(ARGS):
        if arg == "-o" and i + 1 < len(ARGS):
            return ARGS[i + 1]
        if arg.startswith("-o") and len(arg) > 2:
            return arg[2:]
    return None


def in_tree(path):
    tree = os.environ.get("MLSTACK_REHEARSAL_TREE_MARK", "")
    return bool(path and tree and tree in os.path.abspath(path))


def syntax_check():
    """Debian's hipcc on the translation unit being compiled: None when not asked for."""
    hipcc = os.environ.get("MLSTACK_REHEARSAL_SYNTAX_HIPCC")
    if TOOL != "hipcc" or not hipcc:
        return None
    keep = [a for a in ARGS if a.startswith(("-I", "-D", "-U", "-std=", "-include"))]
    archs = [a for a in ARGS if a.startswith("--offload-arch=")]
    # The first operand after `-c`: torch's ninja rule writes `-c -c <source>`.
    source = next(a for a in ARGS[ARGS.index("-c") + 1:] if not a.startswith("-"))
    stubs = os.environ.get("MLSTACK_REHEARSAL_SYNTAX_STUBS", "")
    argv = [hipcc, *archs[:1], "-nogpulib", "--cuda-device-only", "-fsyntax-only", "-D__HIP_PLATFORM_AMD__=1",
            *([f"-I{stubs}"] if stubs else []), *keep, source]
    # Debian's hipcc finds its own ROCm: not the fake root, not the stand-ins on PATH.
    env = {k: v for k, v in os.environ.items() if k not in ("ROCM_PATH", "ROCM_HOME", "HIP_PATH", "PYTHONPATH")}
    env.update(HIP_PLATFORM="amd", PATH=os.environ.get("MLSTACK_REHEARSAL_REAL_PATH", ""))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "first_error": f"could not run {hipcc}: {exc}"}
    errors = [ln for ln in done.stderr.splitlines() if "error:" in ln]
    return {"ok": done.returncode == 0, "first_error": errors[0] if errors else None}


def record(kind, output):
    directory = os.environ["MLSTACK_REHEARSAL_RECORDS"]
    entry = {"tool": TOOL, "kind": kind, "argv": [TOOL, *ARGS], "cwd": os.getcwd(),
             "output": os.path.abspath(output), "time_ns": time.time_ns(),
             "syntax": syntax_check() if kind == "compile" else None}
    path = os.path.join(directory, uuid.uuid4().hex + ".json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(entry, handle)
    os.rename(path + ".tmp", path)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "wb"):
        pass


def main():
    output = output_path()
    if in_tree(output) and "-c" in ARGS:
        record("compile", output)
        return 0
    if in_tree(output) and "-shared" in ARGS:
        record("link", output)
        return 0
    if TOOL == "hipcc":
        if "--version" in ARGS or "-v" in ARGS:
            print("HIP version: " + os.environ.get("MLSTACK_REHEARSAL_HIP_VERSION", "unknown"))
            return 0
        sys.stderr.write(f"hipcc (rehearsal stand-in): refusing an unrecorded call: {' '.join(ARGS)}\n")
        return 1
    real = os.environ["MLSTACK_REHEARSAL_REAL_CC" if TOOL in ("cc", "gcc") else "MLSTACK_REHEARSAL_REAL_CXX"]
    os.execv(real, [real, *ARGS])
    return 1


sys.exit(main())
