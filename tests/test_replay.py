"""Replay: a hand-built log with a known answer for every JSON field, the delivery and coverage rules, and the CLI."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from divopd import Turn
from divopd.analysis.replay import (
    RESULT_KEYS,
    SERIES_KEYS,
    TABLE_KEYS,
    ReplayConfig,
    deliveries,
    replay,
    rollout_coverage,
)
from divopd.cli import main
from divopd.experience.log import LoggedTurn, read_log, rows_to_batch, turn_to_row, write_log


def turn(rid: str, t: int, version: int, teacher: list[float], n: int = 2, truncated: bool = False) -> Turn:
    """A turn of ``n`` tokens with student log prob −1 per token; disagreement = Σ(−1 − teacher)."""
    return Turn(
        rid, t, version, [0], [1] * n, student_logprobs=[-1.0] * n, teacher_logprobs=teacher, prompt_truncated=truncated
    )


def d(x: float, n: int = 2) -> list[float]:
    """Teacher log probs giving disagreement ``x`` over ``n`` tokens."""
    return [-1.0 - x / n] * n


NAN = float("nan")

# (turn, arrival_update). Disagreements: a0=2, a1=4, a2=0, b0=1 (4 tokens), c0 truncated (no teacher score),
# c1=1, e0=1, f0=1, d0=1, d1=2, d2=3.
HAND_LOG = [
    (turn("A", 0, 0, d(2)), 0),
    (turn("A", 1, 0, d(4)), 0),
    (turn("A", 2, 0, d(0)), 0),
    (turn("B", 0, 0, d(1, 4), n=4), 0),
    (turn("C", 0, 1, [NAN, NAN], truncated=True), 1),
    (turn("C", 1, 1, d(1)), 1),
    (turn("E", 0, 1, d(1)), 1),
    (turn("F", 0, 2, d(1)), 2),
    (turn("D", 0, 3, d(1)), 3),
    (turn("D", 1, 3, d(2)), 3),
    (turn("D", 2, 3, d(3)), 3),
]
HAND_CONFIG = dict(batch_size=2, pool_factor=2, cap=1, max_staleness=1, updates=4, seed=0)

# Worked by hand from the rules (B=2, pool 4, k=1, S=1, ticks 0..3).
# vanilla reads arrival order, ungated:  t0 {a0,a1}  t1 {a2,b0}  t2 {c0 (dead), c1}  t3 e0 expires (v1 < 3−1), {f0,d0};
#   d1, d2 still queued.  Effective rollouts 1, 1.8 (token shares 1/3, 2/3), 1, 2; max shares 1, 2/3, 1, 1/2.
# divopd (pool + gate + rollout-first k=1 + focus): t0 pool {a0,a1,a2,b0} -> A's top a1, B's b0;
#   t1 pool {a0,a2 pending; c0 read and rejected; c1} (the read stops at c·B = 4: e0 stays queued) -> A: a0 (d=2 > 0),
#   C: c1;   t2 a2 expires (v0 < 1), pool {e0, f0};
#   t3 pool {d0,d1,d2} -> pass 0 d2, pass 1 d1; d0 pending.  Effective 1.8, 2, 2, 1; max shares 2/3, 1/2, 1/2, 1.
# Valid rollouts A B C E F D (c1 makes C valid). vanilla never uses E; D has turns waiting in both (undecided).
EXPECTED = {
    "vanilla": {
        "updates": 4,
        "starved": 0,
        "valid_rollouts": 6,
        "used_rollouts": 5,
        "undecided_rollouts": 1,
        "unused_fraction": 1 / 5,
        "effective_rollouts_mean": (1 + 1.8 + 1 + 2) / 4,
        "max_rollout_share_mean": (1 + 2 / 3 + 1 + 0.5) / 4,
        "candidate_rollouts_mean": (1 + 2 + 1 + 2) / 4,  # vanilla's candidates are its batch
        "dead_row_fraction": 1 / 8,
        "selected": 8,
        "expired": 1,
        "invalid": 0,
    },
    "divopd": {
        "updates": 4,
        "starved": 0,
        "valid_rollouts": 6,
        "used_rollouts": 6,
        "undecided_rollouts": 1,
        "unused_fraction": 0.0,
        "effective_rollouts_mean": (1.8 + 2 + 2 + 1) / 4,
        "max_rollout_share_mean": (2 / 3 + 0.5 + 0.5 + 1) / 4,
        "candidate_rollouts_mean": (2 + 2 + 2 + 1) / 4,  # valid pools {A,B} {A,C} {E,F} {D}
        "dead_row_fraction": 0.0,
        "selected": 8,
        "expired": 1,
        "invalid": 1,
    },
}
EXPECTED_SERIES = {
    "vanilla": {
        "batch": [1, 1, 1, 1],
        "effective_rollouts": [1, 1.8, 1, 2],
        "max_rollout_share": [1, 2 / 3, 1, 0.5],
        "candidate_rollouts": [1, 2, 1, 2],
        "dead_rows": [0, 0, 1, 0],
        "mean_staleness": [0, 1, 1, 0.5],
        "selected": [2, 4, 6, 8],
        "expired": [0, 0, 0, 1],
        "invalid": [0, 0, 0, 0],
        "waiting": [2, 3, 2, 2],
        "used_rollouts": [1, 2, 3, 5],
    },
    "divopd": {
        "batch": [1, 1, 1, 1],
        "effective_rollouts": [1.8, 2, 2, 1],
        "max_rollout_share": [2 / 3, 0.5, 0.5, 1],
        "candidate_rollouts": [2, 2, 2, 1],
        "dead_rows": [0, 0, 0, 0],
        "mean_staleness": [0, 0.5, 0.5, 0],
        "selected": [2, 4, 6, 8],
        "expired": [0, 0, 1, 1],
        "invalid": [0, 1, 1, 1],
        "waiting": [2, 2, 0, 1],
        "used_rollouts": [2, 3, 5, 6],
    },
}


def hand_stream() -> list[LoggedTurn]:
    return [LoggedTurn(t, i, u) for i, (t, u) in enumerate(HAND_LOG)]


def check_hand_result(result: dict) -> None:
    assert result["updates"] == 4
    assert result["delivered_turns"] == 11 and result["delivered_rollouts"] == 6
    assert result["arrival_drain_ratio"] == pytest.approx(11 / 8)
    assert result["series"] == {"delivered_turns": [4, 7, 8, 11], "valid_rollouts": [2, 4, 5, 6]}
    assert list(result["methods"]) == ["vanilla", "divopd"]
    for method, expected in EXPECTED.items():
        got = result["methods"][method]
        assert list(got) == [*RESULT_KEYS, *TABLE_KEYS, "series", "ledger"]
        for key in RESULT_KEYS:
            assert got[key] == pytest.approx(expected[key]), (method, key)
        assert set(got["series"]) == set(SERIES_KEYS)
        for key, values in EXPECTED_SERIES[method].items():
            assert got["series"][key] == pytest.approx(values), (method, key)
        ledger = got["ledger"]
        assert ledger["received"] == 11
        assert ledger["selected"] + ledger["expired"] + ledger["invalid"] + ledger["pending"] + ledger["queued"] == 11
    assert result["methods"]["vanilla"]["ledger"]["queued"] == 2
    assert result["methods"]["divopd"]["ledger"]["pending"] == 1
    assert result["methods"]["divopd"]["ledger"]["invalid_by_reason"]["prompt_truncated"] == 1


def test_hand_built_log_in_memory():
    check_hand_result(replay(hand_stream(), ReplayConfig(methods=["vanilla", "divopd"], **HAND_CONFIG)))


def test_hand_built_log_through_the_cli(tmp_path, capsys):
    log = tmp_path / "hand.parquet"
    write_log(log, [(t, i, u) for i, (t, u) in enumerate(HAND_LOG)])
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = "--methods vanilla,divopd --batch-size 2 --pool-factor 2 --cap 1 --max-staleness 1 --updates 4".split()
    rc = main(["replay", str(log), *args, "--json", str(out), "--plot", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "vanilla" in text and "divopd" in text and "20.0%" in text  # vanilla's unused fraction in the table
    result = json.loads(out.read_text())  # strict JSON
    check_hand_result(result)
    assert result["log"] == str(log)
    assert result["config"] == {
        "methods": ["vanilla", "divopd"],
        "batch_size": 2,
        "pool_factor": 2,
        "cap": 1,
        "max_staleness": 1,
        "updates": 4,
        "seed": 0,
        "max_pending": None,
        "cap_unit": "turns",
        "max_pending_age": 8,
        "group_order": "first-seen",
    }
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_updates_run_through_the_last_arrival_update(tmp_path):
    log = tmp_path / "hand.parquet"
    write_log(log, [(t, i, u) for i, (t, u) in enumerate(HAND_LOG)])
    cfg = {**HAND_CONFIG, "updates": None}
    assert replay(log, ReplayConfig(methods=["vanilla"], **cfg))["updates"] == 4
    assert replay(hand_stream(), ReplayConfig(methods=["vanilla"], **cfg))["updates"] == 4


def test_starved_ticks_and_undelivered_turns():
    # B=5, U=2: both starve at t0 (4 turns) and compose at t1
    cfg = ReplayConfig(methods=["vanilla", "divopd"], **{**HAND_CONFIG, "batch_size": 5, "updates": 2})
    result = replay(hand_stream(), cfg)
    assert result["delivered_turns"] == 7  # turns with arrival_update >= 2 are never delivered
    v = result["methods"]["vanilla"]
    assert (v["updates"], v["starved"]) == (1, 1)  # t0: 4 < 5 queued; t1: 7 queued -> one batch
    assert v["series"]["batch"] == [0, 1] and v["series"]["effective_rollouts"][0] is None
    p = result["methods"]["divopd"]
    assert (p["updates"], p["starved"]) == (1, 1)  # t0: pool of 4 valid < 5; t1: pool of 6 (c0 rejected) -> batch
    for m in result["methods"].values():
        assert m["updates"] + m["starved"] == 2


def test_deliveries_rule():
    stream = [LoggedTurn(t, i, u) for i, (t, u) in enumerate(HAND_LOG)]
    got = [(j, [x.arrival for x in batch]) for j, batch in deliveries(stream, 5)]
    assert got == [(0, [0, 1, 2, 3]), (1, [4, 5, 6]), (2, [7]), (3, [8, 9, 10]), (4, [])]
    late = [LoggedTurn(HAND_LOG[0][0], 0, 3)]
    assert [len(b) for _, b in deliveries(late, 3)] == [0, 0, 0]
    shuffled = [stream[1], stream[0]]
    with pytest.raises(ValueError, match="out of order"):
        list(deliveries(shuffled, 2))


def test_rollout_coverage_rule():
    valid = {"a", "b", "c", "d"}
    used = {"a", "c", "x"}  # x: an invalid rollout used (a dead row) is not a used valid rollout
    waiting = Counter({"c": 1, "d": 2, "x": 1})
    got = rollout_coverage(valid, used, waiting)
    assert got == {"valid_rollouts": 4, "used_rollouts": 2, "undecided_rollouts": 2, "unused_fraction": 0.5}
    assert rollout_coverage({"a"}, set(), Counter({"a": 1}))["unused_fraction"] is None


def test_all_methods_see_the_same_deliveries():
    methods = ["vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "divopd-focus"]
    result = replay(hand_stream(), ReplayConfig(methods=methods, **HAND_CONFIG))
    assert {m["valid_rollouts"] for m in result["methods"].values()} == {6}
    assert {m["ledger"]["received"] for m in result["methods"].values()} == {11}


def test_bad_configs_and_logs_are_reported(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        ReplayConfig(methods=["nope"])
    with pytest.raises(ValueError, match="duplicate"):
        ReplayConfig(methods=["divopd", "divopd"])
    rows = [turn_to_row(t, i, u) for i, (t, u) in enumerate(HAND_LOG)]
    table = pa.Table.from_batches([rows_to_batch(rows)]).drop_columns(["response_len"])
    pq.write_table(table, tmp_path / "bad.parquet")
    assert main(["replay", str(tmp_path / "bad.parquet")]) == 2
    assert "missing required column(s) 'response_len'" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "hand.parquet"), "--methods", "vanilla,bogus"]) == 2
    assert "unknown method 'bogus'" in capsys.readouterr().err


def test_replay_reads_back_what_was_written(tmp_path):
    """Replaying the Parquet log gives the same result as replaying the turns in memory."""
    log = tmp_path / "hand"
    write_log(log, [(t, i, u) for i, (t, u) in enumerate(HAND_LOG)])
    assert len(list(read_log(log))) == 11
    cfg = ReplayConfig(methods=["divopd-base", "divopd"], **HAND_CONFIG)
    from_file = replay(log, cfg)["methods"]
    in_memory = replay(hand_stream(), cfg)["methods"]
    assert from_file == in_memory


def test_replay_demo_writes_table_and_plots(tmp_path):
    from divopd.suite.demo_replay import DEMO_METHODS, run_replay_demo

    results = run_replay_demo(tmp_path, presets=("webshop",), updates=6)
    assert set(results) == {"webshop"} and list(results["webshop"]["methods"]) == list(DEMO_METHODS)
    table = (tmp_path / "table.md").read_text()
    assert table.count("| webshop |") == len(DEMO_METHODS)
    for name in ("summary.png", "webshop.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "webshop.json").read_text())["updates"] == 6
