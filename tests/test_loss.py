"""Exact values, finiteness and gradient flow of the OPD loss (divopd.learn.loss)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from divopd.learn.loss import REDUCTIONS, opd_loss, reduce_tokens, topk_reverse_kl, topk_reverse_kl_loss

NAN, INF = float("nan"), float("inf")


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def hand_batch():
    """Three rows, L = 2. Row 0: two valid tokens, row 1: dead, row 2: two valid tokens.

    A = −β(old − teacher): row 0 → [−0.5, +1], row 2 → [+2, 0] (β = 1).
    """
    old = t([[-1.0, -2.0], [-0.5, -0.5], [-3.0, -1.0]])
    teacher = t([[-1.5, -1.0], [-9.0, -9.0], [-1.0, -1.0]])
    mask = torch.tensor([[True, True], [False, False], [True, True]])
    return old, teacher, mask


@pytest.mark.parametrize(
    "reduction, objective",
    [
        # per-row token means 0.25, 0 (dead, still counted), 1.0 → mean over 3 rows
        ("seq-mean-token-mean", (0.25 + 0.0 + 1.0) / 3),
        # all valid tokens: (−0.5 + 1 + 2 + 0) / 4
        ("token-mean", 2.5 / 4),
        # per-row sums 0.5, 0, 2 → mean over 3 rows
        ("seq-mean-token-sum", (0.5 + 0.0 + 2.0) / 3),
    ],
)
def test_exact_values_each_reduction(reduction, objective):
    old, teacher, mask = hand_batch()
    lp = old.clone().requires_grad_(True)
    loss, m = opd_loss(lp, old, teacher, mask, beta=1.0, reduction=reduction)
    assert loss.item() == pytest.approx(-objective, abs=1e-12)
    loss2, _ = opd_loss(lp, old, teacher, mask, beta=2.0, reduction=reduction)
    assert loss2.item() == pytest.approx(-2 * objective, abs=1e-12)
    assert m["valid_tokens"] == 4 and m["dead_rows"] == 1 and m["rows"] == 3
    # sampled reverse KL on valid tokens: mean(old − teacher) = (0.5 − 1 − 2 + 0) / 4
    assert m["reverse_kl"] == pytest.approx(-2.5 / 4)
    assert m["clip_frac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0)


def test_dead_row_stays_in_denominator():
    old, teacher, mask = hand_batch()
    full, _ = opd_loss(old, old, teacher, mask)
    live = torch.tensor([0, 2])
    without, _ = opd_loss(old[live], old[live], teacher[live], mask[live])
    assert full.item() == pytest.approx(-1.25 / 3)
    assert without.item() == pytest.approx(-1.25 / 2)


def test_clipping_exact_values_and_gradient():
    # one valid token per row; A = −(old − teacher)
    old = t([[0.0], [0.0], [0.0], [0.0]]).log_softmax(-1) - 1.0  # all −1
    teacher = t([[0.0], [-2.0], [0.0], [-2.0]])  # A = −(old − teacher) = [+1, −1, +1, −1]
    ratio = t([[1.5], [1.5], [0.5], [0.5]])
    lp = (old + ratio.log()).requires_grad_(True)
    mask = torch.ones(4, 1, dtype=torch.bool)
    loss, m = opd_loss(lp, old, teacher, mask, clip_eps=0.2)
    # per row min(r·A, clip(r)·A): A=+1,r=1.5 → 1.2 (clipped) ; A=−1,r=1.5 → −1.5 ; A=+1,r=0.5 → 0.5 ;
    # A=−1,r=0.5 → −0.8 (clipped)
    expected = -(1.2 - 1.5 + 0.5 - 0.8) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["clip_frac"] == 1.0  # every ratio is outside [0.8, 1.2]
    loss.backward()
    # the clipped branches (rows 0 and 3) pass no gradient; the others get d(−r·A/N)/d logπ = −r·A/N
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[3, 0].item() == 0.0
    assert lp.grad[1, 0].item() == pytest.approx(-(1.5 * -1.0) / 4)
    assert lp.grad[2, 0].item() == pytest.approx(-(0.5 * 1.0) / 4)


def test_stopped_advantage_does_not_backprop_into_scores():
    old, teacher, mask = hand_batch()
    teacher = teacher.clone().requires_grad_(True)
    old_r = old.clone().requires_grad_(True)
    lp = old.clone().requires_grad_(True)
    loss, _ = opd_loss(lp, old_r, teacher, mask, beta=1.5)
    loss.backward()
    assert teacher.grad is None or torch.all(teacher.grad == 0)
    assert old_r.grad is None or torch.all(old_r.grad == 0)
    # d loss / d logπ = −A / (|V_t| · N) = β(old − teacher) / (|V_t| · N) on valid tokens, 0 elsewhere
    expected = torch.where(mask, 1.5 * (old - teacher.detach()) / (2 * 3), torch.zeros_like(old))
    assert torch.allclose(lp.grad, expected)


def test_nonfinite_teacher_positions_are_dropped():
    old, teacher, mask = hand_batch()
    bad = teacher.clone()
    bad[0, 1] = NAN
    bad[2, 0] = -INF
    loss, m = opd_loss(old, old, bad, mask)
    ref_mask = mask.clone()
    ref_mask[0, 1] = False
    ref_mask[2, 0] = False
    ref, _ = opd_loss(old, old, teacher, ref_mask)
    assert loss.item() == pytest.approx(ref.item())
    assert m["dropped_nonfinite"] == 2 and m["valid_tokens"] == 2


def test_all_dead_batch_is_finite_with_zero_gradient():
    lp = t([[-1.0, NAN], [INF, -2.0]]).requires_grad_(True)
    teacher = t([[NAN, NAN], [-INF, INF]])
    for reduction in REDUCTIONS:
        loss, m = opd_loss(lp, lp.detach(), teacher, torch.ones(2, 2, dtype=torch.bool), reduction=reduction)
        loss.backward()
        assert loss.item() == 0.0 and m["dead_rows"] == 2 and m["valid_tokens"] == 0
        assert torch.all(lp.grad == 0)
        lp.grad = None
    empty, _ = opd_loss(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.bool))
    assert empty.item() == 0.0


def test_bad_arguments_are_named():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="teacher_logprobs"):
        opd_loss(x, x, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="reduction"):
        opd_loss(x, x, x, torch.ones(2, 3, dtype=torch.bool), reduction="mean")
    with pytest.raises(ValueError, match="reduction"):
        reduce_tokens(x, torch.ones(2, 3, dtype=torch.bool), "sum")


# log probabilities, absurd finite values (far outside any log probability) and NaN/±inf
finite_or_not = st.one_of(st.floats(-30, 0), st.sampled_from([NAN, INF, -INF]), st.floats(-1e6, 1e6))


@settings(max_examples=150, deadline=None)
@given(
    shape=st.tuples(st.integers(0, 5), st.integers(1, 6)),
    data=st.data(),
    reduction=st.sampled_from(REDUCTIONS),
    beta=st.floats(0.0, 10.0),
    clip_eps=st.floats(0.0, 1.0),
)
def test_loss_is_finite_for_every_input(shape, data, reduction, beta, clip_eps):
    arr = lambda: data.draw(hnp.arrays(np.float64, shape, elements=finite_or_not))  # noqa: E731
    lp = torch.from_numpy(data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-1e6, 1e6)))).requires_grad_(True)
    old, teacher = torch.from_numpy(arr()), torch.from_numpy(arr())
    mask = torch.from_numpy(data.draw(hnp.arrays(np.bool_, shape)))
    loss, m = opd_loss(lp, old, teacher, mask, beta=beta, clip_eps=clip_eps, reduction=reduction)
    loss.backward()
    assert math.isfinite(loss.item())
    assert torch.all(torch.isfinite(lp.grad))
    assert all(math.isfinite(v) for v in m.values())
    assert m["valid_tokens"] + m["dropped_nonfinite"] == float(mask.sum())


# ---------------------------------------------------------------------------------------------- top-k estimator
def test_topk_reverse_kl_exact_value():
    s = t([[[math.log(0.75), math.log(0.25), -1.0]]])  # third entry: teacher missing → out of the support
    te = t([[[math.log(0.5), math.log(0.5), NAN]]])
    kl = topk_reverse_kl(s, te)
    assert kl.item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    # renormalised on the support: scaling the student's top-k mass does not change it
    kl2 = topk_reverse_kl(s + math.log(0.3), te)
    assert kl2.item() == pytest.approx(kl.item())


def test_topk_loss_reduction_dead_rows_and_zero_at_match():
    te = t([[[-0.1, -2.5], [-1.0, -1.0]], [[-0.3, -1.5], [NAN, NAN]]])
    s = te.clone().requires_grad_(True)
    mask = torch.tensor([[True, True], [True, True]])
    loss, m = topk_reverse_kl_loss(s, te, mask)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-12) and torch.allclose(s.grad, torch.zeros_like(s), atol=1e-12)
    assert m["valid_tokens"] == 3 and m["dropped_nonfinite"] == 1
    s2 = torch.zeros_like(te)
    loss2, _ = topk_reverse_kl_loss(s2, te, mask, beta=2.0)
    kl = topk_reverse_kl(s2, te)
    assert loss2.item() == pytest.approx(2.0 * ((kl[0, 0] + kl[0, 1]) / 2 + kl[1, 0]).item() / 2)


@settings(max_examples=100, deadline=None)
@given(shape=st.tuples(st.integers(0, 4), st.integers(1, 4), st.integers(1, 4)), data=st.data(),
       reduction=st.sampled_from(REDUCTIONS))
def test_topk_loss_is_finite_for_every_input(shape, data, reduction):
    s = torch.from_numpy(data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-30, 0)))).requires_grad_(True)
    te = torch.from_numpy(data.draw(hnp.arrays(np.float64, shape, elements=finite_or_not)))
    mask = torch.from_numpy(data.draw(hnp.arrays(np.bool_, shape[:2])))
    loss, m = topk_reverse_kl_loss(s, te, mask, reduction=reduction)
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() >= -1e-9
    assert torch.all(torch.isfinite(s.grad))
    assert all(math.isfinite(v) for v in m.values())


def test_topk_gradient_does_not_reach_teacher():
    te = t([[[-0.2, -1.9]]]).requires_grad_(True)
    s = t([[[-1.0, -0.5]]]).requires_grad_(True)
    loss, _ = topk_reverse_kl_loss(s, te, torch.ones(1, 1, dtype=torch.bool))
    loss.backward()
    assert te.grad is None or torch.all(te.grad == 0)
    assert torch.any(s.grad != 0)


def test_topk_tail_exact_value_and_sees_mass_outside_the_support():
    s = t([[[math.log(0.5), math.log(0.3)]]])  # student tail 0.2
    te = t([[[math.log(0.6), math.log(0.39)]]])  # teacher tail 0.01
    kl = topk_reverse_kl(s, te, tail=True)
    want = 0.5 * math.log(0.5 / 0.6) + 0.3 * math.log(0.3 / 0.39) + 0.2 * math.log(0.2 / 0.01)
    assert kl.item() == pytest.approx(want)
    # moving the student's top-k mass into the tail raises it (the renormalised form does not change)
    assert topk_reverse_kl(s + math.log(0.5), te, tail=True).item() > kl.item() + 0.1
    assert topk_reverse_kl(s + math.log(0.5), te).item() == pytest.approx(topk_reverse_kl(s, te).item())
    # a missing teacher entry leaves the support: its student mass joins the tail
    s3 = t([[[math.log(0.5), math.log(0.3), math.log(0.1)]]])
    te3 = t([[[math.log(0.6), math.log(0.39), NAN]]])
    assert topk_reverse_kl(s3, te3, tail=True).item() == pytest.approx(want)


@settings(max_examples=100, deadline=None)
@given(v=st.integers(2, 6), data=st.data())
def test_topk_tail_is_a_lower_bound_of_the_full_kl(v, data):
    k = data.draw(st.integers(1, v))
    logits = st.floats(-6, 6)
    zs = torch.tensor(data.draw(st.lists(logits, min_size=v, max_size=v)), dtype=torch.float64)
    zt = torch.tensor(data.draw(st.lists(logits, min_size=v, max_size=v)), dtype=torch.float64)
    ls, lt = torch.log_softmax(zs, -1), torch.log_softmax(zt, -1)
    top = torch.argsort(lt, descending=True)[:k]  # the teacher's top-k ids
    full = float((ls.exp() * (ls - lt)).sum())
    kl = topk_reverse_kl(ls[top].view(1, 1, k), lt[top].view(1, 1, k), tail=True).item()
    assert -1e-9 <= kl <= full + 1e-9  # the KL of the (k+1)-way coarsening (data processing inequality)
    if k == v:
        assert kl == pytest.approx(full, abs=1e-6)


def test_topk_tail_gradient_pulls_mass_off_tokens_the_teacher_does_not_rank():
    z = torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64, requires_grad=True)  # most mass on token 2
    lt = torch.log(torch.tensor([0.7, 0.3 - 1e-4, 1e-4], dtype=torch.float64))  # teacher's top-2: tokens 0, 1
    mask = torch.tensor([[True]])
    for tail in (False, True):
        z.grad = None
        ls = torch.log_softmax(z, -1)
        loss, _ = topk_reverse_kl_loss(ls[:2].view(1, 1, 2), lt[:2].view(1, 1, 2), mask, tail=tail)
        loss.backward()
        if tail:
            assert z.grad[2] > 0  # a descent step lowers token 2's logit
        else:
            assert z.grad[2] == pytest.approx(0.0, abs=1e-12)  # renormalised: token 2 gets no gradient
