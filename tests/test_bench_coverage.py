"""Replay coverage of a suite run on its own experience log: the hand-built log of test_replay (known answer)."""

from __future__ import annotations

import pytest

from divopd.experience.log import write_log
from divopd.suite.coverage import PAPER_RULES, coverage_markdown, run_coverage
from divopd.suite.plan import CONFIGS
from divopd.train.config import dump_config, load_config
from test_replay import EXPECTED, HAND_CONFIG, HAND_LOG

KEYS = ("valid_rollouts", "unused_fraction", "effective_rollouts_mean", "max_rollout_share_mean")


def fake_run(run_dir, method: str, log: bool = True, extra: tuple[str, ...] = ()):
    run_dir.mkdir(parents=True)
    c = HAND_CONFIG
    cfg = load_config(CONFIGS, [f"method={method}",
        f"sampler.batch_size={c['batch_size']}", f"sampler.pool_factor={c['pool_factor']}", f"sampler.cap={c['cap']}",
        f"sampler.max_staleness={c['max_staleness']}", f"updates={c['updates']}", f"seed={c['seed']}", *extra])
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    if log:
        write_log(run_dir / "experience", [(t, i, u) for i, (t, u) in enumerate(HAND_LOG)])
    return run_dir


def test_own_rule_and_shared_buffers_match_the_hand_worked_replay(tmp_path) -> None:
    cov = run_coverage(fake_run(tmp_path / "r", "divopd-r"))  # +R trains with DivOPD's selection rule
    assert cov is not None and cov["rule"] == "divopd" and cov["cap_unit"] == "turns"
    assert cov["own"] == pytest.approx({k: EXPECTED["divopd"][k] for k in KEYS})
    assert set(cov["shared"]) == set(PAPER_RULES)
    assert cov["shared"]["vanilla"] == pytest.approx({k: EXPECTED["vanilla"][k] for k in KEYS})
    assert cov["shared"]["divopd"] == cov["own"]
    assert run_coverage(fake_run(tmp_path / "nolog", "vanilla", log=False)) is None


def test_a_token_cap_run_gets_its_own_replay_and_the_shared_table_stays_in_turns(tmp_path) -> None:
    from divopd.analysis.replay import ReplayConfig, replay

    run_dir = fake_run(tmp_path / "t", "divopd", extra=('sampler.cap_unit="tokens"',))
    cov = run_coverage(run_dir)
    assert cov["rule"] == "divopd" and cov["cap_unit"] == "tokens"
    tokens = replay(run_dir / "experience", ReplayConfig(methods=("divopd",), cap_unit="tokens", **HAND_CONFIG))
    assert cov["own"] == {k: tokens["methods"]["divopd"][k] for k in KEYS}
    assert cov["shared"]["divopd"] == pytest.approx({k: EXPECTED["divopd"][k] for k in KEYS})


def test_markdown_tables_aggregate_over_seeds_and_logs(tmp_path) -> None:
    div = run_coverage(fake_run(tmp_path / "d", "divopd"))
    van = run_coverage(fake_run(tmp_path / "v", "vanilla"))
    text = "\n".join(coverage_markdown({"vanilla": [van, None], "divopd": [div, div], "empty": [None]}))
    assert "| vanilla (vanilla) | 1 | 6 | 20.0% | 1.45 | 79.2% |" in text  # unused 1/5; eff (1+1.8+1+2)/4
    assert "| divopd (divopd) | 2 | 6 ± 0 | 0.0 ± 0.0% | 1.70 ± 0.00 | 66.7 ± 0.0% |" in text
    assert "empty" not in text and "each of the 3 logs" in text
    assert coverage_markdown({"x": [None]}) == ["No run of this group has an experience log yet."]


def test_the_runs_own_w_and_group_order_are_replayed(tmp_path, monkeypatch) -> None:
    import divopd.analysis.replay as replay_module

    seen = []
    real = replay_module.replay

    def spy(log, config):
        seen.append(config)
        return real(log, config)

    monkeypatch.setattr(replay_module, "replay", spy)
    run_coverage(fake_run(tmp_path / "w", "divopd-base", extra=("sampler.max_pending_age=0",
                                                                "sampler.group_order=first-seen")))
    assert seen and all(c.max_pending_age == 0 and c.group_order == "first-seen" for c in seen)
