"""The method rows the paper defines only in words: top-b, the earlier divopd-focus composer and its
task-balance row weights, and TurnOPD (depth budget + token-to-turn loss schedule). Exact hand cases of our readings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from divopd.learn.checkpoint import WeightHandle
from divopd.learn.learner import Learner, LearnerConfig
from divopd.learn.loss import opd_loss, reduce_tokens
from divopd.learn.turnopd import (
    DepthStats,
    TurnOPDConfig,
    depth_budget,
    turn_balance_alpha,
    turn_balance_weights,
)
from divopd.sampling import METHODS, Candidate, Columns, SamplerConfig, make_sampler
from divopd.sampling.earlier_composer import compose_divopd_focus, task_balance_weights
from sampler_helpers import keys, turn
from test_learner import make_turns, params_equal, student
from test_learner import teacher as teacher  # noqa: F401, PLC0414 — module fixtures
from test_learner import tok as tok  # noqa: F401, PLC0414

TINY_TURNOPD = ["method=turnopd"]


def tturn(rid: str, t: int, task: str | None, score: float = 0.0, n: int = 2, **kw):
    x = turn(rid, t, score=score, n=n, **kw)
    if task is not None:
        x.info["task"] = task
    return x


def pool_of(turns):
    return Columns.of([Candidate.of(t) for t in turns], turns)


def focus_batch(turns, batch_size: int, seed: int):
    return [turns[i] for i in compose_divopd_focus(pool_of(turns), batch_size, None, np.random.default_rng(seed))]


# ---------------------------------------------------------------------------------------------------- top-b
def test_top_b_is_its_own_gated_row_with_the_global_ranking() -> None:
    assert METHODS["top-b"].gated and METHODS["top-b"].row_weights is None and METHODS["top-b"].select is not None
    s = make_sampler(SamplerConfig("top-b", 3, pool_factor=3))
    s.add([turn("a", 0, score=1), turn("a", 1, score=5), turn("a", 2, score=4), turn("b", 0, score=2),
           turn("c", 0, score=9, defect="missing_teacher")])
    batch = s.next_batch(0)
    assert keys(batch.payloads) == [("a", 1), ("a", 2), ("b", 0)]  # no per-rollout limit: rollout a gives two turns
    assert s.ledger.invalid == 1 and batch.row_weights is None


# ---------------------------------------------------------------------------------------------------- divopd-focus
def test_task_groups_fall_back_to_the_rollout_id() -> None:
    assert Candidate.of(tturn("r1", 0, "pick-apple")).task == "task:pick-apple"
    assert Candidate.of(tturn("r1", 0, None)).task == "rollout:r1"


def test_first_pass_caps_a_task_at_three_turns_then_relaxes() -> None:
    # B = 16, every response 2 tokens: the token share is 0.25 · 16 · 2 = 8 tokens = 4 turns, so the 3-turn cap binds
    # on the first pass, the share (4 turns) on the relaxing pass, and the last sweep fills the batch.
    pool = [tturn(f"{task}{i % 2}", i, task, score=10 - i) for task in ("X", "Y", "Z") for i in range(6)]
    rng_seed = 7
    visit = [["task:X", "task:Y", "task:Z"][j] for j in np.random.default_rng(rng_seed).permutation(3)]
    got = [(t.info["task"], t.turn_index) for t in focus_batch(pool, 16, rng_seed)]
    first = [(g[5:], i) for g in visit for i in range(3)]
    relax = [(g[5:], 3) for g in visit]
    fill = [(visit[0][5:], 4), (visit[0][5:], 5), (visit[1][5:], 4), (visit[1][5:], 5)]
    assert got == first + relax + fill


def test_token_share_stops_a_task_on_the_first_and_relaxing_passes() -> None:
    # B = 4; lengths 6,1,1 (task P) and 1,1 (task Q): mean 2, share 0.25 · 4 · 2 = 2 tokens. P's best turn (6 tokens)
    # never fits the share, so P waits (a prefix of its ranking) while Q gives both its turns; the fill pass takes P's.
    pool = [tturn("p", 0, "P", score=9, n=6), tturn("p", 1, "P", score=5, n=1), tturn("p", 2, "P", score=4, n=1),
            tturn("q", 0, "Q", score=1, n=1), tturn("q", 1, "Q", score=0, n=1)]
    for seed in range(4):  # the same batch whatever the group order
        assert [t.key for t in focus_batch(pool, 4, seed)] == [("q", 0), ("q", 1), ("p", 0), ("p", 1)]


def test_no_gate_invalid_turns_are_candidates_selected_and_dead_rows() -> None:
    s = make_sampler(SamplerConfig("divopd-focus", 3, pool_factor=2, seed=0))
    s.add([tturn("a", 0, "A", score=1), tturn("a", 1, "A", score=0, defect="no_valid_token"),
           tturn("b", 0, "B", score=3)])
    batch = s.next_batch(0)
    assert batch is not None and sorted(keys(batch.payloads)) == [("a", 0), ("a", 1), ("b", 0)]
    ledger = s.ledger
    assert (ledger.selected, ledger.invalid, ledger.pending) == (3, 0, 0)
    assert batch.stats["dead_rows"] == 1 and batch.stats["invalid"] == 0
    # rows of task A weigh 3 / (2 · 2), the single row of B 3 / (2 · 1): each task weighs B / G = 1.5
    weights = dict(zip(keys(batch.payloads), batch.row_weights, strict=True))
    assert weights == {("a", 0): 0.75, ("a", 1): 0.75, ("b", 0): 1.5}


def test_group_order_is_one_seeded_permutation_per_composition() -> None:
    def first_batch_tasks(seed: int) -> list[list[str]]:
        s = make_sampler(SamplerConfig("divopd-focus", 2, pool_factor=1, seed=seed, max_pending_age=None))
        out = []
        for _ in range(3):
            s.add([tturn(f"{c}{len(out)}", 0, c, n=8) for c in "ABCDEFGH"[:2]])
            out.append([t.info["task"] for t in s.next_batch(0).payloads])
        return out

    assert first_batch_tasks(3) == first_batch_tasks(3)
    # composition q draws its order from default_rng([seed, q]); two tasks of one 8-token turn each: B·mean/4 = 4
    # tokens, so the first pass takes nothing and the relaxing pass nothing; the fill pass follows the visit order
    for q, tasks in enumerate(first_batch_tasks(3)):
        perm = np.random.default_rng([3, q]).permutation(2)
        assert tasks == [["A", "B"][j] for j in perm]


def test_task_balance_weights_make_tasks_equal_and_average_one() -> None:
    rows = [tturn("a", 0, "T1"), tturn("a", 1, "T1"), tturn("b", 0, "T1"), tturn("c", 0, "T2")]
    w = task_balance_weights(pool_of(rows))
    assert w == [4 / 6, 4 / 6, 4 / 6, 2.0] and math.isclose(sum(w), 4)
    assert task_balance_weights(pool_of([tturn("a", 0, None), tturn("b", 0, None)])) == [1.0, 1.0]


def test_only_divopd_focus_skips_the_gate_or_weights_rows() -> None:
    assert {m for m, meth in METHODS.items() if not meth.gated} == {"divopd-focus"}
    assert {m for m, meth in METHODS.items() if meth.row_weights is not None} == {"divopd-focus"}


# ---------------------------------------------------------------------------------------------------- weighted loss
def test_weighted_seq_mean_token_mean_exact_value() -> None:
    values = torch.tensor([[1.0, 1.0], [4.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    assert float(reduce_tokens(values, mask, row_weights_N=torch.tensor([0.5, 1.5]))) == (0.5 * 1 + 1.5 * 4) / 2
    with pytest.raises(ValueError, match="seq-mean"):
        reduce_tokens(values, mask, "token-mean", torch.ones(2))
    with pytest.raises(ValueError, match="shape"):
        reduce_tokens(values, mask, row_weights_N=torch.ones(3))


def _loss_and_grad(row_weights):
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 4, generator=g, requires_grad=True)
    teacher_lp = torch.randn(3, 4, generator=g)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    loss, _ = opd_loss(lp, lp.detach(), teacher_lp, mask, row_weights=row_weights)
    loss.backward()
    return loss.detach(), lp.grad


def test_unit_weights_give_the_paper_loss_bit_for_bit() -> None:
    base_loss, base_grad = _loss_and_grad(None)
    ones_loss, ones_grad = _loss_and_grad(torch.ones(3))
    assert torch.equal(base_loss, ones_loss) and torch.equal(base_grad, ones_grad)


def test_turn_balance_weights_interpolate_token_mean_and_turn_mean() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0], [5.0, 5.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    valid = mask.sum(dim=1).numpy()
    token = float(reduce_tokens(values, mask, "token-mean"))
    turn_mean = float(reduce_tokens(values, mask))
    at0 = torch.from_numpy(turn_balance_weights(valid, 0.0))
    at1 = torch.from_numpy(turn_balance_weights(valid, 1.0))
    assert math.isclose(float(reduce_tokens(values, mask, row_weights_N=at0)), token)  # (1+2+3+10)/4 = 4
    assert float(reduce_tokens(values, mask, row_weights_N=at1)) == turn_mean  # (2 + 10 + 0)/3 = 4
    half = turn_balance_weights(valid, 0.5)
    assert np.allclose(half, [0.5 * 3 * 3 / 4 + 0.5, 0.5 * 3 / 4 + 0.5, 0.5]) and math.isclose(half.sum(), 3)
    assert turn_balance_weights([0, 0], 0.3).tolist() == [1.0, 1.0]


def test_turn_balance_schedule() -> None:
    assert [turn_balance_alpha(q, 5) for q in range(7)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert turn_balance_alpha(0, 1) == 1.0


def test_learner_unit_weight_batches_update_exactly_as_plain_turn_lists(tok, teacher) -> None:  # noqa: F811
    turns = make_turns(tok, teacher, n=8)
    for method in ("vanilla", "divopd", "top-b"):
        s = make_sampler(SamplerConfig(method, 8, pool_factor=1, cap=2))
        s.add(turns)
        batch = s.next_batch(0)
        assert batch.row_weights is None
        a = Learner(student(tok), LearnerConfig(lr=1e-2), tok)
        b = Learner(student(tok), LearnerConfig(lr=1e-2), tok)
        ma, mb = a.step(batch), b.step(list(batch.payloads))
        assert ma["learner/loss"] == mb["learner/loss"] and params_equal(a.model, b.model)
        assert "learner/row_weight_max" not in ma and "learner/turn_balance_alpha" not in ma


def test_learner_applies_batch_row_weights(tok, teacher) -> None:  # noqa: F811
    turns = make_turns(tok, teacher, n=4)

    class Weighted:
        def __init__(self, turns, w):
            self.payloads, self.row_weights = turns, w

    a = Learner(student(tok), LearnerConfig(lr=1e-2), tok)
    plain = a.step(turns)["learner/loss"]  # unweighted per-row mean (the loss before the update)
    b = Learner(student(tok), LearnerConfig(lr=1e-2), tok)
    metrics = b.step(Weighted(turns, [2.0, 0.0, 1.0, 1.0]))
    assert metrics["learner/row_weight_max"] == 2.0 and metrics["learner/row_weight_min"] == 0.0
    assert not math.isclose(metrics["learner/loss"], plain)
    c = Learner(student(tok), LearnerConfig(lr=1e-2), tok)
    with pytest.raises(ValueError, match="row_weights"):
        c.step(Weighted(turns, [1.0, 1.0]))


# ---------------------------------------------------------------------------------------------------- TurnOPD depth
def test_depth_budget_hand_cases() -> None:
    # mass 4, 3, 2, 1 (total 10): ρ = 0.7 needs 7 → depths 0 and 1 → d = 2
    assert depth_budget([4, 3, 2, 1], 0.7, 1, 30) == 2
    assert depth_budget([4, 3, 2, 1], 0.71, 1, 30) == 3
    assert depth_budget([4, 3, 2, 1], 1.0, 1, 30) == 4
    assert depth_budget([4, 3, 2, 1], 0.7, 3, 30) == 3  # min_depth
    assert depth_budget([4, 3, 2, 1], 1.0, 1, 3) == 3  # max_steps
    assert depth_budget([None, 0.0, 2.0, None], 0.5, 1, 30) == 3  # unseen depths count 0
    assert depth_budget([], 0.9, 2, 30) == 30 and depth_budget(None, 0.9, 2, 30) == 30  # no statistics: full horizon
    assert depth_budget([-1.0, 0.0], 0.9, 2, 30) == 30
    assert depth_budget([5.0], 0.9, 4, 3) == 3


def test_depth_stats_running_means() -> None:
    stats = DepthStats()
    stats.update([turn("a", 0, score=2), turn("b", 0, score=4), turn("a", 1, score=-3),
                  turn("a", 2, score=9, defect="no_valid_token")])
    assert stats.published() == (3.0, 0.0)  # invalid turns skipped; negative scores count 0
    stats.update([turn("c", 0, score=13), turn("c", 2, score=5)])
    assert stats.published() == pytest.approx((0.9 * 3 + 0.1 * 13, 0.0, 5.0))  # depth 1 unseen: kept


def test_step_limit_reads_the_published_statistics(tmp_path) -> None:
    from divopd.train.config import load_config
    from divopd.train.runtime.common import step_limit

    cfg = load_config("tiny", TINY_TURNOPD)  # max_steps 12, ρ 0.9, min_depth 2
    assert step_limit(cfg, WeightHandle(version=0, depth_disagreement=())) == 12
    assert step_limit(cfg, WeightHandle(version=5, depth_disagreement=(5.0, 4.0, 0.5, 0.5))) == 2
    assert step_limit(cfg, WeightHandle(version=5, depth_disagreement=(1.0,) * 20)) == 12
    assert step_limit(cfg, 7) == 12  # a bare version carries no statistics
    assert TurnOPDConfig().step_limit(9, (1.0,)) == 9  # disabled: max_steps


def test_learner_publishes_and_checkpoints_depth_stats(tok, teacher, tmp_path) -> None:  # noqa: F811
    turns = make_turns(tok, teacher, n=8)
    learner = Learner(student(tok), LearnerConfig(lr=1e-2, depth_stats=True, turn_balance_updates=4), tok)
    assert learner.publish().depth_disagreement == ()
    m = learner.step(turns)
    assert m["learner/turn_balance_alpha"] == 0.0
    published = learner.publish().depth_disagreement
    assert len(published) == 2 and all(v is not None and v >= 0 for v in published)
    assert learner.step(turns)["learner/turn_balance_alpha"] == pytest.approx(1 / 3)
    learner.save_checkpoint(tmp_path / "ck")
    restored, _ = Learner.from_checkpoint(tmp_path / "ck")
    assert restored.publish().depth_disagreement == learner.publish().depth_disagreement
    assert Learner(student(tok), LearnerConfig(), tok).publish().depth_disagreement is None


def test_turnopd_config_rules() -> None:
    from divopd.train.config import load_config

    with pytest.raises(ValueError, match="turnopd.enabled"):
        load_config("tiny", [*TINY_TURNOPD, "turnopd.enabled=false"])
    with pytest.raises(ValueError, match="turn_balance_updates"):
        load_config("tiny", [*TINY_TURNOPD, "learner.turn_balance_updates=null"])
    with pytest.raises(ValueError, match="depth_stats"):
        load_config("tiny", [*TINY_TURNOPD, "learner.depth_stats=false"])
    with pytest.raises(ValueError, match="tcod.enabled"):
        load_config("tiny", [*TINY_TURNOPD, "tcod.enabled=true"])
    assert load_config("tiny", TINY_TURNOPD).sampler_config().method == "vanilla"
