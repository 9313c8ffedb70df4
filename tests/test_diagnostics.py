"""Appendix E diagnostics: gradient projection/cosines (E.3) and focus ranking stability (E.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from divopd import Turn
from divopd.learn.diagnostics import full_reverse_kl, gradient_diagnostics, opd_gradient, ranking_stability, spearman
from divopd.models.scoring import response_logprobs
from divopd.models.tiny import build_model, build_tokenizer
from divopd.sampling import SamplerConfig, make_sampler

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer(["go north south east west take open close red blue apple fridge door key"], kind="word")
    gen, teacher = build_model(tok, "0.2m", seed=0), build_model(tok, "0.2m", seed=1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(6, len(tok), size=int(rng.integers(3, 10))).tolist() for _ in range(24)]
    responses = [rng.integers(6, len(tok), size=int(rng.integers(1, 6))).tolist() for _ in range(24)]
    s_lp = response_logprobs(gen, prompts, responses)
    t_lp = response_logprobs(teacher, prompts, responses)
    turns = [Turn(f"r{i % 4}", i // 4, 0, p, r, student_logprobs=s, teacher_logprobs=t)
             for i, (p, r, s, t) in enumerate(zip(prompts, responses, s_lp, t_lp, strict=True))]
    sampler = make_sampler(SamplerConfig("divopd", batch_size=6, pool_factor=4, cap=2))
    sampler.add(turns)
    return tok, gen, teacher, turns, sampler.next_batch(0)


def test_spearman_hand_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties get average ranks: x ranks [1, 2.5, 2.5, 4], y ranks [1, 2, 3, 4] → r = 4.5 / sqrt(4.5 · 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5.0))
    assert math.isnan(spearman([1], [2])) and math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_gradient_diagnostics_on_a_composed_batch(setup):
    _, gen, _, turns, batch = setup
    before = [p.detach().clone() for p in gen.parameters()]
    out = gradient_diagnostics(gen, batch)
    assert all(p.grad is None for p in gen.parameters())  # nothing left behind
    assert all(torch.equal(a, b) for a, b in zip(before, gen.parameters(), strict=True))
    assert out["diag/grad_pool_turns"] == len(batch.candidates) and out["diag/grad_rows"] == 6
    assert -1 <= out["diag/grad_cos_pool"] <= 1 and -1 <= out["diag/grad_pairwise_cos"] <= 1
    assert out["diag/grad_proj_pool"] == pytest.approx(out["diag/grad_cos_pool"] * out["diag/grad_norm_batch"],
                                                       rel=1e-5)


def test_gradient_diagnostics_degenerate_cases(setup):
    _, gen, _, turns, _ = setup

    class Fake:  # a batch whose pool is exactly its rows: the two gradients coincide
        def __init__(self, rows, pool):
            self.payloads, self.candidates = rows, pool

    same = gradient_diagnostics(gen, Fake(turns[:5], turns[:5]))
    assert same["diag/grad_cos_pool"] == pytest.approx(1.0, abs=1e-5)
    twins = gradient_diagnostics(gen, Fake([turns[0], turns[0], turns[0]], turns))
    assert twins["diag/grad_pairwise_cos"] == pytest.approx(1.0, abs=1e-5)
    # pool gradient = the average of the per-row seq-mean gradients
    g_pool = opd_gradient(gen, turns[:3])
    g_rows = sum(opd_gradient(gen, [t]) for t in turns[:3]) / 3
    torch.testing.assert_close(g_pool, g_rows, atol=1e-6, rtol=1e-4)


def test_ranking_stability(setup):
    tok, gen, _, _, batch = setup
    same = ranking_stability(gen, batch)  # the generating policy itself: rankings agree exactly
    assert same["diag/focus_spearman"] == pytest.approx(1.0) and same["diag/focus_mean_abs_change"] < 1e-4
    assert same["diag/focus_turns"] == len(batch.candidates)
    moved = ranking_stability(build_model(tok, "0.2m", seed=2), batch)  # a different model: rankings move
    assert moved["diag/focus_spearman"] < 0.999 and moved["diag/focus_mean_abs_change"] > 0.01


def test_full_reverse_kl(setup):
    _, gen, teacher, turns, _ = setup
    assert full_reverse_kl(gen, gen, turns) == pytest.approx(0.0, abs=1e-6)
    assert full_reverse_kl(gen, teacher, turns) > 0
    dead = [Turn("d", 0, 0, [5, 6], [7], teacher_logprobs=[float("nan")])]
    assert math.isnan(full_reverse_kl(gen, teacher, dead))
