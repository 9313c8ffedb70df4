"""Metrics of Section 4, checked against hand-computed answers, and the metrics.jsonl writer."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from divopd.experience.metrics import (
    Cost,
    EvalPoint,
    MetricsWriter,
    cost_to_target,
    default_target,
    final_five,
    geometric_mean,
    nauc,
    peak_sr,
    reaches,
    speedup,
)


def test_peak_sr():
    assert peak_sr([10.0, 30.0, 20.0]) == 30.0
    assert peak_sr([]) is None


def test_final_five_uses_last_five_and_population_std():
    mean, std = final_five([0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert mean == pytest.approx(40.0)  # (20+30+40+50+60)/5
    assert std == pytest.approx(math.sqrt(200.0))  # (400+100+0+100+400)/5 = 200


def test_final_five_with_fewer_evals_and_none():
    assert final_five([10.0, 20.0]) == pytest.approx((15.0, 5.0))
    assert final_five([]) is None
    with pytest.raises(ValueError):
        final_five([1.0], n=0)


def test_nauc_trapezoid_and_step_by_hand():
    u, s = [0, 10, 20], [0.0, 20.0, 40.0]
    # trapezoid: (0+20)/2*10 + (20+40)/2*10 = 400 over span 20
    assert nauc(u, s, 20) == pytest.approx(20.0)
    # step: 0*10 + 20*10 = 200 over 20
    assert nauc(u, s, 20, rule="step") == pytest.approx(10.0)
    # budget between evals: trapezoid interpolates SR 30 at update 15 -> 100 + (20+30)/2*5 = 225 over 15
    assert nauc(u, s, 15) == pytest.approx(15.0)
    assert nauc(u, s, 15, rule="step") == pytest.approx(100.0 / 15.0)
    assert nauc(u, s, 0) == 0.0
    assert nauc(u, s, 25) is None  # run does not cover the budget


def test_nauc_rejects_bad_inputs():
    with pytest.raises(ValueError, match="strictly increasing"):
        nauc([0, 10, 10], [1.0, 2.0, 3.0], 10)
    with pytest.raises(ValueError, match="before the first eval"):
        nauc([5, 10], [1.0, 2.0], 2)
    with pytest.raises(ValueError, match="rule"):
        nauc([0, 10], [1.0, 2.0], 10, rule="simpson")
    with pytest.raises(ValueError, match="SR values"):
        nauc([0, 10], [1.0], 10)
    assert nauc([], [], 10) is None


@given(st.lists(st.floats(0, 100), min_size=2, max_size=20), st.data())
def test_nauc_is_a_mean_between_min_and_max(srs, data):
    updates = list(range(0, 10 * len(srs), 10))
    budget = data.draw(st.integers(1, updates[-1]))
    for rule in ("trapezoid", "step"):
        value = nauc(updates, srs, budget, rule=rule)
        assert min(srs) - 1e-9 <= value <= max(srs) + 1e-9


def test_default_target():
    assert default_target(77.4) == 75.0
    assert default_target(80.0) == 80.0
    assert default_target(0.8 * 100) == 80.0
    assert default_target(4.9) is None
    assert default_target(100.0) == 100.0


def test_reaches_tolerates_float_noise():
    assert 0.29 * 100 < 29.0  # 28.999999999999996
    assert reaches(0.29 * 100, 29.0)
    assert not reaches(28.9, 29.0)


def test_cost_to_target_is_cumulative_cost_at_first_eval_reaching_tau():
    evals = [
        EvalPoint(0, 10.0, 0.0, 0.0),
        EvalPoint(10, 30.0, 1000.0, 5.0),
        EvalPoint(20, 50.0, 2000.0, 10.0),
        EvalPoint(30, 40.0, 3000.0, 15.0),
    ]
    assert cost_to_target(evals, 30.0) == Cost(update=10, tokens=1000.0, compute_s=5.0)
    assert cost_to_target(evals, 45.0) == Cost(update=20, tokens=2000.0, compute_s=10.0)
    assert cost_to_target(evals, 60.0) is None
    assert cost_to_target([], 5.0) is None


def test_speedup_is_vanilla_over_method():
    assert speedup(2000.0, 1000.0) == 2.0
    assert speedup(1000.0, 2000.0) == 0.5
    assert speedup(None, 1000.0) is None
    assert speedup(1000.0, None) is None
    assert speedup(0.0, 0.0) == 1.0
    assert speedup(10.0, 0.0) == math.inf
    with pytest.raises(ValueError):
        speedup(-1.0, 2.0)


def test_geometric_mean():
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([1.84]) == pytest.approx(1.84)
    assert geometric_mean([1.5, 2.0, 3.0]) == pytest.approx(9.0 ** (1 / 3))
    assert geometric_mean([]) is None
    with pytest.raises(ValueError):
        geometric_mean([1.0, 0.0])
    with pytest.raises(ValueError):
        geometric_mean([math.inf])


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_writer_appends_records(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as mw:
        rec = mw.update(1, {"learner/loss": 0.5, "learner/tokens_total": 100, "bad": float("nan")}, time=1.5)
        mw.eval(1, {"eval/success_rate": 0.25})
    assert rec == {
        "kind": "update",
        "update": 1,
        "time": 1.5,
        "learner/loss": 0.5,
        "learner/tokens_total": 100,
        "bad": None,
    }
    lines = _read(tmp_path / "metrics.jsonl")
    assert [r["kind"] for r in lines] == ["update", "eval"]
    assert lines[1]["eval/success_rate"] == 0.25 and lines[1]["time"] >= 0.0
    # reopening appends
    with MetricsWriter(tmp_path, tensorboard=False) as mw:
        mw.update(2, {"learner/loss": 0.4})
    assert [r["update"] for r in _read(tmp_path / "metrics.jsonl")] == [1, 1, 2]


def test_metrics_writer_rejects_bad_records(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as mw:
        with pytest.raises(ValueError, match="kind"):
            mw.write("train", 1, {})
        with pytest.raises(ValueError, match="update"):
            mw.update(-1, {})
        with pytest.raises(ValueError, match="reserved"):
            mw.update(1, {"time": 3.0})
        with pytest.raises(TypeError, match="not a JSON scalar"):
            mw.update(1, {"x": [1, 2]})
    with pytest.raises(ValueError, match="closed"):
        mw.update(1, {})
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_metrics_writer_repairs_cut_off_line_and_truncates_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"kind": "update", "update": u, "time": float(u)} for u in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "upd')
    with pytest.warns(UserWarning, match="cut-off"):
        mw = MetricsWriter(tmp_path, tensorboard=False, truncate_after=2, time_offset=100.0)
    rec = mw.update(3, {})
    mw.close()
    assert rec["time"] >= 100.0
    assert [r["update"] for r in _read(path)] == [1, 2, 3]


def test_metrics_writer_mirrors_to_tensorboard(tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    with MetricsWriter(tmp_path) as mw:
        mw.update(1, {"learner/loss": 0.5, "note": "text is not a scalar"})
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_metrics_writer_converts_numpy_scalars(tmp_path):
    np = pytest.importorskip("numpy")
    with MetricsWriter(tmp_path, tensorboard=False) as mw:
        rec = mw.update(1, {"a": np.int64(3), "b": np.float32(0.5), "c": np.float64("inf")})
        with pytest.raises(TypeError, match="'d'"):
            mw.update(2, {"d": np.zeros(3)})
    assert (rec["a"], rec["b"], rec["c"]) == (3, 0.5, None)
    assert _read(tmp_path / "metrics.jsonl") == [rec]
