"""The plain-PyTorch LAMB and Lion that fused_lamb, fused_lion and cpu_lion are judged against, checked
against steps computed by hand (issue 39), and the harness that compares an optimizer with its reference."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from mlstack_ds.worker import optimizer_checks
from mlstack_ds.worker.optimizer_references import ReferenceOptimizer, lamb_update, lion_update
from mlstack_ds.worker.protocol import CheckFailed

torch = pytest.importorskip("torch")
LAMB = {"lr": 0.1, "betas": (0.5, 0.75), "eps": 0.0, "weight_decay": 0.0, "max_coeff": 10.0, "min_coeff": 0.01}


def test_lamb_first_step_by_hand() -> None:
    # m = 0.5*g = [1, -1]; v = 0.25*g^2 = [1, 1]; update = m / sqrt(v) = [1, -1], |update| = sqrt 2;
    # |p| = 5, trust ratio 5 / sqrt 2; step size 0.1 * sqrt(1 - 0.75) / (1 - 0.5) = 0.1.
    p, state = torch.tensor([3.0, 4.0]), {}
    coeff = lamb_update(p, torch.tensor([2.0, -2.0]), state, **LAMB)
    assert coeff == pytest.approx(5 / math.sqrt(2))
    step = 0.1 * 5 / math.sqrt(2)
    assert p.tolist() == pytest.approx([3 - step, 4 + step])
    assert state["exp_avg"].tolist() == [1.0, -1.0] and state["exp_avg_sq"].tolist() == [1.0, 1.0]


def test_lamb_second_step_and_weight_decay_by_hand() -> None:
    p, state = torch.tensor([3.0, 4.0]), {}
    hyper = {**LAMB, "weight_decay": 0.5}
    lamb_update(p, torch.tensor([2.0, -2.0]), state, **hyper)
    p0 = p.clone()
    lamb_update(p, torch.tensor([2.0, 2.0]), state, **hyper)
    # m = 0.5*[1,-1] + 0.5*[2,2] = [1.5, 0.5]; v = 0.75*[1,1] + 0.25*[4,4] = [1.75, 1.75]
    m, v = torch.tensor([1.5, 0.5]), torch.tensor([1.75, 1.75])
    update = m / v.sqrt() + 0.5 * p0
    ratio = float(p0.norm() / update.norm())
    size = 0.1 * math.sqrt(1 - 0.75**2) / (1 - 0.5**2)
    assert p.tolist() == pytest.approx((p0 - size * ratio * update).tolist())


def test_lamb_trust_ratio_is_clamped_and_one_for_a_zero_tensor() -> None:
    p = torch.tensor([300.0, 400.0])
    assert lamb_update(p, torch.tensor([2.0, -2.0]), {}, **LAMB) == 10.0  # 500 / sqrt 2, clamped to max_coeff
    tiny = torch.tensor([3e-4, 4e-4])
    assert lamb_update(tiny, torch.tensor([2.0, -2.0]), {}, **LAMB) == 0.01  # clamped to min_coeff
    zero = torch.zeros(2)
    assert lamb_update(zero, torch.tensor([2.0, -2.0]), {}, **LAMB) == 1.0
    assert zero.tolist() == pytest.approx([-0.1, 0.1])


def test_lion_two_steps_by_hand() -> None:
    hyper = {"lr": 0.1, "betas": (0.9, 0.99), "weight_decay": 0.5}
    p, state = torch.tensor([1.0, -1.0]), {}
    lion_update(p, torch.tensor([0.5, -2.0]), state, **hyper)
    # c = 0.1*g = [0.05, -0.2]; p = p*(1 - 0.05) - 0.1*sign(c) = [0.85, -0.85]; m = 0.01*g
    assert p.tolist() == pytest.approx([0.85, -0.85])
    assert state["exp_avg"].tolist() == pytest.approx([0.005, -0.02])
    ties = lion_update(p, torch.tensor([-1.0, 1.0]), state, **hyper)
    # c = 0.9*m + 0.1*g = [-0.0955, 0.082]: the signs flip; p = p*0.95 + 0.1*[1, -1]
    assert p.tolist() == pytest.approx([0.9075, -0.9075])
    assert ties.tolist() == pytest.approx([0.0955, 0.082])


def harness(make_ds, make_ref, ties=None):
    ctx = SimpleNamespace(torch=torch)
    return optimizer_checks.optimizer_against_reference(ctx, make_ds, make_ref, label="candidate",
                                                        reference="reference", device="cpu", ties=ties)


def lion(ps, lr=1e-4):
    return ReferenceOptimizer(ps, lambda p, g, s: lion_update(p, g, s, **{**optimizer_checks.LION, "lr": lr}))


def test_the_harness_passes_an_equal_optimizer_and_names_the_step_of_a_wrong_one() -> None:
    lamb = optimizer_checks.LAMB
    details = harness(lambda ps: ReferenceOptimizer(ps, lambda p, g, s: lamb_update(p, g, s, **lamb)),
                      lambda ps: ReferenceOptimizer(ps, lambda p, g, s: lamb_update(p, g, s, **lamb)))
    assert details["max_abs_diff"] == 0.0 and details["steps"] == 10 and details["device"] == "cpu"
    wrong_lr = r"step 1: candidate differs from reference by 0\.0001\d* \(tolerance 1e-05\)"
    with pytest.raises(CheckFailed, match=wrong_lr):
        harness(lambda ps: lion(ps, lr=2e-4), lion)


def test_lion_ties_are_left_out_and_counted_but_not_too_many() -> None:
    lr, (beta1, _) = optimizer_checks.LION["lr"], optimizer_checks.LION["betas"]

    def flipped(ps):
        """Lion that moves one element (the first of the 1000-element tensor) the other way, as a kernel that
        rounded its c to the other side of 0 would."""
        def update(p, g, s):
            if p.shape != (1000,):
                return lion_update(p, g, s, **optimizer_checks.LION)
            m0 = float(s["exp_avg"][0]) if "exp_avg" in s else 0.0
            c0 = m0 * beta1 + float(g[0]) * (1 - beta1)
            ties = lion_update(p, g, s, **optimizer_checks.LION)
            p[0] += 2 * lr * math.copysign(1.0, c0)
            return ties
        return ReferenceOptimizer(ps, update)

    def tied_there(ref_opt):  # the reference calls that element a tie
        masks = optimizer_checks.lion_ties(ref_opt)
        masks[1][0] = True
        return masks

    with pytest.raises(CheckFailed, match=r"step 1: candidate differs from reference by 0\.0002"):
        harness(flipped, lion, ties=optimizer_checks.lion_ties)  # no tie there: a real difference
    natural = harness(lion, lion, ties=optimizer_checks.lion_ties)["tied_elements"]  # |c| <= 1e-6 by chance
    details = harness(flipped, lion, ties=tied_there)
    assert details["tied_elements"] == natural + 1 and details["max_abs_diff"] < 1e-6
    assert details["elements"] == sum(math.prod(shape) for shape in optimizer_checks.SHAPES)
    with pytest.raises(CheckFailed, match="not rounding"):
        harness(lion, lion, ties=lambda ref: [torch.ones_like(m) for m in optimizer_checks.lion_ties(ref)])
