"""Build DeepSpeed's cpu_lion op from the source tree (JIT) and step it beside the plain-PyTorch Lion.

Runs inside the test interpreter with DeepSpeed imported from a source tree (PYTHONPATH, cwd), DS_ACCELERATOR=cpu.
The op's C++ interface is driven directly (create_lion, lion_update), as DeepSpeedCPULion does: 0.19.5's CPU
accelerator has no cpu_lion builder, the CUDA one builds this CPU op alike. Prints one RESULT line: per step, the
largest |op - reference| and how many elements differ by more than 1e-5; the SIMD width the op was built for.
"""

import json
import sys

import torch
from op_builder.cpu_lion import CPULionBuilder

from mlstack_ds.worker.optimizer_references import lion_update

LR, BETAS, WEIGHT_DECAY, ELEMENTS, STEPS = 1e-4, (0.9, 0.99), 0.01, 1000, 3

builder = CPULionBuilder()
op = builder.jit_load(verbose=False)  # imports torch.utils.cpp_extension, which cxx_args() reads
simd = [flag for flag in builder.cxx_args() if flag.startswith("-D__AVX")]
op.create_lion(0, LR, *BETAS, WEIGHT_DECAY, False)
gen = torch.Generator().manual_seed(99)
param = torch.randn(ELEMENTS, generator=gen)
reference, momentum, state = param.clone(), torch.zeros(ELEMENTS), {}
steps = []
for step in range(1, STEPS + 1):
    grad = torch.randn(ELEMENTS, generator=gen)
    op.lion_update(0, step, LR, *BETAS, WEIGHT_DECAY, param, grad.clone(), momentum)
    lion_update(reference, grad, state, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    diff = (param - reference).abs()
    steps.append({"max_abs_diff": float(diff.max()), "off": int((diff > 1e-5).sum())})
print("RESULT " + json.dumps({"steps": steps, "simd": simd, "elements": ELEMENTS, "lr": LR}))
sys.stdout.flush()
