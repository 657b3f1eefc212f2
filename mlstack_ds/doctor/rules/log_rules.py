"""Failures only a log shows: compiler and loader errors with a known cause and fix."""

from __future__ import annotations

import re

from mlstack_ds.doctor.model import Rule
from mlstack_ds.doctor.rules.wheel_rules import ROCM_HOME_FIX

RULES: tuple[Rule, ...] = (
    Rule(
        id="MLS-LOG-001", severity="error", title="HIP warp-sync builtins reject DeepSpeed's 32-bit masks",
        symptom="`static assertion failed ... The mask must be a 64-bit integer` in "
        "amd_warp_sync_functions.h (ROCm >= 6.2), building evoformer_attn or inference-v2 ops.",
        fix=("build without those ops: DS_BUILD_EVOFORMER_ATTN=0 DS_BUILD_INFERENCE_CORE_OPS=0",
             "never DS_BUILD_OPS=1 on ROCm; mlstack-ds install builds an allow-list of ops"),
        source="F09 (deepspeedai/DeepSpeed#7565, #7590, open upstream)",
        log_patterns=(re.compile(r"The mask must be a 64-bit integer"),),
    ),
    Rule(
        id="MLS-LOG-002", severity="error", title="Un-hipified CUDA header in a ROCm build",
        symptom="`fatal error: 'cuda_runtime_api.h' file not found` while building ops with DS_BUILD_OPS=1.",
        fix=("build only the ops you need (DS_BUILD_CPU_ADAM=1 DS_BUILD_FUSED_ADAM=1 ...), never "
             "DS_BUILD_OPS=1 on ROCm", "or: mlstack-ds install"),
        source="F11 (deepspeedai/DeepSpeed#3304, ROCm/apex#102)",
        log_patterns=(re.compile(r"cuda_runtime_api\.h'?:? (file not found|No such file)"),),
    ),
    Rule(
        id="MLS-LOG-003", severity="error", title="DeepSpeed built for its CPU accelerator (oneCCL) on ROCm",
        symptom="`fatal error: oneapi/ccl.hpp: No such file or directory`: no GPU was visible at build "
        "time, so DeepSpeed picked the CPU accelerator.",
        fix=("export DS_ACCELERATOR=cuda PYTORCH_ROCM_ARCH=<gfx...>   # then rebuild",
             "make /dev/kfd visible to the build (see MLS-DEV-001/002)"),
        source="F12 (lamikr/rocm_sdk_builder#8, #75; deepspeedai/DeepSpeed#5653)",
        log_patterns=(re.compile(r"oneapi/ccl\.hpp"),),
    ),
    Rule(
        id="MLS-LOG-004", severity="info", title="sparse_attn is not supported on ROCm (expected)",
        symptom="`[WARNING]  sparse_attn is not compatible with ROCM` in ds_report: by design upstream.",
        fix=("nothing to fix; leave it out of builds (DS_BUILD_SPARSE_ATTN=0)",),
        source="F13 (op_builder/sparse_attn.py; LUMI ds_report fixture)",
        log_patterns=(re.compile(r"sparse_attn is not compatible with ROCM"),),
    ),
    Rule(
        id="MLS-LOG-005", severity="error", title="torch is too old to hipify DeepSpeed",
        symptom="`TypeError: hipify() got an unexpected keyword argument 'hipify_extra_files_only'`.",
        fix=("install torch >= 1.12 built for ROCm",),
        source="F07 (deepspeedai/DeepSpeed#1816)",
        log_patterns=(re.compile(r"hipify\(\) got an unexpected keyword argument"),),
    ),
    Rule(
        id="MLS-LOG-006", severity="error", title="torch 2.3.0's hipify mapping lacks cuBLAS types",
        symptom="`error: unknown type name 'cublasGemmAlgo_t'; did you mean 'hipblasGemmAlgo_t'?`",
        fix=("pip install 'torch>=2.3.1' --index-url https://download.pytorch.org/whl/rocm<X.Y>",),
        source="F08 (deepspeedai/DeepSpeed#6795)",
        log_patterns=(re.compile(r"unknown type name 'cublasGemmAlgo_t'"),),
    ),
    Rule(
        id="MLS-LOG-007", severity="error", title="An op builder assumes CUDA_HOME on ROCm",
        symptom="`AssertionError: CUDA_HOME does not exist, unable to compile CUDA op(s)` or "
        "`TypeError: expected str, bytes or os.PathLike object, not NoneType` from op_builder.",
        fix=("mlstack-ds install   # DeepSpeed 0.19.5 with the ROCm fixes",
             "or leave that op out of the build (DS_BUILD_<OP>=0)"),
        source="F06 (deepspeedai/DeepSpeed#3091, PR #6456, PR #7224)",
        log_patterns=(re.compile(r"CUDA_HOME does not exist, unable to compile CUDA op"),),
    ),
    Rule(
        id="MLS-LOG-008", severity="error", title="An op failed to compile (torch JIT or DS_BUILD_*)",
        symptom="`RuntimeError: Error building extension '<op>'`: ninja failed; the cause is the first "
        "`error:` line of the compiler output above it (other MLS-LOG rules name the known ones).",
        fix=("search the log above for the first 'error:' line; rerun doctor with the whole log (--log)",
             "load the op verbosely: python -c \"import deepspeed.ops.op_builder as b; "
             "b.CPUAdamBuilder().load(verbose=True)\"   # the op named in the error",
             "mlstack-ds install   # prebuilt ops for this torch and GPU: no JIT at run time"),
        source="torch cpp_extension _run_ninja_build (`error_prefix`); deepspeedai/DeepSpeed#3094, #889, #5429, "
        "#4513 (cpu_adam JIT with hipcc on ROCm)",
        log_patterns=(re.compile(r"Error building extension '[^']+'"),),
    ),
    Rule(
        id="MLS-LOG-009", severity="error", title="A prebuilt or JIT-cached op does not match this torch",
        symptom="`ImportError: .../torch_extensions/.../<op>.so: undefined symbol: _ZN...`: the op was "
        "built against another torch (a C++ ABI change), and torch's JIT cache or the DeepSpeed install "
        "still holds the old library.",
        fix=("rm -rf ~/.cache/torch_extensions/py*_*/<op>   # the op's cached build; it is rebuilt on next load",
             "if the .so is inside site-packages/deepspeed: mlstack-ds install --force"),
        source="deepspeedai/DeepSpeed#3410 (fused_adam.so: undefined symbol "
        "_ZN3c104cuda20CUDACachingAllocator9allocatorE); huggingface/transformers#12715, PR #12723 "
        "(clear ~/.cache/torch_extensions after an upgrade)",
        log_patterns=(re.compile(r"ImportError: \S*(torch_extensions|deepspeed)\S*\.so: undefined symbol: _Z"),),
    ),
    Rule(
        id="MLS-LOG-011", severity="error", title="The prebuilt async_io op was not linked with libaio",
        symptom="`ImportError: .../deepspeed/ops/aio/async_io_op...so: undefined symbol: io_submit` at the first "
        "NVMe offload initialize: DeepSpeed built async_io ahead of time on the CPU accelerator, whose build "
        "(`CPUOpBuilder.builder()`) links the op's libraries_args() and drops its extra_ldflags() (-laio), up "
        "to 0.19.8 at least.",
        fix=("mlstack-ds install --force   # its series links the CPU async_io op with libaio (patch 0018)",
             "by hand: rebuild without DS_BUILD_AIO=1, so the op is JIT-compiled (and linked) at first use"),
        source="DeepSpeed 0.19.5 op_builder/cpu/builder.py and op_builder/cpu/async_io.py; reproduced here "
        "(tests/fixtures/doctor-logs/SOURCES.md); docs/patches.md, 0018",
        log_patterns=(re.compile(r"async_io_op\S*\.so: undefined symbol: io_submit"),),
    ),
    Rule(
        id="MLS-LOG-012", severity="error", title="The op link looked for libamdhip64 under the venv root",
        symptom="`/usr/bin/ld: cannot find -lamdhip64: No such file or directory`: with ROCm as TheRock's wheels, "
        "`which hipcc` is the venv's trampoline, so cpp_extension took the venv root for ROCM_HOME and links "
        "with `-L<venv>/lib`, where no libamdhip64 is.",
        fix=("<venv>/bin/rocm-sdk init   # needs rocm[devel] of the installed rocm version (MLS-ROCM-005)",
             ROCM_HOME_FIX + "   # the devel root; then rebuild",
             "with a system ROCm: export ROCM_HOME=<the ROCm root whose lib/ has libamdhip64.so>"),
        source="ROCm/aiter#3264 (the quoted linker line; reconstructed fixture, tests/fixtures/doctor-logs/"
        "SOURCES.md); pytorch#180211 (ROCM_HOME became the venv root)",
        log_patterns=(re.compile(r"cannot find -lamdhip64"),),
    ),
    Rule(
        id="MLS-LOG-013", severity="error", title="hipBLAS headers not found: ROCM_HOME is not the devel tree",
        symptom="`hipblas/hipblas.h: No such file or directory` (clang: `'hipblas/hipblas.h' file not found`) "
        "compiling an op that includes ATen's HIP headers: with TheRock's wheels, cpp_extension's ROCM_HOME is "
        "`_rocm_sdk_core`, which has the HIP runtime headers but not the math libraries'.",
        fix=("<venv>/bin/rocm-sdk init   # needs rocm[devel] of the installed rocm version (MLS-ROCM-005)",
             ROCM_HOME_FIX + "   # the devel root; then rebuild",
             "with a system ROCm: install its hipblas development package"),
        source="pytorch#196503 and #197449 (ROCM-30466: the quoted error building dummy_allocator in TestMemPool; "
        "reconstructed fixture, tests/fixtures/doctor-logs/SOURCES.md); pytorch#180723 (ROCM_HOME guessed as "
        "_rocm_sdk_core)",
        log_patterns=(re.compile(r"hipblas/hipblas\.h'?:? (No such file or directory|file not found)"),),
    ),
)
