"""Plain-PyTorch references for DeepSpeed's optimizers that torch.optim does not have: LAMB and Lion.

Each is written from the algorithm as DeepSpeed's kernels implement it (read in DeepSpeed 0.19.5's
csrc/lamb/fused_lamb_cuda_kernel.cu, csrc/lion/multi_tensor_lion.cu and cpu_lion_impl.cpp), in ordinary
tensor operations on whatever device the parameters are on, so a kernel built for the wrong target, or
miscompiled, shows as a difference and not as a pass:
- LAMB: Adam's moments without bias correction in the moments themselves; the update `m / (sqrt(v) + eps)
  + weight_decay * p`; the per-tensor trust ratio ||p|| / ||update|| clamped to [min_coeff, max_coeff]
  (1 where either norm is 0); the step `lr * sqrt(1 - beta2^t) / (1 - beta1^t)` (bias correction folded
  into the step size, as the kernel does).
- Lion: `c = beta1 * m + (1 - beta1) * g`; `p = p * (1 - lr * weight_decay) - lr * sign(c)`;
  `m = beta2 * m + (1 - beta2) * g`.

The functions take torch tensors and need no torch import of their own (the worker imports torch lazily).
"""

from __future__ import annotations

import math


def lamb_update(param, grad, state, *, lr, betas, eps, weight_decay, max_coeff, min_coeff, bias_correction=True):
    """One LAMB step of one tensor, in place; returns the trust ratio used (a float)."""
    beta1, beta2 = betas
    state["step"] = state.get("step", 0) + 1
    if "exp_avg" not in state:
        state["exp_avg"] = param.new_zeros(param.shape)
        state["exp_avg_sq"] = param.new_zeros(param.shape)
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    update = m / (v.sqrt() + eps) + weight_decay * param
    w_norm, u_norm = float(param.norm()), float(update.norm())
    coeff = 1.0
    if w_norm != 0 and u_norm != 0:
        coeff = min(max(w_norm / u_norm, min_coeff), max_coeff)
    step = state["step"]
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step) if bias_correction else lr
    param.add_(update, alpha=-step_size * coeff)
    return coeff


def lion_update(param, grad, state, *, lr, betas, weight_decay):
    """One Lion step of one tensor, in place; returns |c| (the sign's argument) for the caller's ties."""
    beta1, beta2 = betas
    if "exp_avg" not in state:
        state["exp_avg"] = param.new_zeros(param.shape)
    m = state["exp_avg"]
    c = m * beta1 + grad * (1 - beta1)
    param.mul_(1 - lr * weight_decay).add_(c.sign(), alpha=-lr)
    m.mul_(beta2).add_(grad, alpha=1 - beta2)
    return c.abs()


class ReferenceOptimizer:
    """The torch.optim-shaped wrapper the optimizer checks step: `step()` applies `update(p, p.grad, state)`
    to every parameter that has a gradient; `extras` keeps what each update returned, per parameter."""

    def __init__(self, params, update):
        self.params = list(params)
        self.update = update
        self.state = [{} for _ in self.params]
        self.extras = [None] * len(self.params)

    def step(self):
        for index, param in enumerate(self.params):
            if param.grad is not None:
                self.extras[index] = self.update(param.data, param.grad, self.state[index])
