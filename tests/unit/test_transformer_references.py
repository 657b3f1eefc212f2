"""The plain-torch references the transformer checks judge DeepSpeed's CUDA kernels by, proven here on the CPU
(the kernels need a GPU): GELU and the norms by hand and against torch's own functions, the BERT layer against
torch.nn.TransformerEncoderLayer with the same weights (forward and every gradient), and the checks'
measures and tolerances against kernels that are right and kernels that are wrong in the ways a layout or
fusion mistake would be."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from mlstack_ds.worker import transformer_checks as tc
from mlstack_ds.worker.protocol import SkipCheck

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture(scope="module")
def case() -> dict:
    """The checks' own case, in float64 on the CPU."""
    return tc.place(tc.transformer_case(torch), "cpu", torch.float64)


@pytest.fixture(scope="module")
def reference(case: dict) -> dict:
    """The reference's (output, gradients) for the checks' case, by pre_layer_norm (a float64 run takes
    seconds here)."""
    return {pre: tc.reference_run(torch, case, heads=tc.HEADS, pre_layer_norm=pre) for pre in (True, False)}


@pytest.fixture(scope="module")
def small() -> dict:
    """A smaller case (4 sequences of 32) for the tests that run many mutated layers."""
    case = tc.place(tc.transformer_case(torch, batch=4, seq=32), "cpu", torch.float64)
    return {"case": case, **{pre: tc.reference_run(torch, case, heads=tc.HEADS, pre_layer_norm=pre)
                             for pre in (True, False)}}


def hand_gelu(x: float) -> float:
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_gelu_is_the_tanh_form_by_hand_and_as_torch_has_it() -> None:
    xs = [-3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.5]
    got = tc.gelu_tanh(torch, torch.tensor(xs, dtype=torch.float64))
    assert got.tolist() == pytest.approx([hand_gelu(x) for x in xs], abs=1e-15)
    assert hand_gelu(1.0) == pytest.approx(0.841192, abs=1e-6)
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    assert torch.allclose(tc.gelu_tanh(torch, x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-15)
    assert not torch.allclose(tc.gelu_tanh(torch, x), F.gelu(x), rtol=0, atol=1e-4)  # not erf's


def test_layer_norm_and_rms_norm_by_hand_and_as_torch_has_them() -> None:
    w, b = torch.tensor([2.0, 3.0], dtype=torch.float64), torch.tensor([0.5, -1.0], dtype=torch.float64)
    # [1, 3]: mean 2, biased variance 1 -> [-1, 1] / sqrt(1 + eps)
    got = tc.layer_norm(torch, torch.tensor([1.0, 3.0], dtype=torch.float64), w, b, 0.25)
    assert got.tolist() == pytest.approx([-2 / math.sqrt(1.25) + 0.5, 3 / math.sqrt(1.25) - 1.0])
    # [3, 4]: mean square 12.5
    got = tc.rms_norm(torch, torch.tensor([3.0, 4.0], dtype=torch.float64), w, 0.5)
    assert got.tolist() == pytest.approx([6 / math.sqrt(13), 12 / math.sqrt(13)])
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((4, 7, 96), (96,), (96,)))
    assert torch.allclose(tc.layer_norm(torch, x, w, b, 1e-5), F.layer_norm(x, (96,), w, b, 1e-5), atol=1e-12)
    assert torch.allclose(tc.rms_norm(torch, x, w, 1e-5), F.rms_norm(x, (96,), w, 1e-5), atol=1e-12)


def encoder_layer(weights: dict, *, pre_layer_norm: bool):
    """torch's own encoder layer with DeepSpeed's weights: in_proj is attn_qkvw's Q, K, V blocks; norm1 is
    the norm before attention (Pre-LN) or after it (Post-LN), which DeepSpeed calls norm (Pre-LN) or attn_n."""
    hidden, intermediate = weights["attn_ow"].shape[0], weights["inter_w"].shape[0]
    layer = torch.nn.TransformerEncoderLayer(
        hidden, tc.HEADS, intermediate, dropout=0.0, activation=lambda t: F.gelu(t, approximate="tanh"),
        layer_norm_eps=tc.LAYER_NORM_EPS, batch_first=True, norm_first=pre_layer_norm, dtype=torch.float64)
    first, second = ("norm_", "attn_n") if pre_layer_norm else ("attn_n", "norm_")
    pairs = {"self_attn.in_proj_weight": "attn_qkvw", "self_attn.in_proj_bias": "attn_qkvb",
             "self_attn.out_proj.weight": "attn_ow", "self_attn.out_proj.bias": "attn_ob",
             "linear1.weight": "inter_w", "linear1.bias": "inter_b", "linear2.weight": "output_w",
             "linear2.bias": "output_b", "norm1.weight": f"{first}w", "norm1.bias": f"{first}b",
             "norm2.weight": f"{second}w", "norm2.bias": f"{second}b"}
    params = dict(layer.named_parameters())
    assert set(params) == set(pairs)
    with torch.no_grad():
        for name, ds_name in pairs.items():
            params[name].copy_(weights[ds_name])
    return layer, {ds_name: params[name] for name, ds_name in pairs.items()}


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-LN", "post-LN"])
def test_the_bert_layer_is_torchs_encoder_layer_forward_and_backward(case: dict, reference: dict,
                                                                     pre_layer_norm: bool) -> None:
    out, grads = reference[pre_layer_norm]
    layer, params = encoder_layer(case["weights"], pre_layer_norm=pre_layer_norm)
    x = case["x"].clone().requires_grad_()
    batch, _, _, seq = case["mask"].shape
    scores_mask = case["mask"].expand(batch, tc.HEADS, seq, seq).reshape(batch * tc.HEADS, seq, seq)
    want = layer(x, src_mask=scores_mask)
    want.backward(case["grad_out"])
    assert torch.allclose(out, want, rtol=0, atol=1e-10)
    assert torch.allclose(grads["input"], x.grad, rtol=0, atol=1e-10)
    for name in tc.WEIGHT_NAMES:
        assert torch.allclose(grads[name], params[name].grad, rtol=0, atol=1e-9), name


def test_padding_is_masked_per_key_and_sequence(case: dict, small: dict) -> None:
    """The last 8*b keys of sequence b are padding: changing them changes nothing else in that sequence."""
    assert (case["mask"][:, 0, 0, :] == tc.MASKED).sum(dim=1).tolist() == [8 * b for b in range(tc.BATCH)]
    out, _ = small[True]
    moved = {**small["case"], "x": small["case"]["x"].clone()}
    moved["x"][3, -24:] += 5.0  # sequence 3's padding (its own rows change, as BERT's queries are not masked)
    again, _ = tc.reference_run(torch, moved, heads=tc.HEADS, pre_layer_norm=True)
    assert torch.allclose(again[3, :-24], out[3, :-24], atol=1e-12)
    assert torch.allclose(again[:3], out[:3], atol=1e-12)
    assert not torch.allclose(again[3, -24:], out[3, -24:], atol=1e-3)


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-LN", "post-LN"])
def test_outputs_are_near_unit_size_and_both_branches_matter(case: dict, reference: dict,
                                                             pre_layer_norm: bool) -> None:
    """The forward tolerance, upstream's absolute 3e-2, is applied in units of mean|output|: about 1 here.
    And the layer is not nearly the identity (as at BERT's 0.02 weights), so a wrong branch cannot hide."""
    out, _ = reference[pre_layer_norm]
    assert 0.5 < float(out.abs().mean()) < 2.0
    if pre_layer_norm:
        assert float((out - case["x"]).abs().mean()) > 0.5


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-LN", "post-LN"])
def test_the_k_bias_gradient_is_zero_and_measured_against_q_and_v(reference: dict, pre_layer_norm: bool) -> None:
    qkvb, hidden = reference[pre_layer_norm][1]["attn_qkvb"], tc.HIDDEN
    q, _, v = (float(part.abs().mean()) for part in qkvb.split(hidden))
    assert float(qkvb[hidden:2 * hidden].abs().max()) < 1e-10 * (q + v)
    noise = 1e-3 * q
    noisy = qkvb.clone()
    noisy[hidden:2 * hidden] += noise  # noise where the gradient is 0
    errors = tc.layer_errors((None, {"attn_qkvb": noisy}), (torch.zeros(1), {"attn_qkvb": qkvb}), hidden)
    assert errors["attn_qkvb"] == pytest.approx(noise / ((q + v) / 2))


def float32_kernel(case: dict, pre_layer_norm: bool):
    """A right kernel that rounds: the reference computed in float32 from the same values."""
    as32 = {k: (v.float() if k != "weights" else {n: w.float() for n, w in v.items()}) for k, v in case.items()}
    weights = {n: w.clone().requires_grad_() for n, w in as32["weights"].items()}
    x = as32["x"].clone().requires_grad_()
    out = tc.bert_layer_reference(torch, x, as32["mask"], weights, heads=tc.HEADS, pre_layer_norm=pre_layer_norm,
                                  eps=tc.LAYER_NORM_EPS)
    out.backward(as32["grad_out"])
    return out.detach(), {"input": x.grad, **{n: weights[n].grad for n in tc.WEIGHT_NAMES}}


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-LN", "post-LN"])
def test_a_float32_kernel_passes_the_fp32_tolerance_with_room(case: dict, reference: dict,
                                                              pre_layer_norm: bool) -> None:
    want = reference[pre_layer_norm]
    errors = tc.layer_errors(float32_kernel(case, pre_layer_norm), want, tc.HIDDEN)
    assert set(errors) == {"output", "input", *tc.WEIGHT_NAMES}
    forward, backward = tc.layer_tolerance("float32", pre_layer_norm, stochastic=False)
    assert tc.judge_layer("float32", errors, (forward, backward)) == []
    assert max(errors.values()) < backward / 20  # the tolerance leaves room for a GPU's fp32 rounding


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-LN", "post-LN"])
def test_an_fp16_computation_passes_the_fp16_tolerance_with_room(pre_layer_norm: bool) -> None:
    """Every op of the layer in fp16 on the CPU, a harsher rounding than the kernel's (its GEMMs and norm
    statistics accumulate in fp32), still lands within a third of upstream's fp16 tolerances."""
    case16 = tc.place(tc.transformer_case(torch), "cpu", torch.float16)
    weights = {n: w.clone().requires_grad_() for n, w in case16["weights"].items()}
    x = case16["x"].clone().requires_grad_()
    out = tc.bert_layer_reference(torch, x, case16["mask"], weights, heads=tc.HEADS, pre_layer_norm=pre_layer_norm,
                                  eps=tc.LAYER_NORM_EPS)
    out.backward(case16["grad_out"])
    got = (out.detach(), {"input": x.grad, **{n: weights[n].grad for n in tc.WEIGHT_NAMES}})
    forward, backward = tc.layer_tolerance("float16", pre_layer_norm, stochastic=False)
    want = tc.reference_run(torch, case16, heads=tc.HEADS, pre_layer_norm=pre_layer_norm)  # from the fp16 values
    errors = tc.layer_errors(got, want, tc.HIDDEN)
    assert errors["output"] < forward / 2.5 and max(errors.values()) < backward / 5, errors


def swap_norms(case):
    w = dict(case["weights"])
    w["norm_w"], w["attn_nw"], w["norm_b"], w["attn_nb"] = w["attn_nw"], w["norm_w"], w["attn_nb"], w["norm_b"]
    return {**case, "weights": w}


def drop(name):
    return lambda case: {**case, "weights": {**case["weights"], name: torch.zeros_like(case["weights"][name])}}


def swap_q_and_k(case):
    w = dict(case["weights"])
    h = tc.HIDDEN
    w["attn_qkvw"] = torch.cat((w["attn_qkvw"][h:2 * h], w["attn_qkvw"][:h], w["attn_qkvw"][2 * h:]))
    w["attn_qkvb"] = torch.cat((w["attn_qkvb"][h:2 * h], w["attn_qkvb"][:h], w["attn_qkvb"][2 * h:]))
    return {**case, "weights": w}


def interleave_heads(case):
    """The attention context read back with its heads interleaved (as a wrong 0213 transform would)."""
    w = dict(case["weights"])
    w["attn_ow"] = w["attn_ow"].reshape(tc.HIDDEN, tc.HEADS, -1).transpose(1, 2).reshape(tc.HIDDEN, tc.HIDDEN)
    return {**case, "weights": w}


MISTAKES = {
    "norms swapped": swap_norms, "no attention-output bias": drop("attn_ob"), "no qkv bias": drop("attn_qkvb"),
    "no intermediate bias": drop("inter_b"), "no output bias": drop("output_b"), "Q and K swapped": swap_q_and_k,
    "heads interleaved in the context": interleave_heads,
    "mask ignored": lambda case: {**case, "mask": torch.zeros_like(case["mask"])},
}


@pytest.mark.parametrize("pre_layer_norm", [True, False], ids=["pre-LN", "post-LN"])
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_kernel_with_a_layout_mistake_fails_even_the_stochastic_fp16_tolerance(small: dict, mistake: str,
                                                                                pre_layer_norm: bool) -> None:
    want = small[pre_layer_norm]
    wrong = MISTAKES[mistake](small["case"])
    got = tc.reference_run(torch, wrong, heads=tc.HEADS, pre_layer_norm=pre_layer_norm)
    errors = tc.layer_errors(got, want, tc.HIDDEN)
    assert tc.judge_layer("float16", errors, tc.layer_tolerance("float16", pre_layer_norm, stochastic=True))


def test_pre_and_post_layer_norm_are_told_apart(reference: dict) -> None:
    pre, post = reference[True], reference[False]
    assert tc.judge_layer("x", tc.layer_errors(post, pre, tc.HIDDEN), tc.layer_tolerance("float16", True, True))


def test_judging_names_the_output_and_the_gradients_that_are_off() -> None:
    errors = {"output": 0.05, "input": 0.01, "attn_qkvw": 0.5, "norm_b": math.nan, "inter_b": math.inf}
    problems = tc.judge_layer("float16 Pre-LN", errors, (3e-2, 0.1))
    assert problems[0] == "float16 Pre-LN: forward output off by 0.05 x mean|reference| (tolerance 0.03)"
    assert problems[1].startswith("float16 Pre-LN: gradients off (x mean|reference|, tolerance 0.1): ")
    assert "attn_qkvw 0.5" in problems[1] and "norm_b nan" in problems[1] and "inter_b inf" in problems[1]
    assert "input" not in problems[1]
    assert tc.relative_error(None, torch.ones(2)) == math.inf
    assert tc.relative_error(torch.ones(3), torch.ones(2)) == math.inf


def test_tolerances_come_from_upstreams_tests() -> None:
    assert tc.layer_tolerance("float16", True, stochastic=False) == (3e-2, 0.1)
    assert tc.layer_tolerance("float16", False, stochastic=False) == (3e-2, 0.2)
    assert tc.layer_tolerance("float32", True, stochastic=False) == (5e-3, 5e-3)
    forward, backward = tc.layer_tolerance("float16", True, stochastic=True)
    assert forward == pytest.approx(7e-2) and backward == pytest.approx(0.1 * 7 / 3)
    assert (tc.BATCH, tc.HIDDEN, tc.SEQ, tc.HEADS) == (8, 160, 128, 2) and tc.SEQ % 16 == 0


def test_the_case_and_the_reference_stay_on_the_device() -> None:
    """Everything the layer check makes is on the rank's device: `meta` refuses a CPU tensor as a GPU would."""
    placed = tc.place(tc.transformer_case(torch), "meta", torch.float16)
    out, grads = tc.reference_run(torch, placed, heads=tc.HEADS, pre_layer_norm=False)
    assert out.device.type == "meta" and out.dtype == torch.float64
    assert all(g.device.type == "meta" for g in grads.values()) and len(grads) == 13


def test_the_case_is_the_same_every_time() -> None:
    a, b = tc.transformer_case(torch), tc.transformer_case(torch)
    assert torch.equal(a["x"], b["x"]) and torch.equal(a["mask"], b["mask"])
    assert all(torch.equal(a["weights"][n], b["weights"][n]) for n in tc.WEIGHT_NAMES)
    assert a["weights"]["attn_qkvw"].shape == (3 * tc.HIDDEN, tc.HIDDEN)
    assert a["weights"]["output_w"].shape == (tc.HIDDEN, tc.INTERMEDIATE)


class TorchInferenceModule:
    """pt_binding.cpp's exports as DeepSpeed 0.19.5 declares them, in torch: layer_norm(input, gamma, beta,
    eps), _layer_norm_residual(input, bias, residual, gamma, beta, eps), rms_norm(input, gamma, eps), and
    bias_add_<dtype>/bias_gelu_<dtype>(input, bias), which write into their input."""

    @staticmethod
    def layer_norm(x, gamma, beta, eps):
        return F.layer_norm(x.float(), x.shape[-1:], gamma.float(), beta.float(), eps).to(x.dtype)

    @staticmethod
    def _layer_norm_residual(x, bias, residual, gamma, beta, eps):  # noqa: PLR0917 (the binding's)
        summed = (x.float() + bias.float() + residual.float()).to(x.dtype)  # summed in fp32, rounded once
        return TorchInferenceModule.layer_norm(summed, gamma, beta, eps)

    @staticmethod
    def rms_norm(x, gamma, eps):
        return F.rms_norm(x.float(), x.shape[-1:], gamma.float(), eps).to(x.dtype)

    @staticmethod
    def bias_add_fp32(x, bias):
        return x.add_(bias)

    @staticmethod
    def bias_gelu_fp32(x, bias):
        return x.copy_(F.gelu(x + bias, approximate="tanh"))


def test_the_inference_runs_pass_a_right_kernel_and_leave_their_inputs_alone() -> None:
    norms, biases = tc.inference_inputs(torch)
    kept = biases["x"].clone()
    runs = tc.inference_runs(torch, TorchInferenceModule(), "fp32", norms, biases)
    assert [run[0] for run in runs] == ["layer_norm", "_layer_norm_residual", "rms_norm"] * 2 + [
        "bias_add_fp32", "bias_gelu_fp32"]
    rtol, atol = tc.INFERENCE_TOLERANCES["float32"]
    ratios = {(kernel, shape): tc.tolerance_ratio(got, want, rtol, atol) for kernel, shape, got, want in runs}
    assert max(ratios.values()) < 0.1, ratios
    assert torch.equal(biases["x"], kept)  # the in-place kernels were given a copy


def test_the_inference_tolerance_catches_a_wrong_kernel() -> None:
    norms, biases = tc.inference_inputs(torch)

    class ErfGelu(TorchInferenceModule):
        @staticmethod
        def bias_gelu_fp32(x, bias):
            return F.gelu(x + bias)

    class BiasIgnored(TorchInferenceModule):
        @staticmethod
        def _layer_norm_residual(x, bias, residual, gamma, beta, eps):  # noqa: PLR0917 (the binding's)
            return TorchInferenceModule.layer_norm(x + residual, gamma, beta, eps)

    rtol, atol = tc.INFERENCE_TOLERANCES["float32"]
    for module, kernel in ((ErfGelu(), "bias_gelu_fp32"), (BiasIgnored(), "_layer_norm_residual")):
        runs = tc.inference_runs(torch, module, "fp32", norms, biases)
        assert max(tc.tolerance_ratio(got, want, rtol, atol) for k, _, got, want in runs if k == kernel) > 1
    assert tc.tolerance_ratio(torch.ones(3), torch.ones(2), rtol, atol) == math.inf
    assert math.isnan(tc.tolerance_ratio(torch.tensor([math.nan]), torch.ones(1), rtol, atol))


def test_inference_dtypes_follow_the_device_and_the_build() -> None:
    acc = SimpleNamespace(is_fp16_supported=lambda: True, is_bf16_supported=lambda: True)
    assert tc.inference_dtypes(torch, acc, TorchInferenceModule()) == [torch.float32, torch.float16]
    with_bf16 = SimpleNamespace(bias_add_bf16=None)
    assert tc.inference_dtypes(torch, acc, with_bf16) == [torch.float32, torch.float16, torch.bfloat16]
    old = SimpleNamespace(is_fp16_supported=lambda: False, is_bf16_supported=lambda: False)
    assert tc.inference_dtypes(torch, old, with_bf16) == [torch.float32]
    assert set(tc.INFERENCE_SUFFIX) == set(tc.INFERENCE_TOLERANCES)


@pytest.mark.parametrize("check", tc.CHECKS, ids=lambda check: check.name)
def test_each_check_skips_off_cuda_naming_the_accelerator(check, monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    monkeypatch.setattr(tc, "require_built", lambda ctx, op: built.append(op))
    monkeypatch.setattr(tc, "accelerator", lambda: SimpleNamespace(_name="cpu"))
    with pytest.raises(SkipCheck, match=f"^{check.name} is a CUDA kernel and this rank's accelerator is 'cpu'$"):
        check.run(SimpleNamespace(torch=torch))
    assert built == [check.name] and check.needs == ("deepspeed", f"op:{check.name}")
