"""``make demo`` is a piece of the study: the coin6-dart page quotes the demo's config verbatim, and the demo's runs are
the study's runs of that group (study/regime/plan-coin6-dart.yaml), so the page's seed-0 numbers are the demo's."""

from __future__ import annotations

import re
from pathlib import Path

from study_helpers import CONFIGS, REGIME, RESULTS

from divopd.suite import demo

DOC = RESULTS / "coin6-dart.md"


def _doc_config() -> str:
    """The first YAML block of study/results/coin6-dart.md after "The demo's config, `configs/coin6-dart/_base.yaml`"
    (the page quotes the demo's config)."""
    text = DOC.read_text()
    m = re.search(r"The demo's config, `configs/coin6-dart/_base\.yaml`.*?```yaml\n(.*?)```", text, re.S)
    assert m, "study/results/coin6-dart.md must quote configs/coin6-dart/_base.yaml in a ```yaml block"
    return m.group(1)


def test_the_docs_quote_the_demo_config_verbatim() -> None:
    assert _doc_config() == (CONFIGS / "coin6-dart" / "_base.yaml").read_text()


def test_the_demo_runs_are_the_coin6_dart_study_runs() -> None:
    """make demo's runs are the study's runs of that group (study/regime/plan-coin6-dart.yaml), paths aside:
    same config value for value, so the demo's numbers are those of the study's seed."""
    from divopd.suite.plan import load_plan, plan_runs
    from divopd.suite.runs import run_config

    plan = load_plan(REGIME / "plan-coin6-dart.yaml")
    models = {"student": Path("cache/coin6-dart/student"), "teacher": Path("cache/coin6-dart/teacher")}
    paths = {"run_dir": None, "out_dir": None}
    for method in ("vanilla", "divopd"):
        planned = next(r for r in plan_runs(plan) if r.group == demo.SETTING and r.method == method and r.seed == 0)
        study = run_config(planned, plan, Path("runs/x"), models).model_dump() | paths
        mine = demo.demo_config(demo.CONFIGS, method, 0, Path("runs/demo"), models, None).model_dump() | paths
        assert mine == study
