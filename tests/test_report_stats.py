"""The report's statistics over seeds: bootstrap CIs and the paired Wilcoxon signed-rank test, checked
against cases computed by hand and against brute-force enumeration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from divopd.analysis.report.compute import paired_tests
from divopd.analysis.report.stats import bootstrap_ci, paired_values, wilcoxon_signed_rank


def test_all_positive_differences_give_the_smallest_exact_p() -> None:
    # n = 5, every difference positive: W+ = 15, P(W+ >= 15) = 1/32, two-sided 2/32
    r = wilcoxon_signed_rank([2, 3, 4, 5, 6], [1, 1, 1, 1, 1])
    assert r["n"] == 5 and r["w_plus"] == 15 and r["w_minus"] == 0
    assert r["p_value"] == pytest.approx(2 / 32)
    assert r["exact"] is True


def test_darwin_maize_data() -> None:
    # Darwin's paired differences (SciPy's documented example): W− = 24, exact two-sided p = 0.041259765625
    d = [6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75]
    r = wilcoxon_signed_rank(d, [0] * len(d))
    assert r["w_minus"] == 24 and r["w_plus"] == 120 - 24
    assert r["p_value"] == pytest.approx(0.041259765625, abs=1e-12)


def test_zero_differences_are_dropped_and_all_ties_give_no_p() -> None:
    r = wilcoxon_signed_rank([1, 2, 3], [1, 2, 3])
    assert r["n"] == 0 and r["zeros"] == 3 and r["p_value"] is None
    r = wilcoxon_signed_rank([1, 5, 3, 9], [1, 2, 3, 4])
    assert r["n"] == 2 and r["zeros"] == 2
    assert r["p_value"] == pytest.approx(0.5)  # two positive of two: P = 1/4, two-sided 1/2


def _brute_force_p(d: list[float]) -> float:
    d = [x for x in d if x != 0]
    a = np.abs(np.asarray(d, dtype=float))
    ranks = np.array([np.mean([j + 1 for j, v in enumerate(sorted(a)) if v == x]) for x in a])
    w = float(ranks[np.asarray(d) > 0].sum())
    sums = [float(np.dot(signs, ranks)) for signs in itertools.product([0, 1], repeat=len(d))]
    lower = np.mean([s <= w + 1e-9 for s in sums])
    upper = np.mean([s >= w - 1e-9 for s in sums])
    return min(1.0, 2 * min(lower, upper))


@given(st.lists(st.integers(-4, 4), min_size=1, max_size=9))
def test_exact_p_equals_brute_force_enumeration_with_ties(d: list[int]) -> None:
    r = wilcoxon_signed_rank(d, [0] * len(d))
    if all(x == 0 for x in d):
        assert r["p_value"] is None
    else:
        assert r["p_value"] == pytest.approx(_brute_force_p(d), abs=1e-12)


def test_normal_approximation_above_the_exact_limit_is_close() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0.3, 1, size=80)
    r = wilcoxon_signed_rank(x, np.zeros(80))
    assert r["exact"] is False and 0 < r["p_value"] < 0.2


def test_bootstrap_ci_brackets_the_mean_and_is_reproducible() -> None:
    vals = [10.0, 12.0, 15.0, 11.0, 30.0, 9.0]
    lo, hi = bootstrap_ci(vals)
    assert lo < np.mean(vals) < hi
    assert min(vals) <= lo and hi <= max(vals)
    assert bootstrap_ci(vals) == (lo, hi)
    assert bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)
    assert bootstrap_ci([5.0]) is None
    with pytest.raises(ValueError):
        bootstrap_ci(vals, level=1.5)


def test_paired_values_keep_common_seeds_with_values() -> None:
    seeds, x, y = paired_values({0: 1.0, 1: 2.0, 2: None, 3: 4.0}, {1: 5.0, 2: 6.0, 3: 7.0, 4: 8.0})
    assert seeds == [1, 3] and x == [2.0, 4.0] and y == [5.0, 7.0]


def test_paired_tests_pair_by_seed_and_name_the_controls() -> None:
    def entry(naucs: dict[int, float]) -> dict:
        return {"seeds": [{"seed": s, "nauc": v, "tokens_to_target": None} for s, v in naucs.items()]}

    methods = {"vanilla": entry({0: 10.0, 1: 20.0, 2: 30.0}), "divopd": entry({2: 35.0, 0: 12.0, 1: 25.0}),
               "nocap": entry({0: 1.0})}
    tests = paired_tests(methods, "vanilla")
    assert len(tests) == 1  # divopd-base is absent; tokens-to-τ has no pair
    t = tests[0]
    assert (t["method"], t["against"], t["metric"], t["seeds"]) == ("divopd", "vanilla", "nauc", [0, 1, 2])
    assert t["w_plus"] == 6 and t["p_value"] == pytest.approx(2 / 8)


def test_the_gate_is_tested_as_vanilla_pool_against_the_baseline() -> None:
    def entry(naucs: dict[int, float]) -> dict:
        return {"seeds": [{"seed": s, "nauc": v, "tokens_to_target": None} for s, v in naucs.items()]}

    tests = paired_tests({"vanilla": entry({0: 10.0, 1: 20.0}), "vanilla-pool": entry({0: 11.0, 1: 22.0})}, "vanilla")
    assert [(t["method"], t["against"], t["question"]) for t in tests] == [
        ("vanilla-pool", "vanilla", "the validity gate")]
