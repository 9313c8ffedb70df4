"""The diagnostics of the paper's tables: every function on hand-worked cases, the keys of a real training
run, the replay's fields and ``--selection-chain``, and the report's table."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from divopd import Turn
from divopd.sampling.paper_diagnostics import (
    EMA_ALPHA,
    RunDiagnostics,
    cell_shares,
    depth_bucket,
    ema_update,
    gini,
    kl_per_token,
    kl_tokens,
    never_selected_scored_share,
    never_selected_share,
    outcome,
    scored_tokens,
    selection_cells,
    teacher_tokens_per_trained_token,
    turns_per_rollout,
)
from divopd.sampling.stats import batch_stats
from test_train import tiny_config, tiny_models  # noqa: F401

NAN = float("nan")
INF = float("inf")


def t(rid: str, index: int = 0, student=(-1.0, -1.0), teacher=(-1.0, -1.0), version: int = 0, **info) -> Turn:
    n = len(teacher)
    return Turn(rid, index, version, [0], [1] * n, student_logprobs=None if student is None else list(student),
                teacher_logprobs=list(teacher), info=dict(info))


# ---------------------------------------------------------------------------------------------------- Table 9
def test_turns_per_rollout() -> None:
    assert turns_per_rollout([t("A"), t("A", 1), t("B")]) == 1.5  # 3 rows, 2 rollouts
    assert turns_per_rollout([t("A"), t("B"), t("C")]) == 1.0
    assert turns_per_rollout([]) == 0.0


def test_kl_per_token_over_valid_tokens_with_a_finite_student_log_prob() -> None:
    # u: valid tokens 0, 1 (teacher NaN at 2): diffs 1.0, 0.5  -> Σ 1.5 over 2 tokens
    u = t("A", student=(-1.0, -1.0, -1.0), teacher=(-2.0, -1.5, NAN))
    # v: both valid, student NaN at 1: diff 0.5 over 1 token
    v = t("B", student=(-0.5, NAN), teacher=(-1.0, -1.0))
    # w: no student log probs (vanilla can select it): no token;  x: no teacher score: no valid token
    w = t("C", student=None, teacher=(-3.0, -3.0))
    x = t("D", teacher=(NAN, NAN))
    assert [kl_tokens(z) for z in (u, v, w, x)] == [2, 1, 0, 0]
    assert kl_per_token([u, v, w, x]) == pytest.approx((1.5 + 0.5) / 3)
    assert kl_per_token([w, x]) == 0.0
    # the same mean as the learner's reverse-KL estimate when the learner's log probs are the generating ones
    assert kl_per_token([u]) == pytest.approx(0.75)


def test_batch_stats_has_the_table_9_keys_and_figure_6_is_a_std_of_rollout_sums() -> None:
    # rollout A: turns with disagreement 2 and 4 (sum 6); rollout B: 1. std over {6, 1} (population) = 2.5
    a0 = t("A", 0, teacher=(-2.0, -2.0), version=3)  # d = 2 (each token −1 − (−2) = 1)
    a1 = t("A", 1, teacher=(-3.0, -3.0), version=4)  # d = 4
    b0 = t("B", 0, teacher=(-1.5, -1.5), version=5)  # d = 1
    st = batch_stats([a0, a1, b0], learner_version=5)
    assert st["disagreement_std_across_rollouts"] == pytest.approx(2.5)
    assert st["turns_per_rollout"] == 1.5
    assert st["kl_per_token"] == pytest.approx(7 / 6)  # Σ d = 7 over 6 tokens
    assert st["mean_staleness"] == pytest.approx((2 + 1 + 0) / 3)  # Table 12's mean age
    assert st["effective_rollouts"] == pytest.approx(1 / ((4 / 6) ** 2 + (2 / 6) ** 2))
    assert st["max_rollout_share"] == pytest.approx(4 / 6)


# ---------------------------------------------------------------------------------------------------- Table 11
def test_gini_by_hand() -> None:
    # Σ_ij |x_i − x_j| over ordered pairs of [0, 0, 1, 3] = 20; n = 4, mean 1 -> 20 / (2·16·1)
    assert gini([3, 0, 1, 0]) == pytest.approx(0.625)
    assert gini([0, 1]) == pytest.approx(0.5)
    assert gini([2, 2, 2]) == 0.0
    assert gini([0, 0]) == 0.0
    assert gini([]) is None
    with pytest.raises(ValueError):
        gini([1, -1])


def test_never_selected_share() -> None:
    assert never_selected_share(["A", "B", "C", "D"], {"A": 2, "C": 1, "X": 5}) == 0.5
    assert never_selected_share(["A", "B"], {"A"}) == 0.5
    assert never_selected_share([], {}) is None


# ---------------------------------------------------------------------------------------------------- Table 14
def test_depth_buckets_and_outcomes() -> None:
    got = [depth_bucket(i) for i in (0, 1, 2, 3, 4, 5, 6, 9, 10, 25)]
    assert got == ["<2", "<2", "[2,4)", "[2,4)", "[4,6)", "[4,6)", "[6,10)", "[6,10)", "≥10", "≥10"]
    with pytest.raises(ValueError):
        depth_bucket(-1)
    assert outcome(t("A", success=True)) == "success"
    assert outcome(t("A", success=False)) == "failure"
    assert outcome(t("A")) == "unknown"


def test_selection_cells_and_shares() -> None:
    turns = [t("A", 0, success=True), t("A", 1, success=True), t("A", 4, success=True), t("B", 12, success=False)]
    cells = selection_cells(turns)
    assert cells == Counter({("<2", "success"): 2, ("[4,6)", "success"): 1, ("≥10", "failure"): 1})
    shares = cell_shares(cells)
    assert list(shares) == ["<2", "[2,4)", "[4,6)", "[6,10)", "≥10"]
    assert shares["<2"] == {"success": 0.5, "failure": 0.0}  # no unknown column without an unknown turn
    assert shares["[4,6)"]["success"] == 0.25 and shares["≥10"]["failure"] == 0.25
    assert sum(v for row in shares.values() for v in row.values()) == pytest.approx(1.0)
    assert cell_shares(Counter({("<2", "unknown"): 1}))["<2"] == {"success": 0.0, "failure": 0.0, "unknown": 1.0}
    assert cell_shares(Counter())["<2"] == {"success": None, "failure": None}


# ---------------------------------------------------------------------------------------------------- Table 16
def test_scored_tokens_and_ratios() -> None:
    assert scored_tokens(t("A", student=(-1.0,) * 4, teacher=(-1.0, NAN, INF, -2.0))) == 2
    assert scored_tokens(Turn("A", 0, 0, [0], [1, 1])) == 0  # not scored
    assert teacher_tokens_per_trained_token(30, 12) == 2.5
    assert teacher_tokens_per_trained_token(30, 0) is None
    assert never_selected_scored_share(20, 15) == 0.25
    assert never_selected_scored_share(0, 0) is None


# ---------------------------------------------------------------------------------------------------- Figure 6
def test_ema() -> None:
    assert EMA_ALPHA == 0.12
    e = None
    got = []
    for x in (1.0, 2.0, 3.0):
        e = ema_update(e, x)
        got.append(e)
    assert got == pytest.approx([1.0, 0.12 * 2 + 0.88 * 1, 0.12 * 3 + 0.88 * 1.12])
    assert got[-1] == pytest.approx(1.3456)
    assert ema_update(None, 5.0, alpha=0.5) == 5.0 and ema_update(4.0, 2.0, alpha=0.5) == 3.0


def test_run_diagnostics_accumulates_and_round_trips_its_state() -> None:
    state: dict = {}
    rd = RunDiagnostics(state)
    rd.observe_received([t("A", teacher=(-1.0, -1.0, NAN, -1.0), student=(-1.0,) * 4), t("B")])  # 3 + 2 scored
    m1 = rd.observe_batch({"response_tokens": 2, "disagreement_std_across_rollouts": 1.0})
    assert m1 == {"sampler/scored_tokens_received": 5.0, "sampler/response_tokens_trained": 2.0,
                  "sampler/teacher_tokens_per_trained_token": 2.5, "sampler/disagreement_std_ema": 1.0}
    again = RunDiagnostics(json.loads(json.dumps(state)))  # what a checkpoint keeps
    m2 = again.observe_batch({"response_tokens": 3, "disagreement_std_across_rollouts": 2.0})
    assert m2["sampler/teacher_tokens_per_trained_token"] == 1.0
    assert m2["sampler/disagreement_std_ema"] == pytest.approx(1.12)
    assert RunDiagnostics().observe_batch({"response_tokens": 0}) == {
        "sampler/scored_tokens_received": 0.0, "sampler/response_tokens_trained": 0.0}


# ---------------------------------------------------------------------------------------------------- a real run
NEW_KEYS = (
    "sampler/turns_per_rollout",
    "sampler/kl_per_token",
    "sampler/scored_tokens_received",
    "sampler/response_tokens_trained",
    "sampler/teacher_tokens_per_trained_token",
    "sampler/disagreement_std_ema",
)


def test_a_real_run_writes_the_new_keys(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    from divopd.train import train

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd")
    train(cfg)
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ups = [r for r in recs if r["kind"] == "update"]
    assert len(ups) == cfg.updates
    for r in ups:
        for key in NEW_KEYS:
            assert isinstance(r.get(key), (int, float)), (key, r["update"])
        assert r["sampler/turns_per_rollout"] == pytest.approx(r["sampler/rows"] / r["sampler/distinct_rollouts"])
        assert r["sampler/teacher_tokens_per_trained_token"] == pytest.approx(
            r["sampler/scored_tokens_received"] / r["sampler/response_tokens_trained"])
        assert math.isfinite(r["sampler/kl_per_token"])
    # cumulative trained tokens and the EMA, recomputed from the per-update values
    trained = 0.0
    ema = None
    for r in ups:
        trained += r["sampler/response_tokens"]
        ema = ema_update(ema, r["sampler/disagreement_std_across_rollouts"])
        assert r["sampler/response_tokens_trained"] == trained
        assert r["sampler/disagreement_std_ema"] == pytest.approx(ema)
    # scored tokens received never shrink and cover what was trained on at least once
    received = [r["sampler/scored_tokens_received"] for r in ups]
    assert received == sorted(received) and received[-1] > 0


def _scored_before(run_dir: Path, update: int, requeued_below: int = 0) -> int:
    """Teacher-scored tokens of the logged turns received before update ``update``'s metrics: arrival_update below it,
    or (after a resume) queued again at the restart, i.e. arrival below ``requeued_below``."""
    from divopd.experience.log import read_log

    return sum(scored_tokens(x.turn) for x in read_log(run_dir / "experience")
               if x.arrival_update < update or x.arrival < requeued_below)


def test_the_counters_match_the_log_and_survive_a_resume(tiny_models: dict[str, str],  # noqa: F811
                                                         tmp_path: Path) -> None:
    import shutil

    from divopd.train import train

    run_dir = tmp_path / "run"
    train(tiny_config(tiny_models, run_dir, "divopd", updates=4, **{"checkpoint.every": 2, "checkpoint.keep": 2}))
    first = {r["update"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "update"}
    for u, r in first.items():
        assert r["sampler/scored_tokens_received"] == _scored_before(run_dir, u)
    from divopd.experience.log import read_log

    logged = len(list(read_log(run_dir / "experience")))  # turns of the first session
    # as after a crash past update 2: the newest checkpoint and the summary gone; --resume redoes updates 3 and 4
    shutil.rmtree(run_dir / "checkpoints" / "update-000004")
    (run_dir / "summary.json").unlink()
    train(resume=run_dir)
    ups = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "update"]
    assert [r["update"] for r in ups] == [1, 2, 3, 4]
    trained, ema = 0.0, None
    for r in ups:
        trained += r["sampler/response_tokens"]
        ema = ema_update(ema, r["sampler/disagreement_std_across_rollouts"])
        assert r["sampler/response_tokens_trained"] == trained, r["update"]
        assert r["sampler/disagreement_std_ema"] == pytest.approx(ema), r["update"]
        requeued_below = logged if r["update"] > 2 else 0  # the resume queued every turn the first session logged
        assert r["sampler/scored_tokens_received"] == _scored_before(run_dir, r["update"], requeued_below), r["update"]
    assert ups[1] == first[2]  # the records up to the checkpoint are kept as written


# ---------------------------------------------------------------------------------------------------- replay
# The hand log of tests/test_replay.py (B=2, pool 4, k=1, S=1, ticks 0..3); its batches, worked out there:
#   vanilla t0 {a0,a1} t1 {a2,b0} t2 {c0 (dead), c1} t3 {f0,d0};   divopd t0 {a1,b0} t1 {a0,c1} t2 {e0,f0} t3 {d2,d1}.
# Per turn: disagreement x over n tokens is x/n per token (a0 2, a1 4, a2 0, b0 1 over 4 tokens, c0 unscored,
# c1 e0 f0 d0 1, d1 2, d2 3; 2 tokens unless said). Scored tokens delivered: 22 (c0 none).
HAND_TABLE = {
    "vanilla": {
        "never_selected_share": 1 / 5,  # = unused_fraction: E of the 5 decided valid rollouts (D undecided)
        # selected turns per valid rollout A3 B1 C2 E0 F1 D1: sorted 0 1 1 1 2 3, Σ(2i−7)x = 18, / (6·8)
        "selection_gini": 18 / 48,
        "turns_per_rollout_mean": (2 + 1 + 2 + 1) / 4,
        "kl_per_token_mean": ((2 + 4) / 4 + 1 / 6 + 1 / 2 + 2 / 4) / 4,  # t2: c0 has no valid token
        "mean_age": (0 + 1 + 1 + 0.5) / 4,
        # rollout-sum std per tick: {6} 0, {0, 1} 0.5, {C: 0 + 1} 0, {1, 1} 0 -> EMA 0, .06, .0528, .046464
        "disagreement_std_ema": 0.88 * 0.88 * 0.06,
        "teacher_tokens_per_trained_token": 22 / 18,  # trained 4 + 6 + 4 + 4
        "never_selected_scored_share": 6 / 22,  # e0, d1, d2
    },
    "divopd": {
        "never_selected_share": 0.0,
        "selection_gini": 8 / 48,  # A2 B1 C1 E1 F1 D2: Σ(2i−7)x = −8 + 6 + 10
        "turns_per_rollout_mean": (1 + 1 + 1 + 2) / 4,
        "kl_per_token_mean": (5 / 6 + 3 / 4 + 2 / 4 + 5 / 4) / 4,
        "mean_age": (0 + 0.5 + 0.5 + 0) / 4,
        # {4, 1} 1.5, {2, 1} 0.5, {1, 1} 0, {D: 5} 0 -> EMA 1.5, 1.38, 1.2144, 1.068672
        "disagreement_std_ema": 1.068672,
        "teacher_tokens_per_trained_token": 22 / 18,
        "never_selected_scored_share": 4 / 22,  # a2, d0
    },
}
HAND_SERIES = {
    "vanilla": {"turns_per_rollout": [2, 1, 2, 1], "kl_per_token": [1.5, 1 / 6, 0.5, 0.5],
                "disagreement_std_ema": [0, 0.06, 0.0528, 0.046464]},
    "divopd": {"turns_per_rollout": [1, 1, 1, 2], "kl_per_token": [5 / 6, 0.75, 0.5, 1.25],
               "disagreement_std_ema": [1.5, 1.38, 1.2144, 1.068672]},
}


def _with_outcomes() -> list:
    """The hand log with rollout outcomes: A and D succeeded, the others failed."""
    from divopd.experience.log import LoggedTurn
    from test_replay import HAND_LOG

    out = []
    for i, (turn, u) in enumerate(HAND_LOG):
        turn = Turn(turn.rollout_id, turn.turn_index, turn.policy_version, turn.prompt_ids, turn.response_ids,
                    student_logprobs=turn.student_logprobs, teacher_logprobs=turn.teacher_logprobs,
                    prompt_truncated=turn.prompt_truncated, info={"success": turn.rollout_id in "AD"})
        out.append(LoggedTurn(turn, i, u))
    return out


def test_replay_reports_the_table_diagnostics_by_hand() -> None:
    from divopd.analysis.replay import TABLE_KEYS, ReplayConfig, replay
    from test_replay import HAND_CONFIG, hand_stream

    result = replay(hand_stream(), ReplayConfig(methods=["vanilla", "divopd"], **HAND_CONFIG))
    assert result["scored_tokens"] == 22
    for method, expected in HAND_TABLE.items():
        got = result["methods"][method]
        assert set(expected) <= set(TABLE_KEYS) and set(TABLE_KEYS) <= set(got)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value), (method, key)
        assert got["never_selected_share"] == got["unused_fraction"]
        for key, values in HAND_SERIES[method].items():
            assert got["series"][key] == pytest.approx(values), (method, key)
        # no success column: every turn's outcome is unknown; 7 of 8 selected turns are at depth < 2
        assert got["selected_by_cell"]["<2"] == {"success": 0, "failure": 0, "unknown": 7}
        assert got["selection_chain"]["[2,4)"]["unknown"] == pytest.approx(1 / 8)


def test_selection_chain_by_hand_and_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from divopd.analysis.replay import CHAIN_METHODS, ReplayConfig, replay
    from divopd.cli import main
    from divopd.experience.log import write_log

    stream = _with_outcomes()
    hand = dict(batch_size=2, pool_factor=2, cap=1, max_staleness=1, updates=4, seed=0)
    result = replay(stream, ReplayConfig(methods=list(CHAIN_METHODS), **hand))
    # delivered: A a0 a1 (<2) a2 ([2,4)), D d0 d1 (<2) d2 ([2,4)) succeeded; B0 C0 C1 E0 F0 (<2) failed
    assert result["delivered_by_cell"]["<2"] == {"success": 4, "failure": 5}
    assert result["delivered_by_cell"]["[2,4)"] == {"success": 2, "failure": 0}
    # vanilla: a0 a1 d0 | a2 | b0 c0 c1 f0;  divopd: a1 a0 d1 | d2 | b0 c1 e0 f0
    for method in ("vanilla", "divopd"):
        chain = result["methods"][method]["selection_chain"]
        assert chain["<2"] == {"success": 3 / 8, "failure": 4 / 8}
        assert chain["[2,4)"] == {"success": 1 / 8, "failure": 0.0}
        assert all(chain[b] == {"success": 0.0, "failure": 0.0} for b in ("[4,6)", "[6,10)", "≥10"))
    for m in result["methods"].values():
        assert sum(v for row in m["selection_chain"].values() for v in row.values()) == pytest.approx(1.0)

    log = tmp_path / "hand.parquet"
    write_log(log, stream)
    md, js = tmp_path / "chain.md", tmp_path / "r.json"
    args = "--batch-size 2 --pool-factor 2 --cap 1 --max-staleness 1 --updates 4".split()
    assert main(["replay", str(log), *args, "--selection-chain", str(md), "--json", str(js)]) == 0
    text = capsys.readouterr().out
    assert "selection chain" in text and "vanilla-pool" in text and "divopd-base" in text
    assert "37.5%" in text  # vanilla's and divopd's <2 × success share
    assert list(json.loads(js.read_text())["methods"]) == list(CHAIN_METHODS)
    table = md.read_text()
    assert "| depth | outcome | vanilla | vanilla-pool | divopd-base | divopd | delivered |" in table
    assert "| <2 | success | 37.5% |" in table and table.count("\n| ") == 10 + 1  # 5 buckets × 2 outcomes + header
    assert "selection Gini" in text and "0.375" in text  # the diagnostics table, vanilla Gini
    assert "Table 11: never selected, selection Gini;" in " ".join(text.split())  # the footnote names the tables


# ---------------------------------------------------------------------------------------------------- report
def _run_dir(root: Path, method: str, seed: int, per_update: list[dict[str, float]]) -> Path:
    d = root / f"{method}-{seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"method: {method}\nsetting: s\nseed: {seed}\n")
    lines = [json.dumps({"kind": "update", "update": u, "time": float(u), "learner/tokens_total": 10.0 * u,
                         "learner/compute_s_total": float(u), **rec}) for u, rec in enumerate(per_update, 1)]
    lines.append(json.dumps({"kind": "eval", "update": len(per_update), "eval/success_rate": 0.5,
                             "learner/tokens_total": 10.0 * len(per_update), "learner/compute_s_total": 1.0}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (d / "summary.json").write_text("{}")
    return d


def test_the_report_shows_the_diagnostics(tmp_path: Path) -> None:
    from divopd.analysis.report import find_run_dirs, load_run, write_report

    def rec(tpr: float, kl: float, step: float, age: float, ratio: float, ema: float) -> dict[str, float]:
        return {"sampler/turns_per_rollout": tpr, "sampler/kl_per_token": kl, "learner/compute_s": step,
                "sampler/mean_staleness": age, "sampler/teacher_tokens_per_trained_token": ratio,
                "sampler/disagreement_std_ema": ema, "sampler/effective_rollouts": 4.0,
                "sampler/max_rollout_share": 0.25}

    root = tmp_path / "runs"
    _run_dir(root, "vanilla", 0, [rec(4, 0.5, 1.0, 1.0, 8.0, 2.0), rec(2, 0.3, 3.0, 0.0, 4.0, 1.0)])
    _run_dir(root, "divopd", 0, [rec(1, 0.2, 1.0, 0.5, 6.0, 0.5), rec(1, 0.4, 1.0, 0.5, 3.0, 0.25)])
    _run_dir(root, "divopd", 1, [rec(2, 0.2, 2.0, 1.5, 5.0, 0.5), rec(2, 0.4, 2.0, 1.5, 2.0, 0.75)])
    rep = write_report([load_run(p) for p in find_run_dirs([root])], tmp_path / "out")
    van = rep["settings"]["s"]["methods"]["vanilla"]["aggregate"]["diagnostics"]
    assert van == pytest.approx({"effective_rollouts": 4.0, "top1_token_share": 0.25, "turns_per_rollout": 3.0,
                                 "kl_per_token": 0.4, "step_time_s": 2.0, "mean_age": 0.5,
                                 "teacher_tokens_per_trained_token": 4.0, "disagreement_std_ema": 1.0})
    div = rep["settings"]["s"]["methods"]["divopd"]["aggregate"]["diagnostics"]
    # seeds' per-update means then the mean over seeds; cumulative ratio and EMA: last value, mean over seeds
    assert div["turns_per_rollout"] == pytest.approx((1 + 2) / 2)
    assert div["mean_age"] == pytest.approx((0.5 + 1.5) / 2)
    assert div["teacher_tokens_per_trained_token"] == pytest.approx((3 + 2) / 2)
    assert div["disagreement_std_ema"] == pytest.approx((0.25 + 0.75) / 2)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Diagnostics of the paper's tables" in md
    assert "turns/rollout (T9)" in md and "mean age (T12)" in md and "disagr. std EMA (final) (F6)" in md
    assert "| vanilla | 4.00 | 0.250 | 3.00 | 0.400 | 2.00 | 0.50 | 4.00 | 1.00 |" in md
    assert (tmp_path / "out" / "s_diagnostics.png").read_bytes()[:4] == b"\x89PNG"
    # a run without the keys (older metrics): dashes, no error
    old = _run_dir(tmp_path / "old", "vanilla", 0, [{"sampler/effective_rollouts": 2.0}])
    rep = write_report([load_run(old)], tmp_path / "out-old", plots=False)
    assert rep["settings"]["s"]["methods"]["vanilla"]["aggregate"]["diagnostics"]["kl_per_token"] is None


def test_selection_chain_takes_a_rollouts_outcome_from_its_last_turn() -> None:
    """explorer.enqueue: turn — only a rollout's last turn carries ``success`` (the earlier ones were queued while it
    ran): every turn of it still gets the rollout's outcome; a rollout whose last turn never arrived stays unknown."""
    from divopd.analysis.replay import CHAIN_METHODS, ReplayConfig, replay
    from divopd.experience.log import LoggedTurn

    full = _with_outcomes()
    last = {}
    for logged in full:
        last[logged.turn.rollout_id] = logged.arrival
    streamed = []
    for logged in full:
        t = logged.turn
        known = logged.arrival == last[t.rollout_id] and t.rollout_id != "C"  # C's last turn is still in flight
        info = {"success": t.info["success"] if known else None}
        streamed.append(LoggedTurn(Turn(t.rollout_id, t.turn_index, t.policy_version, t.prompt_ids, t.response_ids,
                                        student_logprobs=t.student_logprobs, teacher_logprobs=t.teacher_logprobs,
                                        prompt_truncated=t.prompt_truncated, info=info), logged.arrival,
                                   logged.arrival_update))
    hand = dict(batch_size=2, pool_factor=2, cap=1, max_staleness=1, updates=4, seed=0)
    a = replay(full, ReplayConfig(methods=list(CHAIN_METHODS), **hand))
    b = replay(streamed, ReplayConfig(methods=list(CHAIN_METHODS), **hand))
    # C (c0, c1 at depth < 2, failed) becomes unknown; every other turn keeps its rollout's outcome
    assert b["delivered_by_cell"]["<2"] == {"success": 4, "failure": 3, "unknown": 2}
    for method in ("vanilla", "divopd"):
        chain_a, chain_b = a["methods"][method]["selection_chain"], b["methods"][method]["selection_chain"]
        assert chain_b["[2,4)"] == chain_a["[2,4)"] | {"unknown": 0.0}
        assert chain_b["<2"]["success"] == chain_a["<2"]["success"] == 3 / 8
        c_selected = chain_b["<2"]["unknown"]
        assert c_selected > 0 and chain_b["<2"]["failure"] == pytest.approx(chain_a["<2"]["failure"] - c_selected)
