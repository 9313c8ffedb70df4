"""``divopd tune-cap``: coverage per k on a hand-built log whose answer is worked out by hand, and the rule."""

from __future__ import annotations

import json

import pytest

from divopd.analysis.tune_cap import INF_CAP, parse_caps, recommend_cap, tune_cap
from divopd.cli import main
from divopd.experience.log import write_log
from sampler_helpers import turn

U = 3
SETTINGS = dict(batch_size=4, pool_factor=2, max_staleness=0)


def hand_log() -> list:
    """Before tick j (j = 0, 1, 2): four rollouts j0…j3 of four 2-token turns, policy version j, in that order.

    With B = 4, c = 2 (pool of 8 turns) and S = 0, tick j's pool holds rollouts j0 and j1 (the rest of the previous
    tick is stale and expires; j2 and j3 stay queued and expire at tick j + 1). So, at every tick:

    - k = 1: pass 0 takes 1 + 1 turns, pass 1 raises the cap to 2: j0 ×2, j1 ×2 (2 < ⌈4/1⌉ rollouts: cap relaxed);
    - k = 2: j0 ×2, j1 ×2 (eff. rollouts 2, max share 1/2, ⌈4/2⌉ = 2 met);
    - k = 3: j0 ×3, j1 ×1 (eff. 1 / (9/16 + 1/16) = 1.6, max share 3/4);
    - k = 4 and ∞: j0 ×4 (eff. 1, max share 1).

    At the end the last tick's rollouts are undecided (queued, or with turns pending), except k ≥ 4's fully used 20.
    Unused fraction: k ≤ 3 use 2 of the 4 rollouts of ticks 0 and 1: 4/8 = 0.5; k ≥ 4 use 1 per tick: 6 of the 9
    decided rollouts (ticks 0, 1 and rollout 20) are unused: 2/3.
    """
    rows = []
    arrival = 0
    for j in range(U):
        for r in range(4):
            for i in range(4):
                rows.append((turn(f"{j}{r}", i, version=j, n=2, score=float(i)), arrival, j))
                arrival += 1
    return rows


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "hand.parquet"
    write_log(path, hand_log())
    return path


def by_cap(result):
    return {r["cap"]: r for r in result["caps"]}


def test_coverage_per_cap_by_hand(log) -> None:
    result = tune_cap(log, "1,2,3,4,inf", **SETTINGS)
    rows = by_cap(result)
    assert list(rows) == [1, 2, 3, 4, "inf"]
    assert result["updates"] == U and result["delivered_turns"] == 48 and result["delivered_rollouts"] == 12
    for k in (1, 2, 3):
        assert rows[k]["unused_fraction"] == pytest.approx(0.5)
        assert rows[k]["used_rollouts"] == 6 and rows[k]["undecided_rollouts"] == 4
    for k in (4, "inf"):
        assert rows[k]["unused_fraction"] == pytest.approx(2 / 3)
        assert rows[k]["used_rollouts"] == 3 and rows[k]["undecided_rollouts"] == 3
    expect = {1: (2.0, 0.5, 2), 2: (2.0, 0.5, 2), 3: (1.6, 0.75, 2), 4: (1.0, 1.0, 1), "inf": (1.0, 1.0, 1)}
    for k, (eff, share, distinct) in expect.items():
        r = rows[k]
        assert r["effective_rollouts_mean"] == pytest.approx(eff)
        assert r["max_rollout_share_mean"] == pytest.approx(share)
        assert r["distinct_rollouts_mean"] == distinct and r["distinct_rollouts_min"] == distinct
        assert r["starved"] == 0 and r["dead_row_fraction"] == 0 and r["mean_staleness"] == 0
        assert r["selected"] == 4 * U
    assert [rows[k]["promised_rollouts"] for k in (1, 2, 3, 4, "inf")] == [4, 2, 2, 1, 1]
    assert [rows[k]["cap_binds_fraction"] for k in (1, 2, 3, 4, "inf")] == [0, 1, 1, 1, 1]
    # the rule: best unused 0.5 at k ∈ {1, 2, 3}; effective rollouts >= 0.9 × 2.0 keeps {1, 2}; the largest is 2
    assert result["recommended"] == 2
    assert "k ∈ {1, 2, 3}" in result["reason"] and "k ∈ {1, 2}" in result["reason"]


def test_tolerances_move_the_pick(log) -> None:
    assert tune_cap(log, [1, 2, 3, 4], eff_tol=0.5, **SETTINGS)["recommended"] == 3  # spread no longer decides
    assert tune_cap(log, [3, 4], unused_tol=0.2, eff_tol=0.5, **SETTINGS)["recommended"] == 4
    assert tune_cap(log, [3, 4], **SETTINGS)["recommended"] == 3


def test_token_cap_with_equal_lengths_gives_the_same_rows(log) -> None:
    turns = tune_cap(log, [1, 2, 3, 4], **SETTINGS)
    tokens = tune_cap(log, [1, 2, 3, 4], cap_unit="tokens", **SETTINGS)
    assert tokens["caps"] == turns["caps"] and tokens["config"]["cap_unit"] == "tokens"


def test_in_memory_log_and_focus_method() -> None:
    from divopd.experience.log import LoggedTurn

    stream = [LoggedTurn(*row) for row in hand_log()]
    result = tune_cap(stream, [2, 4], method="divopd", **SETTINGS)
    assert result["log"] is None and [r["used_rollouts"] for r in result["caps"]] == [6, 3]


def test_recommend_cap_rule_steps() -> None:
    def row(cap, starved, unused, eff, updates=10):
        return dict(cap=cap, starved=starved, unused_fraction=unused, effective_rollouts_mean=eff, updates=updates)

    # a cap that starves the learner is dropped even with the best coverage
    assert recommend_cap([row(2, 3, 0.0, 30.0), row(4, 0, 0.05, 20.0), row(8, 0, 0.30, 10.0)])[0] == 4
    # within 2 points of the best coverage and 90 % of the best spread: the largest
    assert recommend_cap([row(2, 0, 0.10, 30.0), row(4, 0, 0.11, 28.0), row(8, 0, 0.11, 20.0)])[0] == 4
    assert recommend_cap([row(2, 0, 0.10, 30.0), row("inf", 0, 0.10, 30.0)])[0] == "inf"
    # no decided rollout: coverage is skipped, spread decides
    assert recommend_cap([row(2, 0, None, 30.0), row(4, 0, None, 10.0)])[0] == 2
    assert recommend_cap([row(2, 10, None, None, updates=0)])[0] is None
    with pytest.raises(ValueError):
        recommend_cap([row(2, 0, 0.1, 1.0)], eff_tol=1.0)


def test_parse_caps() -> None:
    assert parse_caps("8, 2,4,inf,2") == [2, 4, 8, INF_CAP]
    for bad in ("0", "x", "", "2.5"):
        with pytest.raises(ValueError, match="caps"):
            parse_caps(bad)


def test_cli(log, tmp_path, capsys) -> None:
    out, png, md = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "t.md"
    args = ["--caps", "1,2,3,4,inf", "--batch-size", "4", "--pool-factor", "2", "--max-staleness", "0"]
    rc = main(["tune-cap", str(log), *args, "--json", str(out), "--plot", str(png), "--markdown", str(md)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "recommended k = 2" in text and "50.0%" in text and "66.7%" in text
    result = json.loads(out.read_text())
    assert result["recommended"] == 2 and result["config"]["caps"] == [1, 2, 3, 4, "inf"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 2 ← |" in md.read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "vanilla"], "does not change"),
        (["--caps", "0"], "caps"),
        (["--cap-unit", "turns", "--updates", "0"], "updates"),
    ],
)
def test_cli_errors(log, capsys, extra, message) -> None:
    assert main(["tune-cap", str(log), "--batch-size", "4", *extra]) == 2
    assert message in capsys.readouterr().err


def test_missing_log(tmp_path, capsys) -> None:
    assert main(["tune-cap", str(tmp_path / "nope.parquet")]) == 2
    assert "tune-cap" in capsys.readouterr().err
