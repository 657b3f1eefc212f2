"""DeepSpeed's transformer kernels (CUDA only) against plain PyTorch on the rank's device.

`prebuilt_ops` proves that `transformer`, `stochastic_transformer` and `transformer_inference` load; these
checks prove they compute:
- `transformer` and `stochastic_transformer`: one `DeepSpeedTransformerLayer` (BERT's layer, the training
  kernels), forward and backward, Pre-LN and Post-LN, fp32 and (where the device has it) fp16, against the
  same layer written here in torch, in float64, from the same weights. DeepSpeed's own tests
  (tests/unit/ops/accelerators/test_accelerator_forward.py and test_accelerator_backward.py) compare the
  layer with a BERT encoder in the same dtype; here the reference is exact, one layer, with the kernel's own
  GELU (the tanh form) and layer-norm epsilon, so what is left is the kernel's rounding.
- `transformer_inference`: the inference extension's small kernels (layer norm, residual layer norm, RMS norm,
  bias add, bias + GELU), called on the loaded module itself: the Python op wrappers
  (deepspeed/ops/transformer/inference/op_binding/) fall back to torch silently when a name is missing, so
  calling them could pass without running a kernel.

What the kernels compute was read in DeepSpeed 0.19.5 (the training layer is the same in 0.19.8):
csrc/transformer/ds_transformer_cuda.cpp (BertTransformerLayer::Forward/Backward), gelu_kernels.cu,
normalize_kernels.cu, softmax_kernels.cu, transform_kernels.cu, and csrc/transformer/inference/csrc/
(pt_binding.cpp's exports, gelu.cu, layer_norm.cu, rms_norm.cu).

The reference functions take `torch` and tensors and import nothing themselves (the worker imports torch
lazily); tests/unit/test_transformer_references.py proves them on the CPU against torch's own modules.
"""

from __future__ import annotations

import math

from .context import accelerator
from .optimizer_checks import require_built
from .protocol import Check, CheckFailed, SkipCheck

SEED = 123
# Upstream's forward and backward tests both run this layer: (batch 8, hidden 160, seq 128, heads 2,
# Pre-LN, fp16); the intermediate size is the config's default (4 * hidden), as in the forward test. The
# sequence is a multiple of 16, so DeepSpeedTransformerFunction does not pad it.
BATCH, SEQ, HIDDEN, HEADS = 8, 128, 160, 2
INTERMEDIATE = 4 * HIDDEN
LAYER_NORM_EPS = 1e-12  # DeepSpeedTransformerConfig's default layer_norm_eps, passed to both layer norms
# The layer's parameters, in DeepSpeedTransformerLayer's names and nn.Linear layout (out, in):
# attn_qkvw [3H, H] (Q, K, V blocks of H rows, each head's rows contiguous, transform_kernels.cu's
# bias_add_transform_0213), attn_ow [H, H], inter_w [I, H], output_w [H, I], their biases; norm_w/norm_b is
# the layer norm before attention (Pre-LN) or the last one (Post-LN), attn_nw/attn_nb the one between
# attention and the feed-forward block (BertTransformerLayer<T>::Forward).
WEIGHT_NAMES = ("attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb", "inter_w", "inter_b",
                "output_w", "output_b", "norm_w", "norm_b")
MASKED = -10000.0  # what BERT adds to the scores of padding (and DeepSpeedTransformerFunction to its own)
# gelu_kernels.cu (training) and inference/csrc/gelu.cu both compute the tanh form of GELU with these.
GELU_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715

# Layer tolerances: the worst |DeepSpeed - reference| over a tensor, in units of the reference's mean |value|
# over that tensor. That is upstream's backward measure (test_accelerator_backward.py, check_equal: atol =
# mean|x| * tolerance); its forward test bounds |difference| by an absolute 3e-2 (run_forward(atol=3e-2)),
# the same thing here since this layer's outputs have a mean |value| near 1 (a unit test holds that).
# - fp16 forward 3e-2: test_accelerator_forward.py, every case, fp16 and fp32 alike.
# - fp16 backward 0.1 for Pre-LN: test_accelerator_backward.py's (8,160,128,2,3,True,True, 0.1), this very
#   shape; 0.2 for Post-LN: its (64,160,128,2,24,False,True, 0.2), the Post-LN case at hidden 160.
# - fp32, forward and backward, 5e-3: upstream has no fp32 backward case and allows 3e-2 in fp32 forward
#   (three layers against a reference with erf GELU); here the reference is exact, one layer, tanh GELU,
#   so only fp32 rounding and the fast-math intrinsics (--use_fast_math, __expf in the softmax) are left,
#   ~1e-5 of a value. 5e-3 is six times tighter than upstream and still leaves >100x room for that.
#   Not yet measured on a GPU: the details report each case's worst error.
FP16_LAYER_TOLERANCE = {True: (3e-2, 0.1), False: (3e-2, 0.2)}  # pre_layer_norm -> (forward, backward)
FP32_LAYER_TOLERANCE = (5e-3, 5e-3)
# stochastic_mode drops block synchronisations from the reductions (`#ifndef __STOCHASTIC_MODE__` in
# normalize_kernels.cu, softmax_kernels.cu, general_kernels.cu): upstream documents it as faster, slightly
# non-deterministic. Its stochastic forward test allows 7e-2 where the regular one allows 3e-2
# (TestCUDAForwardStochastic, run_forward(atol=7e-2)); that ratio loosens every tolerance above. Upstream
# runs neither stochastic test: the forward one's cases are all commented out, and the backward one
# (commented out, deleted in #3850) allowed 0.07/0.05 Pre-LN and 0.1/0.2 Post-LN (fp32/fp16) over 24
# layers. So these bounds are upstream's intent, not something its CI holds.
STOCHASTIC_LOOSENING = 7e-2 / 3e-2

# Inference kernels: upstream's own tolerances for exactly these kernels (tests/unit/ops/transformer/
# inference/inference_test_utils.py, get_tolerances: (rtol, atol), used by test_layer_norm.py,
# test_rms_norm.py, test_bias_add.py, test_bias_gelu.py): |got - want| <= atol + rtol * |want| everywhere.
INFERENCE_TOLERANCES = {"float32": (5e-4, 5e-5), "float16": (3e-2, 2e-3), "bfloat16": (4.8e-1, 3.2e-2)}
INFERENCE_SUFFIX = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # pt_binding.cpp's DEF_OPS names
INFERENCE_EPS = 1e-5  # upstream's tests' epsilon
# Shapes from upstream's test grids: the norms at (32, 128, 768) and at (1, 1, 14432) (the kernel's
# unrolled schedule for long rows); the bias kernels at (2, 255, 1232) (a row not a power of two).
NORM_SHAPES = ((32, 128, 768), (1, 1, 14432))
BIAS_SHAPE = (2, 255, 1232)


# ---- references (plain torch) ----

def gelu_tanh(torch, x):
    """GELU's tanh form, as the kernels compute it: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)))


def layer_norm(torch, x, weight, bias, eps):
    """Layer norm over the last dimension: biased variance, epsilon inside the square root."""
    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    variance = (centred * centred).mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(variance + eps) * weight + bias


def rms_norm(torch, x, weight, eps):
    """RMS norm over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def bert_layer_reference(torch, x, mask, weights, *, heads, pre_layer_norm, eps):
    """BertTransformerLayer<T>::Forward without dropout, in torch: x [batch, seq, hidden], mask added to the
    attention scores, broadcast from [batch, 1, 1, seq] (one value per key), weights by DeepSpeed's names.

    Pre-LN:  h = x + Attn(LN(x; norm)) ; out = h + FFN(LN(h; attn_n))
    Post-LN: h = LN(x + Attn(x); attn_n) ; out = LN(h + FFN(h); norm)
    with Attn's scores scaled by 1/sqrt(head size) and FFN = output(gelu_tanh(inter(.))).
    """
    w = weights
    batch, seq, hidden = x.shape
    size = hidden // heads

    def attention(h):
        qkv = h @ w["attn_qkvw"].T + w["attn_qkvb"]
        q, k, v = (t.reshape(batch, seq, heads, size).transpose(1, 2) for t in qkv.split(hidden, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(size) + mask
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq, hidden)
        return context @ w["attn_ow"].T + w["attn_ob"]

    def feed_forward(h):
        return gelu_tanh(torch, h @ w["inter_w"].T + w["inter_b"]) @ w["output_w"].T + w["output_b"]

    if pre_layer_norm:
        h = x + attention(layer_norm(torch, x, w["norm_w"], w["norm_b"], eps))
        return h + feed_forward(layer_norm(torch, h, w["attn_nw"], w["attn_nb"], eps))
    h = layer_norm(torch, x + attention(x), w["attn_nw"], w["attn_nb"], eps)
    return layer_norm(torch, h + feed_forward(h), w["norm_w"], w["norm_b"], eps)


# ---- the layer checks ----

def transformer_case(torch, *, batch=BATCH, seq=SEQ, hidden=HIDDEN, intermediate=INTERMEDIATE, seed=SEED):
    """The input, mask, output gradient and weights, drawn on the CPU in fp32 from one seed (the same numbers
    on every platform). Weights at 1/sqrt(fan-in), so attention and the feed-forward block each move the
    output by about as much as the residual (at BERT's 0.02, as upstream draws them, the layer is nearly the
    identity and a wrong branch hides in the residual); biases and norm parameters away from 0 and 1, so a
    dropped bias or a swapped norm shows. The mask: a little noise on every key (the kernel adds it, not
    just thresholds it) and the last 8*b keys of sequence b padded out."""
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape, std=1.0, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    weights = {
        "attn_qkvw": draw(3 * hidden, hidden, std=hidden**-0.5), "attn_qkvb": draw(3 * hidden, std=0.2),
        "attn_ow": draw(hidden, hidden, std=hidden**-0.5), "attn_ob": draw(hidden, std=0.2),
        "attn_nw": draw(hidden, std=0.25, mean=1.0), "attn_nb": draw(hidden, std=0.25),
        "inter_w": draw(intermediate, hidden, std=hidden**-0.5), "inter_b": draw(intermediate, std=0.2),
        "output_w": draw(hidden, intermediate, std=intermediate**-0.5), "output_b": draw(hidden, std=0.2),
        "norm_w": draw(hidden, std=0.25, mean=1.0), "norm_b": draw(hidden, std=0.25),
    }
    mask = draw(batch, 1, 1, seq, std=0.5)
    for b in range(batch):
        mask[b, ..., seq - 8 * b:] = MASKED
    return {"x": draw(batch, seq, hidden), "mask": mask, "grad_out": draw(batch, seq, hidden), "weights": weights}


def place(case, device, dtype):
    """The case on `device` in `dtype` (the layer's): DeepSpeed and the reference start from these values."""
    return {name: ({k: w.to(device=device, dtype=dtype) for k, w in value.items()} if name == "weights"
                   else value.to(device=device, dtype=dtype)) for name, value in case.items()}


def reference_run(torch, case, *, heads, pre_layer_norm, eps=LAYER_NORM_EPS):
    """(output, {"input" and each weight name: gradient}) of the reference in float64, from a placed case."""
    weights = {name: w.detach().double().requires_grad_() for name, w in case["weights"].items()}
    x = case["x"].detach().double().requires_grad_()
    out = bert_layer_reference(torch, x, case["mask"].double(), weights, heads=heads, pre_layer_norm=pre_layer_norm,
                               eps=eps)
    out.backward(case["grad_out"].double())
    return out.detach(), {"input": x.grad, **{name: weights[name].grad for name in WEIGHT_NAMES}}


def deepspeed_run(torch, case, *, pre_layer_norm, stochastic, device, dtype):
    """The same through one DeepSpeedTransformerLayer (TransformerBuilder's or, stochastic,
    StochasticTransformerBuilder's kernels), its weights copied from the case."""
    from deepspeed.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer  # noqa: PLC0415

    batch, _, hidden = case["x"].shape
    config = DeepSpeedTransformerConfig(
        batch_size=batch, hidden_size=hidden, intermediate_size=case["weights"]["inter_w"].shape[0], heads=HEADS,
        attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, num_hidden_layers=1, initializer_range=0.02,
        layer_norm_eps=LAYER_NORM_EPS, seed=SEED, fp16=dtype == torch.float16, pre_layer_norm=pre_layer_norm,
        stochastic_mode=stochastic)
    layer = DeepSpeedTransformerLayer(config).to(device=device, dtype=dtype)
    layer.train()  # the kernels keep what backward needs only in training mode
    with torch.no_grad():
        for name in WEIGHT_NAMES:
            getattr(layer, name).copy_(case["weights"][name])
    x = case["x"].detach().clone().requires_grad_()
    out = layer(x, case["mask"])
    out.backward(case["grad_out"])
    return out.detach(), {"input": x.grad, **{name: getattr(layer, name).grad for name in WEIGHT_NAMES}}


def relative_error(got, want, scale=None):
    """max |got - want| in units of `scale` (default: mean |want|); inf when `got` is missing or misshapen,
    nan when it holds a nan."""
    if got is None or tuple(got.shape) != tuple(want.shape):
        return math.inf
    want = want.double()
    scale = float(want.abs().mean()) if scale is None else scale
    worst = float((got.double() - want).abs().max())
    return worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf)


def layer_errors(got, want, hidden):
    """{"output" and each gradient: relative_error}. The K third of attn_qkvb's gradient is 0 in exact
    arithmetic (a bias on every key adds one constant to a query's scores, which softmax ignores), so its
    scale is that of the Q and V thirds, and there DeepSpeed's value only has to be as small."""
    out, grads = got
    ref_out, ref_grads = want
    errors = {"output": relative_error(out, ref_out)}
    for name, ref in ref_grads.items():
        scale = None
        if name == "attn_qkvb":
            scale = float((ref[:hidden].double().abs().mean() + ref[2 * hidden:].double().abs().mean()) / 2)
        errors[name] = relative_error(grads.get(name), ref, scale)
    return errors


def significant(value):
    """Three significant digits for the report (errors here span 1e-7 to 1)."""
    return float(f"{value:.3g}")


def layer_tolerance(dtype_name, pre_layer_norm, stochastic):
    """(forward, backward) for a case: see FP16_LAYER_TOLERANCE, FP32_LAYER_TOLERANCE, STOCHASTIC_LOOSENING."""
    forward, backward = FP16_LAYER_TOLERANCE[pre_layer_norm] if dtype_name == "float16" else FP32_LAYER_TOLERANCE
    loosen = STOCHASTIC_LOOSENING if stochastic else 1.0
    return forward * loosen, backward * loosen


def judge_layer(label, errors, tolerance):
    """The problems in one case's errors: the output against the forward tolerance, gradients the backward."""
    forward, backward = tolerance
    problems = []
    if not errors["output"] <= forward:
        problems.append(f"{label}: forward output off by {errors['output']:.3g} x mean|reference| "
                        f"(tolerance {forward:.3g})")
    bad = {name: err for name, err in errors.items() if name != "output" and not err <= backward}
    if bad:
        listed = ", ".join(f"{name} {err:.3g}" for name, err in sorted(bad.items(), key=lambda item: -item[1]))
        problems.append(f"{label}: gradients off (x mean|reference|, tolerance {backward:.3g}): {listed}")
    return problems


def require_cuda(op_name):
    """The accelerator, when it is CUDA (torch.cuda, so ROCm too); otherwise skip: these ops are CUDA
    kernels."""
    acc = accelerator()
    if acc._name != "cuda":
        raise SkipCheck(f"{op_name} is a CUDA kernel and this rank's accelerator is {acc._name!r}")
    return acc


def layer_check(ctx, op_name, *, stochastic):
    """DeepSpeedTransformerLayer against bert_layer_reference, forward and backward, for each dtype and
    layer-norm placement. fp32 runs first: the extension's one cuBLAS handle is switched to
    CUBLAS_TENSOR_OP_MATH when an fp16 layer is created (BertTransformerLayer<T>::Initialize), which would
    let fp32 GEMMs run in reduced precision afterwards."""
    require_built(ctx, op_name)
    acc = require_cuda(op_name)
    torch = ctx.torch
    device = acc.current_device_name()
    dtypes = [torch.float32] + ([torch.float16] if acc.is_fp16_supported() else [])
    case = transformer_case(torch)
    details = {"batch": BATCH, "seq": SEQ, "hidden": HIDDEN, "heads": HEADS, "intermediate": INTERMEDIATE,
               "device": device, "stochastic_mode": stochastic, "cases": {},
               "measure": "max |DeepSpeed - reference| / mean |reference|, per tensor",
               "reference": "the same BERT layer in float64 torch (tanh GELU, layer-norm eps 1e-12)"}
    if len(dtypes) == 1:
        details["fp16"] = "not supported by this device"
    problems = []
    for dtype in dtypes:
        dtype_name = str(dtype).removeprefix("torch.")
        placed = place(case, device, dtype)
        for pre_layer_norm in (True, False):
            label = f"{dtype_name} {'Pre-LN' if pre_layer_norm else 'Post-LN'}"
            got = deepspeed_run(torch, placed, pre_layer_norm=pre_layer_norm, stochastic=stochastic, device=device,
                                dtype=dtype)
            want = reference_run(torch, placed, heads=HEADS, pre_layer_norm=pre_layer_norm)
            errors = layer_errors(got, want, HIDDEN)
            tolerance = layer_tolerance(dtype_name, pre_layer_norm, stochastic)
            worst = max((name for name in errors if name != "output"),
                        key=lambda name: errors[name] if not math.isnan(errors[name]) else math.inf)
            details["cases"][label] = {"forward": significant(errors["output"]), "backward_worst": worst,
                                       "backward": significant(errors[worst]),
                                       "tolerance": [significant(t) for t in tolerance]}
            problems.extend(judge_layer(label, errors, tolerance))
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


def check_transformer(ctx):
    """The training transformer layer (TransformerBuilder) computes BERT's layer, forward and backward."""
    return layer_check(ctx, "transformer", stochastic=False)


def check_stochastic_transformer(ctx):
    """The same layer with stochastic_mode=True (StochasticTransformerBuilder: the same sources built with
    __STOCHASTIC_MODE__), within upstream's looser stochastic tolerance."""
    return layer_check(ctx, "stochastic_transformer", stochastic=True)


# ---- the inference kernels ----

def inference_dtypes(torch, acc, module):
    """fp32 always; fp16 where the device has it; bf16 where the device has it and the extension was built
    with BF16_AVAILABLE (its bf16 names exist; `layer_norm` and `rms_norm` dispatch on dtype and, without it,
    return an unwritten tensor for bf16)."""
    dtypes = [torch.float32]
    if acc.is_fp16_supported():
        dtypes.append(torch.float16)
    if acc.is_bf16_supported() and hasattr(module, "bias_add_bf16"):
        dtypes.append(torch.bfloat16)
    return dtypes


def inference_inputs(torch, seed=SEED):
    """Upstream's distributions (randn values, residuals and biases, randn gamma, uniform beta) on the CPU in
    fp32, one set per norm shape and one for the bias kernels."""
    gen = torch.Generator().manual_seed(seed)
    norms = [{"x": torch.randn(shape, generator=gen), "residual": torch.randn(shape, generator=gen),
              "bias": torch.randn(shape[-1], generator=gen), "gamma": torch.randn(shape[-1], generator=gen),
              "beta": torch.rand(shape[-1], generator=gen)} for shape in NORM_SHAPES]
    biases = {"x": torch.randn(BIAS_SHAPE, generator=gen), "bias": torch.randn(BIAS_SHAPE[-1], generator=gen)}
    return norms, biases


def inference_runs(torch, module, suffix, norms, biases, *, eps=INFERENCE_EPS):
    """(kernel, shape, DeepSpeed's result, the float64 reference's) for each kernel, from placed tensors. The
    bias kernels work in place (ds_bias_add/ds_bias_gelu write into input.contiguous()), so they get a copy."""
    runs = []
    for t in norms:
        f = {name: value.double() for name, value in t.items()}
        shape = tuple(t["x"].shape)
        runs += [
            ("layer_norm", shape, module.layer_norm(t["x"], t["gamma"], t["beta"], eps),
             layer_norm(torch, f["x"], f["gamma"], f["beta"], eps)),
            ("_layer_norm_residual", shape,
             module._layer_norm_residual(t["x"], t["bias"], t["residual"], t["gamma"], t["beta"], eps),
             layer_norm(torch, f["x"] + f["bias"] + f["residual"], f["gamma"], f["beta"], eps)),
            ("rms_norm", shape, module.rms_norm(t["x"], t["gamma"], eps), rms_norm(torch, f["x"], f["gamma"], eps)),
        ]
    x, bias = biases["x"], biases["bias"]
    shape = tuple(x.shape)
    runs += [
        (f"bias_add_{suffix}", shape, getattr(module, f"bias_add_{suffix}")(x.clone(), bias),
         x.double() + bias.double()),
        (f"bias_gelu_{suffix}", shape, getattr(module, f"bias_gelu_{suffix}")(x.clone(), bias),
         gelu_tanh(torch, x.double() + bias.double())),
    ]
    return runs


def tolerance_ratio(got, want, rtol, atol):
    """max |got - want| / (atol + rtol |want|): at most 1 where allclose would pass; inf when `got` is
    misshapen, nan when it holds a nan."""
    if tuple(got.shape) != tuple(want.shape):
        return math.inf
    want = want.double()
    return float(((got.double() - want).abs() / (atol + rtol * want.abs())).max())


def check_transformer_inference(ctx):
    """InferenceBuilder's layer norms, RMS norm, bias add and bias + GELU equal torch's within upstream's
    tolerances for them, in every dtype the device and the build have."""
    require_built(ctx, "transformer_inference")
    acc = require_cuda("transformer_inference")
    torch = ctx.torch
    from deepspeed.ops.op_builder import InferenceBuilder  # noqa: PLC0415

    module = InferenceBuilder().load()
    device = acc.current_device_name()
    norms, biases = inference_inputs(torch)
    details = {"device": device, "kernels": {}, "measure": "max |DeepSpeed - reference| / (atol + rtol |reference|)",
               "reference": "torch in float64 from the same values"}
    problems = []
    for dtype in inference_dtypes(torch, acc, module):
        name = str(dtype).removeprefix("torch.")
        rtol, atol = INFERENCE_TOLERANCES[name]
        placed_norms = [{k: v.to(device=device, dtype=dtype) for k, v in t.items()} for t in norms]
        placed_biases = {k: v.to(device=device, dtype=dtype) for k, v in biases.items()}
        for kernel, shape, got, want in inference_runs(torch, module, INFERENCE_SUFFIX[name], placed_norms,
                                                       placed_biases):
            ratio = tolerance_ratio(got, want, rtol, atol)
            details["kernels"][f"{kernel} {name} {shape}"] = significant(ratio)
            if not ratio <= 1.0:
                problems.append(f"{kernel} ({name}, {shape}) misses torch by {ratio:.3g} times its tolerance "
                                f"(rtol {rtol:g}, atol {atol:g})")
    if problems:
        raise CheckFailed("; ".join(problems), details)
    return details


CHECKS = (
    Check("transformer", "DeepSpeedTransformerLayer (BERT training kernels) forward and backward match the same "
          "layer in torch, Pre-LN and Post-LN, fp32 and fp16 (skipped where not built or not CUDA)",
          ("deepspeed", "op:transformer"), check_transformer),
    Check("stochastic_transformer", "the same layer in stochastic mode, within upstream's looser tolerance "
          "(skipped where not built or not CUDA)", ("deepspeed", "op:stochastic_transformer"),
          check_stochastic_transformer),
    Check("transformer_inference", "the inference kernels' layer norms, RMS norm, bias add and bias + GELU match "
          "torch in fp32, fp16 and bf16 (skipped where not built or not CUDA)",
          ("deepspeed", "op:transformer_inference"), check_transformer_inference),
)
