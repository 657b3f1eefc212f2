"""Run DeepSpeed's activation checkpointing on the CPU accelerator; print one JSON result per function.

Runs inside the test interpreter with DeepSpeed imported from a source tree (PYTHONPATH), DS_ACCELERATOR=cpu.
For each checkpoint function, forward and backward of a small module with dropout run once plainly and once
through the function, from the same seed (DeepSpeed restores the RNG state for the recomputation, so the
dropout masks agree); the result is the largest gradient difference, or the exception with the DeepSpeed
frame that raised it. Checkpointing is configured with its defaults (no partitioning, no CPU checkpointing:
with `checkpoint_in_cpu` the CPU accelerator loses the input in 0.19.5 and 0.19.8 alike, a separate bug).
configure() asks for the rank, so one gloo rank is set up; the only thing changed in DeepSpeed is that its
CPU shm comm op is marked incompatible, so the comm backend uses plain gloo instead of JIT-building it.

argv[1:]: names of functions in deepspeed.checkpointing ("checkpoint", "non_reentrant_checkpoint")
"""

import json
import os
import sys
import tempfile
import traceback

import deepspeed
import torch
from deepspeed import checkpointing
from deepspeed.accelerator import get_accelerator

SEED = 1234


def make_module():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4))


def gradients(module, checkpoint_function):
    """Gradients of the module's parameters and of its input after one forward and backward."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    inputs = torch.randn(3, 8, requires_grad=True)
    output = module(inputs) if checkpoint_function is None else checkpoint_function(module, inputs)
    (output * torch.arange(1.0, 5.0)).sum().backward()
    return [p.grad.clone() for p in module.parameters()] + [inputs.grad.clone()]


def raising_frame(exc):
    """`file:line` of the innermost DeepSpeed frame of the traceback, with its source line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/deepspeed/" in f.filename]
    if not frames:
        return None
    frame = frames[-1]
    path = frame.filename[frame.filename.rindex("/deepspeed/") + 1:]
    return {"where": f"{path}:{frame.lineno}", "code": frame.line}


def run(function_name):
    module = make_module()
    reference = gradients(module, None)
    try:
        checkpointed = gradients(module, getattr(checkpointing, function_name))
    except Exception as exc:  # the probe reports whatever DeepSpeed raised
        return {"error": f"{type(exc).__name__}: {exc}", "frame": raising_frame(exc)}
    return {
        "max_abs_diff": max((a - b).abs().max().item() for a, b in zip(reference, checkpointed, strict=True)),
        "gradients": len(reference),
        "nonzero": all(g.abs().sum().item() > 0 for g in checkpointed),
    }


# The shm op would take minutes to build and is never used: checkpointing does not communicate.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
with tempfile.TemporaryDirectory() as rendezvous:  # a file rendezvous needs no free port
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend="gloo")
checkpointing.configure(None)
print("ACCELERATOR " + get_accelerator().device_name())
for name in sys.argv[1:]:
    print("RESULT " + json.dumps({"function": name, **run(name)}), flush=True)
# No gloo worker left to race finalization (docs/abort-at-exit.md): destroy_process_group() alone was not
# always enough (a pipeline probe aborted with it under load), so the probe also leaves without finalization.
torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
