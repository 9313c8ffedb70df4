"""``make demo`` is a piece of the study: the coin6-dart page quotes the demo's config verbatim, and the demo's runs are
the study's runs of that group (study/regime/plan-coin6-dart.yaml), so the page's seed-0 numbers are the demo's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from study_helpers import CONFIGS, REGIME, RESULTS

from divopd.suite import demo

DOC = RESULTS / "coin6-dart.md"


def _doc_config() -> str:
    """The first YAML block of study/results/coin6-dart.md after "The demo's config, `.../coin6-dart.yaml`"
    (the page quotes the demo's config)."""
    text = DOC.read_text()
    m = re.search(r"The demo's config, `[^`]*coin6-dart[^`]*\.yaml`.*?```yaml\n(.*?)```", text, re.S)
    assert m, "study/results/coin6-dart.md must quote the packaged setting coin6-dart in a ```yaml block"
    return m.group(1)


def test_the_docs_quote_the_demo_config() -> None:
    """Every key the page quotes has the packaged setting's value (the setting file also holds `method` and the
    settings of the features other method rows switch on)."""
    doc, mine = yaml.safe_load(_doc_config()), yaml.safe_load((CONFIGS / "coin6-dart.yaml").read_text())

    def same(a: dict, b: dict, where: str = "") -> None:
        for key, value in a.items():
            if isinstance(value, dict):
                same(value, b[key], f"{where}{key}.")
            else:
                assert b.get(key) == value, f"{where}{key}"

    same(doc, mine)


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
