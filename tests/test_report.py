"""``divopd report`` on synthetic run directories with hand-computed answers.

Setting s1 (two seeds per method, evals every 10 updates from 0 to 50):
    vanilla seed 0  SR 10 30 50 60 70 72   tokens 100/update, compute 1.0 s/update
    vanilla seed 1  SR 10 20 40 50 60 76
    divopd  seed 0  SR 20 50 70 80 80 85   tokens 50/update,  compute 0.6 s/update
    divopd  seed 1  SR 20 40 60 70 90 80
  vanilla peaks 72, 76 -> mean 74 -> τ = 70.
  vanilla reaches 70 at updates 40, 50 -> tokens 4000, 5000 (mean 4500), compute 40, 50 (mean 45).
  divopd  reaches 70 at updates 20, 30 -> tokens 1000, 1500 (mean 1250), compute 12, 18 (mean 15).
  ratios: tokens 4500/1250 = 3.6, compute 45/15 = 3.0.
  final-five vanilla: seed 0 (30+50+60+70+72)/5 = 56.4, seed 1 (20+40+50+60+76)/5 = 49.2 -> mean 52.8,
    sample std 7.2/√2.
  U = 50; nAUC (trapezoid) vanilla seed 0: 10·((10+72)/2 + 30+50+60+70)/50 = 50.2.
Setting s2 (one seed each, evals at 0, 5, 10, 15):
    vanilla SR 0 10 20 30, tokens 100/update, compute 1 s/update -> τ = 30, reached at 15: 1500 tokens, 15 s.
    divopd  SR 0 20 30 30, tokens 93.75/update, compute 0.75 s/update -> reached at 10: 937.5 tokens, 7.5 s.
  ratios: tokens 1500/937.5 = 1.6, compute 15/7.5 = 2.0.
  final-five vanilla (4 evals): mean 15, std over checkpoints √((225+25+25+225)/4) = √125.
Setting s3: divopd only, still running (no summary.json, cut-off last line) -> no τ, ratios omitted.
Geometric means for divopd: tokens √(3.6·1.6) = 2.4, compute √(3.0·2.0) = √6, over 2 of 3 settings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from divopd.analysis.report import ReportError, build_report, find_run_dirs, load_run, write_report
from divopd.cli import main


def make_run(
    root: Path,
    setting: str,
    method: str,
    seed: int,
    srs: list[float],
    every: int,
    tokens_per_update: float,
    compute_per_update: float,
    finished: bool = True,
    tail: str = "",
    composition: dict[str, float] | None = None,
) -> Path:
    """A run dir with one update record per update and an eval every ``every`` updates (SR given in percent)."""
    d = root / f"{setting}-{method}-{seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"method: {method}\nsetting: {setting}\nseed: {seed}\nlearner:\n  batch_size: 8\n")
    lines = []
    last = every * (len(srs) - 1)
    for u in range(0, last + 1):
        if u > 0:
            rec = {
                "kind": "update",
                "update": u,
                "time": float(u),
                "learner/tokens_total": tokens_per_update * u,
                "learner/compute_s_total": compute_per_update * u,
                "ledger/expired": 2 * u,
                "ledger/received": 10 * u,
            }
            rec.update({f"sampler/{k}": v for k, v in (composition or {}).items()})
            lines.append(json.dumps(rec))
        if u % every == 0:
            rec = {
                "kind": "eval",
                "update": u,
                "time": float(u),
                "eval/success_rate": srs[u // every] / 100.0,
                "eval/episodes": 20,
                "learner/tokens_total": tokens_per_update * u,
                "learner/compute_s_total": compute_per_update * u,
            }
            lines.append(json.dumps(rec))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)
    if finished:
        (d / "summary.json").write_text("{}")
    return d


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    comp_v = {"effective_rollouts": 3.0, "max_rollout_share": 0.5, "dead_rows": 2.0}
    comp_d = {"effective_rollouts": 6.0, "max_rollout_share": 0.25, "dead_rows": 0.0}
    make_run(root, "s1", "vanilla", 0, [10, 30, 50, 60, 70, 72], 10, 100, 1.0, composition=comp_v)
    make_run(root, "s1", "vanilla", 1, [10, 20, 40, 50, 60, 76], 10, 100, 1.0, composition=comp_v)
    make_run(root, "s1", "divopd", 0, [20, 50, 70, 80, 80, 85], 10, 50, 0.6, composition=comp_d)
    make_run(root, "s1", "divopd", 1, [20, 40, 60, 70, 90, 80], 10, 50, 0.6, composition=comp_d)
    make_run(root, "s2", "vanilla", 0, [0, 10, 20, 30], 5, 100, 1.0)
    make_run(root, "s2", "divopd", 0, [0, 20, 30, 30], 5, 93.75, 0.75)
    make_run(root, "s3", "divopd", 0, [10, 20], 10, 50, 0.5, finished=False, tail='{"kind": "upd')
    return root


def test_numbers_match_hand_computation(runs_root):
    runs = [load_run(p) for p in find_run_dirs([runs_root])]
    assert len(runs) == 7
    rep = build_report(runs)
    s1 = rep["settings"]["s1"]
    assert s1["target"] == 70.0 and s1["budget"] == 50
    assert list(s1["methods"]) == ["vanilla", "divopd"]  # baseline first
    van, div = s1["methods"]["vanilla"], s1["methods"]["divopd"]
    assert van["aggregate"]["peak_sr"]["mean"] == pytest.approx(74.0)
    assert van["aggregate"]["peak_sr"]["std"] == pytest.approx(4.0 / math.sqrt(2))
    assert [s["final_five_mean"] for s in van["seeds"]] == pytest.approx([56.4, 49.2])
    assert van["aggregate"]["final_five_mean"]["mean"] == pytest.approx(52.8)
    assert van["aggregate"]["final_five_mean"]["std"] == pytest.approx(7.2 / math.sqrt(2))
    assert van["seeds"][0]["nauc"] == pytest.approx(50.2)
    assert [s["tokens_to_target"] for s in van["seeds"]] == pytest.approx([4000, 5000])
    assert [s["update_to_target"] for s in div["seeds"]] == [20, 30]
    assert div["aggregate"]["tokens_to_target"]["mean"] == pytest.approx(1250)
    assert div["aggregate"]["compute_s_to_target"]["mean"] == pytest.approx(15)
    assert div["ratios"]["tokens"] == pytest.approx(3.6)
    assert div["ratios"]["compute"] == pytest.approx(3.0)
    assert van["ratios"] == {"tokens": 1.0, "compute": 1.0}
    comp = div["aggregate"]["composition"]
    assert comp["effective_rollouts"] == pytest.approx(6.0) and comp["max_rollout_share"] == pytest.approx(0.25)
    assert comp["expired"] == 100 and comp["expired_fraction"] == pytest.approx(0.2)  # last update 50: 100 / 500
    assert comp["arrival_drain_ratio"] is None  # not recorded

    s2 = rep["settings"]["s2"]
    assert s2["target"] == 30.0 and s2["budget"] == 15
    v2 = s2["methods"]["vanilla"]
    assert v2["aggregate"]["final_five_mean"]["mean"] == pytest.approx(15.0)
    assert v2["aggregate"]["final_five_mean"]["std"] is None  # one seed
    assert v2["aggregate"]["final_five_mean"]["std_checkpoints"] == pytest.approx(math.sqrt(125))
    assert s2["methods"]["divopd"]["ratios"]["tokens"] == pytest.approx(1.6)
    assert s2["methods"]["divopd"]["ratios"]["compute"] == pytest.approx(2.0)

    s3 = rep["settings"]["s3"]
    assert s3["target"] is None and s3["baseline"] is None
    assert s3["methods"]["divopd"]["ratios"] is None
    assert s3["methods"]["divopd"]["seeds"][0]["finished"] is False
    assert any("s3: baseline 'vanilla' has no run" in n for n in rep["notes"])
    assert any("cut-off final line" in n for n in rep["notes"])

    geo = rep["geometric_means"]["divopd"]
    assert geo["tokens"] == {"geomean": pytest.approx(2.4), "n_settings": 2, "of": 3}
    assert geo["compute"]["geomean"] == pytest.approx(math.sqrt(6.0))


def test_trapezoid_and_step_nauc_differ_as_computed(runs_root):
    runs = [load_run(p) for p in find_run_dirs([runs_root / "s2-vanilla-0"])]
    # SR 0 10 20 30 at updates 0 5 10 15; U = 15. trapezoid: 5·(0/2 + 10 + 20 + 30/2)/15 = 15; step: 5·30/15 = 10.
    assert build_report(runs)["settings"]["s2"]["methods"]["vanilla"]["aggregate"]["nauc"]["mean"] == pytest.approx(15)
    step = build_report(runs, rule="step")["settings"]["s2"]["methods"]["vanilla"]["aggregate"]["nauc"]["mean"]
    assert step == pytest.approx(10)


def test_explicit_target_and_budget(runs_root):
    runs = [load_run(p) for p in find_run_dirs([runs_root])]
    rep = build_report(runs, targets={"s1": 85.0}, budget=40)
    s1 = rep["settings"]["s1"]
    assert s1["target"] == 85.0 and s1["target_source"] == "--target"
    # vanilla never reaches 85 -> no ratio for anyone; divopd seeds reach at 50 and 40.
    assert s1["methods"]["divopd"]["ratios"] == {"tokens": None, "compute": None}
    assert s1["methods"]["divopd"]["aggregate"]["reached_target"] == {"n": 2, "of": 2}
    # nAUC over [0, 40] for vanilla seed 0: 10·((10+70)/2 + 30+50+60)/40 = 45
    assert s1["methods"]["vanilla"]["seeds"][0]["nauc"] == pytest.approx(45.0)
    # s2 runs end at 15 < 40: no nAUC, with a note
    assert rep["settings"]["s2"]["methods"]["vanilla"]["seeds"][0]["nauc"] is None
    assert any("do not cover the budget U=40" in n for n in rep["notes"])
    with pytest.raises(ReportError, match="unknown setting"):
        build_report(runs, targets={"nope": 50.0})


def test_cli_writes_markdown_json_and_pngs(runs_root, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", str(runs_root), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "## s1" in md and "3.60×" in md and "3.00×" in md and "τ = 70%" in md
    assert "2.40× (2/3 settings)" in md
    assert "| divopd | 1 |" in md and "–" in md  # s3 row: dash ratios
    rep = json.loads((out / "report.json").read_text())
    assert rep["settings"]["s1"]["methods"]["divopd"]["ratios"]["tokens"] == pytest.approx(3.6)
    # each seed's learning curve, [update, SR percent] at every eval, as written (divopd seed 1 of s1)
    assert rep["settings"]["s1"]["methods"]["divopd"]["seeds"][1]["sr_curve"] == [
        [0, 20.0], [10, 40.0], [20, 60.0], [30, 70.0], [40, 90.0], [50, 80.0]]
    assert rep["settings"]["s3"]["methods"]["divopd"]["seeds"][0]["sr_curve"] == [[0, 10.0], [10, 20.0]]
    for setting in ("s1", "s2", "s3"):
        for stem in ("sr_vs_updates", "sr_vs_tokens", "sr_vs_compute", "composition"):
            png = out / f"{setting}_{stem}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"({png.name})" in md
    assert "report.md" in capsys.readouterr().out


def test_no_baseline_anywhere_omits_ratios(runs_root, tmp_path):
    out = tmp_path / "out"
    assert main(["report", str(runs_root / "s1-divopd-0"), "--out", str(out), "--no-plots", "--target", "70"]) == 0
    rep = json.loads((out / "report.json").read_text())
    div = rep["settings"]["s1"]["methods"]["divopd"]
    assert div["ratios"] is None and div["seeds"][0]["tokens_to_target"] == 1000
    assert any("no 'vanilla' run" in n for n in rep["notes"])
    assert not list(out.glob("*.png"))


def _write_cfg(d: Path, text: str = "method: vanilla\nsetting: s\nseed: 0\n") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(text)
    return d


@pytest.mark.parametrize(
    "body, message",
    [
        (
            '{"kind": "eval", "update": 0, "eval/success_rate": 0.1}\n{not json}\n{}\n',
            r"metrics\.jsonl:2: malformed JSON",
        ),
        ("[1, 2]\n", r"metrics\.jsonl:1: expected a JSON object"),
        ('{"kind": "train", "update": 1}\n', r"metrics\.jsonl:1: 'kind' must be"),
        ('{"kind": "update", "update": -1}\n', r"metrics\.jsonl:1: 'update' must be a non-negative integer"),
        ('{"kind": "eval", "update": 1}\n', r"metrics\.jsonl:1: eval record without"),
        ('{"kind": "eval", "update": 1, "eval/success_rate": 45}\n', r"metrics\.jsonl:1: .* must be in \[0, 1\]"),
        ('{"kind": "update", "update": 1, "learner/tokens_total": "many"}\n', r"metrics\.jsonl:1: .* must be a number"),
    ],
)
def test_malformed_metrics_name_file_and_line(tmp_path, body, message):
    d = _write_cfg(tmp_path / "r")
    (d / "metrics.jsonl").write_text(body)
    with pytest.raises(ReportError, match=message):
        load_run(d)


def test_malformed_config_and_paths(tmp_path, capsys):
    with pytest.raises(ReportError, match=r"config\.yaml: missing top-level key 'seed'"):
        load_run(_write_cfg(tmp_path / "a", "method: vanilla\nsetting: s\n"))
    with pytest.raises(ReportError, match=r"config\.yaml: malformed YAML"):
        load_run(_write_cfg(tmp_path / "b", "method: [unclosed\n"))
    with pytest.raises(ReportError, match=r"config\.yaml: expected a mapping"):
        load_run(_write_cfg(tmp_path / "c", "- just a list\n"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no config.yaml"):
        find_run_dirs([tmp_path / "empty"])
    with pytest.raises(ReportError, match="not a directory"):
        find_run_dirs([tmp_path / "missing"])
    assert main(["report", str(tmp_path / "a"), "--out", str(tmp_path / "o")]) == 2
    assert "config.yaml: missing top-level key 'seed'" in capsys.readouterr().err


def test_duplicate_seed_is_an_error(tmp_path):
    a = _write_cfg(tmp_path / "a")
    b = _write_cfg(tmp_path / "b")
    with pytest.raises(ReportError, match=r"seed\(s\) \['0'\] twice"):
        build_report([load_run(a), load_run(b)])


def test_run_without_metrics_or_evals(tmp_path):
    a = _write_cfg(tmp_path / "a")  # just started: no metrics.jsonl
    b = _write_cfg(tmp_path / "b", "method: divopd\nsetting: s\nseed: 0\n")
    (b / "metrics.jsonl").write_text('{"kind": "update", "update": 1, "learner/tokens_total": 10}\n')
    rep = write_report([load_run(a), load_run(b)], tmp_path / "out")
    s = rep["settings"]["s"]
    assert s["target"] is None and s["budget"] is None
    assert s["methods"]["divopd"]["seeds"][0]["peak_sr"] is None
    assert any("no metrics.jsonl yet" in n for n in rep["notes"])
    assert any("no evaluation yet" in n for n in rep["notes"])
    assert (tmp_path / "out" / "s_sr_vs_updates.png").is_file()


def test_eval_without_cumulative_fields_uses_latest_update_record(tmp_path):
    d = _write_cfg(tmp_path / "r")
    lines = [
        {"kind": "update", "update": 1, "learner/tokens_total": 100, "learner/compute_s_total": 2.0},
        {"kind": "update", "update": 2, "learner/tokens_total": 250, "learner/compute_s_total": 5.0},
        {"kind": "eval", "update": 2, "eval/success_rate": 0.5},
        {"kind": "eval", "update": 2, "eval/success_rate": 0.6},
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = load_run(d)
    assert len(run.evals) == 1 and run.evals[0].sr == pytest.approx(60.0)
    assert (run.evals[0].tokens, run.evals[0].compute_s) == (250.0, 5.0)
    assert any("second eval at update 2" in n for n in run.notes)


def test_partial_reach_uses_reaching_seeds_and_says_so(runs_root):
    runs = [load_run(p) for p in find_run_dirs([runs_root / "s1-vanilla-0", runs_root / "s1-vanilla-1"])]
    runs += [load_run(runs_root / "s1-divopd-0"), load_run(runs_root / "s1-divopd-1")]
    rep = build_report(runs, target_all=75.0)
    s1 = rep["settings"]["s1"]
    # vanilla: seed 0 peaks at 72 (never), seed 1 reaches 75 at update 50 -> 5000 tokens, 50 s.
    # divopd: 80 at update 30 (1500 tokens, 18 s) and 90 at update 40 (2000 tokens, 24 s) -> 1750, 21.
    assert s1["methods"]["vanilla"]["aggregate"]["reached_target"] == {"n": 1, "of": 2}
    assert s1["methods"]["divopd"]["ratios"]["tokens"] == pytest.approx(5000 / 1750)
    assert s1["methods"]["divopd"]["ratios"]["compute"] == pytest.approx(50 / 21)
    assert any("s1/vanilla: reached τ=75 in 1 of 2 seeds" in n for n in rep["notes"])


def test_budget_comes_from_finished_runs_and_seeds_sort_numerically(tmp_path):
    """U is the smallest last evaluation of the *finished* runs: a run still in progress (evals at 0 and 10) neither
    shrinks the finished runs' span to [0, 10] nor gets a nAUC of its own until it reaches U; a note names it. With no
    finished run at all, U is the smallest last evaluation of the runs so far, and a note says so."""
    root = tmp_path / "runs"
    make_run(root, "s", "vanilla", 10, [10, 20, 30], 10, 100, 1.0)
    make_run(root, "s", "vanilla", 2, [10, 20], 10, 100, 1.0, finished=False)
    rep = build_report([load_run(p) for p in find_run_dirs([root])])
    s = rep["settings"]["s"]
    assert s["budget"] == 20
    seeds = s["methods"]["vanilla"]["seeds"]
    assert [sd["seed"] for sd in seeds] == [2, 10]
    assert seeds[0]["nauc"] is None and seeds[1]["nauc"] == pytest.approx(20.0)  # mean of 10 -> 20 -> 30 over [0, 20]
    assert any("U=20 (finished runs)" in n and "s-vanilla-2" in n for n in rep["notes"])
    assert any("seed(s) [2] do not cover the budget U=20" in n for n in rep["notes"])

    only_running = tmp_path / "running"
    make_run(only_running, "s", "vanilla", 0, [10, 20, 30], 10, 100, 1.0, finished=False)
    make_run(only_running, "s", "vanilla", 1, [10, 20], 10, 100, 1.0, finished=False)
    rep = build_report([load_run(p) for p in find_run_dirs([only_running])])
    assert rep["settings"]["s"]["budget"] == 10
    assert any("no run has finished; U=10" in n for n in rep["notes"])


def test_settings_are_ordered_with_numbers_as_numbers(tmp_path):
    for n in (16, 4, 8):
        make_run(tmp_path, f"load-num_envs{n}", "vanilla", 0, [0, 10], 10, 100, 1.0)
    rep = build_report([load_run(d) for d in sorted(tmp_path.iterdir())])
    assert list(rep["settings"]) == ["load-num_envs4", "load-num_envs8", "load-num_envs16"]


def test_one_seed_per_method_is_said_to_decide_nothing(tmp_path, capsys):
    """A geometric-mean speedup from one seed of each method carries the note that n = 1 decides nothing; a setting
    with runs of one method only (two seeds of it) is said to compare nothing, not reported as a comparison."""
    root = tmp_path / "runs"
    make_run(root, "one", "vanilla", 0, [10, 30, 50, 70], 10, 100, 1.0)
    make_run(root, "one", "divopd", 0, [10, 50, 70, 80], 10, 50, 0.6)
    make_run(root, "same", "divopd", 0, [10, 30, 50], 10, 100, 1.0)
    make_run(root, "same", "divopd", 1, [10, 40, 60], 10, 100, 1.0)
    out = tmp_path / "out"
    assert main(["report", str(root), "--out", str(out), "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert "(1/2 settings) from n = 1 seed: decides nothing" in md
    assert "one: n = 1 seed for vanilla, divopd: one seed decides nothing" in md
    assert "same: only method divopd (2 run(s)): nothing is compared" in md
    printed = capsys.readouterr().out
    assert "note: one: n = 1 seed" in printed and "note: same: only method divopd" in printed
