"""The warm-start study's analysis scripts (study/regime/*.py: actions, coin_turns, sweep_tables, pool_regime,
pair_reports, curves, headline) on exact small cases, and the study's pages and the product's verdict pinned to what
those scripts print from the committed reports (study/results/)."""

from __future__ import annotations

import json
import re

import pytest
from study_helpers import REGIME, REPO, RESULTS, block, script


def test_the_actions_benchmark_counts_invalid_actions_and_what_follows_them(tmp_path) -> None:
    """study/regime/actions.py on a two-rollout log: exact shares."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from divopd.models.tiny import build_tokenizer

    actions = script("actions")
    assert actions.valid_actions("x\nValid actions: look around, move east<eos><|assistant|>") == {
        "look around", "move east"}
    tok = build_tokenizer(["Valid actions: look around, move east, take coin", "Unknown action", "take coin",
                           "move east"])
    menu = "Valid actions: look around, move east"
    turns = [("a", 0, menu, "take coin"), ("a", 1, "Unknown action\n" + menu, "take coin"),
             ("a", 2, "Unknown action\n" + menu, "move east"), ("b", 0, menu + ", take coin", "take coin")]
    log = tmp_path / "experience"
    log.mkdir()
    pq.write_table(pa.table({
        "rollout_id": [t[0] for t in turns], "arrival_update": [1] * len(turns), "turn_index": [t[1] for t in turns],
        "prompt_ids": [tok.encode(t[2]) for t in turns], "response_ids": [tok.encode(t[3]) for t in turns]}),
        log / "part-000000.parquet")
    invalid, top, top_share, after = actions.run_shares(log, tok, last=20)
    assert (invalid, top, top_share, after) == (0.5, "take coin", 0.5, 0.5)


def test_the_coin_turns_benchmark_replays_each_run_under_its_rule(tmp_path, monkeypatch, capsys) -> None:
    """study/regime/coin_turns.py on a two-rollout log that one vanilla batch takes whole: exact shares of the
    turns with the coin in view and of those the student walked past."""
    from divopd.experience import Turn
    from divopd.experience.log import write_log
    from divopd.models.tiny import build_tokenizer
    from divopd.sampling import SamplerConfig

    monkeypatch.syspath_prepend(str(REGIME))  # the script imports its neighbour actions.py
    coin_turns = script("coin_turns")
    tok = build_tokenizer(["Valid actions: move east, take coin", "take coin", "move east"])
    menu, coin = "Valid actions: move east", "Valid actions: move east, take coin"
    rows = [("a", 0, menu, "move east"), ("a", 1, coin, "move east"), ("a", 2, coin, "take coin"),
            ("b", 0, coin, "take coin")]
    turns = []
    for rid, index, prompt, action in rows:
        ids = tok.encode(action)
        turns.append(Turn(rollout_id=rid, turn_index=index, policy_version=0, prompt_ids=tok.encode(prompt),
                          response_ids=ids, student_logprobs=[-1.0] * len(ids), teacher_logprobs=[-2.0] * len(ids)))
    log = tmp_path / "experience.parquet"
    write_log(log, turns, write_ids=True)
    config = SamplerConfig("vanilla", batch_size=4, pool_factor=1, cap=4, max_staleness=2)
    assert coin_turns.coin_shares(log, config, tok) == (0.75, 0.75, 1 / 3, 1 / 3)
    config = SamplerConfig("vanilla", batch_size=8, pool_factor=1, cap=4, max_staleness=2)
    assert coin_turns.coin_shares(log, config, tok)[1] == 0.0  # too few turns for a batch: none trained
    # bad input: one line and exit 2 (a group folder that is not there, a tokenizer that is not there)
    for argv, start in (([str(tmp_path / "none"), "--tokenizer", "x"], "coin_turns: "),
                        ([str(tmp_path), "--tokenizer", str(tmp_path / "none")], "coin_turns: --tokenizer ")):
        monkeypatch.setattr("sys.argv", ["coin_turns.py", *argv])
        with pytest.raises(SystemExit) as exit_info:
            coin_turns.main()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith(start) and err.count("\n") == 1


def test_the_sweep_tables_script_prints_the_coin6_page_tables_from_the_committed_reports(capsys, monkeypatch) -> None:
    """study/regime/sweep_tables.py over plan-coin6.yaml and the committed reports (study/results/regime): its
    Table 2 rows are the coin6 page's, value for value (the page's table was assembled by hand before the script), and
    its Table 19 has one row per k with the paper's k = 4 as the reference of the paired column."""
    sweep_tables = script("sweep_tables")
    monkeypatch.setattr("sys.argv", ["sweep_tables.py", str(REGIME / "plan-coin6.yaml"), "--report",
                                     str(RESULTS / "regime")])
    sweep_tables.main()
    load, cap = capsys.readouterr().out.strip().split("\n\n")
    page = (RESULTS / "coin6.md").read_text()
    rows = load.splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| 26", "| 48", "| 64 (main runs)", "| 80"]
    assert all(row in page for row in rows)
    caps = cap.splitlines()[2:]
    assert [r.split(" | ")[0] for r in caps] == ["| 2", "| 3", "| 4 (the paper's)", "| 6"]
    assert caps[2].endswith("| – |") and all(r.endswith("p = 0.62 |") for r in caps[:2] + caps[3:])
    # a report folder without the groups: one line on stderr and exit 2, no traceback
    monkeypatch.setattr("sys.argv", ["sweep_tables.py", str(REGIME / "plan-coin6.yaml"), "--report",
                                     str(RESULTS / "no-such-report")])
    with pytest.raises(SystemExit) as exit_info:
        sweep_tables.main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("sweep_tables: FileNotFoundError") and err.count("\n") == 1


def test_the_pool_regime_script_measures_runs_after_update_5(tmp_path, capsys) -> None:
    """study/regime/pool_regime.py --measure: per-update means after the first 5 updates, averaged over the runs
    of a method (the run folder's parent); turns per candidate rollout is the ratio of the two means."""
    pool_regime = script("pool_regime")
    runs = []
    for seed, rollouts in ((0, 10.0), (1, 30.0)):
        run_dir = tmp_path / "divopd" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(f"setting: s\nmethod: divopd\nseed: {seed}\n")
        ups = [{"kind": "update", "update": u, "sampler/candidates": 100.0 * (u > 5) + 1.0,
                "sampler/candidate_rollouts": rollouts * (u > 5) + 1.0, "sampler/effective_rollouts": 8.0,
                "sampler/max_rollout_share": 0.25, "sampler/mean_staleness": 2.0 + seed,
                "queue/arrival_drain_ratio": 2.0, "ledger/expired": 10.0 * u, "ledger/received": 100.0 * u}
               for u in range(1, 9)]
        evals = [{"kind": "eval", "update": u, "eval/success_rate": 0.5} for u in (0, 8)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ups + evals))
        (run_dir / "summary.json").write_text("{}")
        runs.append(run_dir)
    pool_regime.print_measured(runs)
    row = capsys.readouterr().out.splitlines()[2]
    # after update 5: candidates 101, rollouts 11 and 31 (mean 21), age 2 and 3, expired 10%
    assert row == "| divopd | 2 | 21.0 | 8.00 | 0.25 | 2.00 | 10% | 101 | 4.8 | 2.50 |"


def test_the_pair_reports_script_pairs_two_groups_seed_by_seed(tmp_path, monkeypatch, capsys) -> None:
    """study/regime/pair_reports.py: only the seeds both groups finished are paired; exact means and count of
    seeds ahead; a missing file or group is one line and exit 2."""
    pair_reports = script("pair_reports")

    def report(group: str, runs: dict[str, list[tuple[int, float, bool]]]) -> dict:
        return {"settings": {group: {"methods": {m: {"seeds": [
            {"seed": s, "finished": done, "peak_sr": v + 5, "final_five_mean": v + 1, "nauc": v} for s, v, done in rs]}
            for m, rs in runs.items()}}}}

    a = report("x", {"vanilla": [(0, 50.0, True), (1, 40.0, True), (2, 30.0, True), (3, 99.0, False)],
                     "divopd": [(0, 10.0, True)]})
    b = report("y", {"vanilla": [(0, 45.0, True), (1, 42.0, True), (3, 20.0, True), (4, 1.0, True)]})
    rows = pair_reports.pair_rows(pair_reports.finished_seeds(a, "x"), pair_reports.finished_seeds(b, "y"))
    assert len(rows) == 1 and rows[0]["seeds"] == [0, 1] and rows[0]["ahead"] == 1
    assert rows[0]["nauc"] == (45.0, 43.5) and rows[0]["peak_sr"] == (50.0, 48.5)
    # --against: every other method of a paired with one method (here a's own vanilla: seed 0 only for divopd)
    within = pair_reports.finished_seeds(a, "x")
    (row,) = pair_reports.pair_rows(within, within, against="vanilla")
    assert (row["method"], row["seeds"], row["nauc"], row["ahead"]) == ("divopd", [0], (10.0, 50.0), 0)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    monkeypatch.setattr("sys.argv", ["pair_reports.py", str(tmp_path / "a.json"), "x", str(tmp_path / "b.json"), "y"])
    pair_reports.main()
    assert "| vanilla | 2 | 50.0 / 48.5 | 46.0 / 44.5 | 45.0 / 43.5 | 1 of 2 | 1.000 |" in capsys.readouterr().out
    for argv in ([str(tmp_path / "none.json"), "x", str(tmp_path / "b.json"), "y"],
                 [str(tmp_path / "a.json"), "zz", str(tmp_path / "b.json"), "y"],
                 [str(tmp_path / "a.json"), "x", str(tmp_path / "b.json"), "y", "--against", "divopd"]):
        monkeypatch.setattr("sys.argv", ["pair_reports.py", *argv])
        with pytest.raises(SystemExit) as exit_info:
            pair_reports.main()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("pair_reports: ") and err.count("\n") == 1


@pytest.mark.parametrize(("plan", "page", "marker", "caps"), [
    ("plan-coin7-dart.yaml", "coin7-dart.md", "coin7-dart", ["| 2", "| 3", "| 4 (the paper's)", "| 6"]),
    ("plan-coin6-dart-pool.yaml", "pool-regime.md", "coin6-dart-pool", ["| 2", "| 4 (the paper's)", "| 6"]),
    ("plan-coin7-dart-pool.yaml", "pool-regime.md", "coin7-dart-pool", ["| 2", "| 4 (the paper's)", "| 6"]),
])
def test_the_pages_sweep_tables_are_the_script_output(capsys, monkeypatch, plan: str, page: str, marker: str,
                                                       caps: list[str]) -> None:
    """The results pages' Table 2 and Table 19 (study/results/coin7-dart.md over plan-coin7-dart.yaml,
    study/results/pool-regime.md over plan-coin6-dart-pool.yaml and plan-coin7-dart-pool.yaml) are what
    sweep_tables.py prints from the committed reports (study/results/regime), line for line, between the page's table
    markers."""
    sweep_tables = script("sweep_tables")
    monkeypatch.setattr("sys.argv", ["sweep_tables.py", str(REGIME / plan), "--report", str(RESULTS / "regime")])
    sweep_tables.main()
    tables = dict(zip(("load", "cap"), capsys.readouterr().out.strip().split("\n\n"), strict=True))
    text = (RESULTS / page).read_text()
    for name, table in tables.items():
        assert block(text, f"{marker} {name} table") == table
    assert [r.split(" | ")[0] for r in tables["load"].splitlines()[2:]] == ["| 26", "| 48", "| 64 (main runs)", "| 80"]
    assert [r.split(" | ")[0] for r in tables["cap"].splitlines()[2:]] == caps


def test_the_early_dip_is_the_first_sr_minus_the_lowest_in_the_window() -> None:
    """curves.py --dip: the lowest SR evaluated in updates 1..U and the first SR minus it, exactly."""
    early_dip = script("curves").early_dip
    assert early_dip({0: 38.0, 5: 22.0, 10: 9.0, 15: 23.0}, 10) == (9.0, 29.0)
    assert early_dip({0: 38.0, 5: 22.0, 10: 9.0, 15: 5.0}, 5) == (22.0, 16.0)  # update 15 is outside the window
    assert early_dip({0: 30.0, 5: 40.0, 10: 45.0}, 10) == (40.0, -10.0)  # a run that only rises
    assert early_dip({0: 30.0, 20: 10.0}, 10) == (30.0, 0.0)  # no evaluation inside the window


def test_curves_reads_the_sr_curves_of_a_report_json(tmp_path, capsys, monkeypatch) -> None:
    """curves.py on a report.json: the per-seed ``sr_curve`` give the same dip table as the run folders would; a
    report without them, or an unknown setting, is one line and exit code 2."""
    curves = script("curves")
    seeds = [{"seed": 0, "sr_curve": [[0, 38.0], [5, 22.0], [10, 9.0], [40, 50.0]]},
             {"seed": 1, "sr_curve": [[0, 30.0], [5, 40.0], [10, 45.0], [40, 55.0]]}]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"settings": {"g": {"methods": {"vanilla": {"seeds": seeds}}}}}))
    assert curves.report_curves(report, None) == {"vanilla": {0: {0: 38.0, 5: 22.0, 10: 9.0, 40: 50.0},
                                                              1: {0: 30.0, 5: 40.0, 10: 45.0, 40: 55.0}}}
    assert curves.report_curves(report, "g", seeds={1}) == {"vanilla": {1: {0: 30.0, 5: 40.0, 10: 45.0, 40: 55.0}}}
    monkeypatch.setattr("sys.argv", ["curves.py", str(report), "--dip", "10"])
    curves.main()
    # first SR (38 + 30) / 2, lowest in updates 1-10 (9 + 40) / 2, drop (29 - 10) / 2 (seed 1 only rises)
    assert capsys.readouterr().out.splitlines()[-1] == "| vanilla | 2 | 34.0 | 24.5 | 9.5 | 1 of 2 (seed 0) |"
    monkeypatch.setattr("sys.argv", ["curves.py", str(report), "--setting", "nope"])
    with pytest.raises(SystemExit) as e:
        curves.main()
    assert e.value.code == 2 and "no setting 'nope'" in capsys.readouterr().err
    del seeds[0]["sr_curve"]
    report.write_text(json.dumps({"settings": {"g": {"methods": {"vanilla": {"seeds": seeds}}}}}))
    monkeypatch.setattr("sys.argv", ["curves.py", str(report)])
    with pytest.raises(SystemExit) as e:
        curves.main()
    assert e.value.code == 2 and "no sr_curve" in capsys.readouterr().err


def test_the_headline_table_is_the_script_output() -> None:
    """The study index's headline table is what headline.py prints from the committed reports, line for line; its
    links resolve from the page."""
    table = script("headline").table(RESULTS / "regime", "")
    path = RESULTS / "index.md"
    assert block(path.read_text(), "headline table") == table and len(table.splitlines()) == 2 + 12
    assert all((path.parent / link).is_file() for link in re.findall(r"\]\(([^)]+)\)", table))


@pytest.mark.parametrize("page", ["README.md", "docs/results.md"])
def test_the_product_verdict_quotes_the_one_setting_where_divopd_beat_vanilla(page: str) -> None:
    """The README's and the product results page's verdict: coin7-dart's DivOPD vs vanilla cell, as headline.py reads
    it from the committed report, and the replication's numbers (10 further seeds, runs kept outside the repository)."""
    data = json.loads((RESULTS / "regime" / "coin7-dart" / "report.json").read_text())["settings"]["coin7-dart"]
    cell = script("headline").contrast(data["paired_tests"], "divopd", "vanilla")
    assert cell == "**48.7 vs 44.7, p = 0.025**"
    text = " ".join((REPO / page).read_text().split())
    assert "48.7 vs 44.7" in text and "p = 0.025" in text
    for replication in ("46.2 vs 44.8", "p = 0.90", "54.1 vs 55.0", "2 vs 5 seeds"):
        assert replication in text, (page, replication)


def test_the_headline_cells_mark_the_direction_and_the_ties() -> None:
    """headline.contrast: bold only for p < 0.05 the paper's way, "(reverse)" the other way, "equal" when every pair
    ties, "–" when the contrast was not run."""
    contrast = script("headline").contrast
    test = {"metric": "nauc", "method": "divopd", "against": "vanilla", "n": 10}
    assert contrast([{**test, "mean_method": 48.69, "mean_against": 44.7, "p_value": 0.0254}],
                    "divopd", "vanilla") == "**48.7 vs 44.7, p = 0.025**"
    assert contrast([{**test, "mean_method": 44.7, "mean_against": 48.69, "p_value": 0.0254}],
                    "divopd", "vanilla") == "44.7 vs 48.7, p = 0.025 (reverse)"
    assert contrast([{**test, "mean_method": 44.7, "mean_against": 48.69, "p_value": 0.43}],
                    "divopd", "vanilla") == "44.7 vs 48.7, p = 0.43"
    assert contrast([{**test, "n": 0, "mean_method": 1.0, "mean_against": 1.0, "p_value": None}],
                    "divopd", "vanilla") == "equal"
    assert contrast([{**test, "metric": "tokens_to_target", "p_value": 0.01}], "divopd", "vanilla") == "–"


def test_the_early_collapse_table_is_what_the_committed_curves_give() -> None:
    """study/results/pool-regime.md's early-collapse table: each cell is curves.collapses over the seeds 0-4 curves
    (``sr_curve``) of the committed reports (coin7-dart-dip for (4, 2) and (16, 8), coin7-dart-stale for (4, 8))."""
    curves = script("curves")
    dip = block((RESULTS / "pool-regime.md").read_text(), "coin7-dart dip table")
    sources = {"(4, 2)": ("coin7-dart-dip", "coin7-dart"), "(4, 8)": ("coin7-dart-stale", None),
               "(16, 8)": ("coin7-dart-dip", "coin7-dart-pool")}
    rows = [line.strip("| ").split(" | ") for line in dip.splitlines()[2:]]
    assert [r[0] for r in rows] == list(sources)
    checked = 0
    for cd, *cells in rows:
        report, setting = sources[cd]
        table = curves.report_curves(RESULTS / "regime" / report / "report.json", setting, seeds=set(range(5)))
        for method, cell in zip(("vanilla", "divopd", "divopd-base"), cells, strict=True):
            if method in table:
                assert cell.strip("*") == curves.collapses(table[method], 10), (cd, method)
                checked += 1
    assert checked == 8  # every cell but vanilla at (4, 8): vanilla reads no pool, so c does not change it
