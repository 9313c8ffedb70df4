"""The results page (docs/results.md) holds the study's twelve-setting table itself, as study/regime/headline.py
prints it from the committed reports (without the links to the study's pages, which are not part of the site), and
every command of its "Reproducing it" block runs from the repository: the plans it names exist and load, the
replication's with the seeds the verdict says."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

from divopd.suite.plan import load_plan, plan_runs

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "results.md"
TABLE = re.compile(r"<!-- headline table[^>]*-->\n(.*?)\n<!-- /headline table -->", re.S)


def headline():
    spec = importlib.util.spec_from_file_location("headline", REPO / "study" / "regime" / "headline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_twelve_setting_table_is_the_study_scripts_output() -> None:
    printed = headline().table(REPO / "study" / "results" / "regime", "")
    unlinked = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", printed)
    (table,) = TABLE.findall(PAGE.read_text())
    assert table == unlinked and len(table.splitlines()) == 2 + 12


def test_the_reproducing_commands_name_plans_that_load_with_the_seeds_the_page_gives() -> None:
    block = PAGE.read_text().split("## Reproducing it", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    plans = {shlex.split(line)[shlex.split(line).index("--plan") + 1]
             for line in block.splitlines() if "--plan" in line}
    assert "study/regime/plan-coin7-dart-replication.yaml" in plans
    for plan in plans:
        runs = plan_runs(load_plan(REPO / plan))
        assert runs, plan
    replication = plan_runs(load_plan(REPO / "study/regime/plan-coin7-dart-replication.yaml"))
    assert {r.seed for r in replication} == set(range(10, 20))
    assert {r.label for r in replication} == {"vanilla", "divopd"}
    assert "seeds 10-19" in block and "on 10 further seeds" in PAGE.read_text()
