"""``divopd bench paper`` / ``make paper``: the runner of the paper benchmark suite (issue 8) on the demo's CPU setting.

The suite is a declarative plan (``benchmarks/paper/plan.yaml``, schema :class:`Plan`): settings (each = the packaged
setting ``tiny``, or the plan's ``configs``, with the run's ``method``, plus the setting's overrides), method entries (a
config ``method`` with an optional distinct ``label`` and overrides, e.g. DivOPD with ``sampler.cap_unit: tokens`` as
``divopd-tokens``), seeds,
and two sweeps: producer load (one key, three values, e.g. vanilla vs divopd-base at three ``explorer.num_envs``) and
the cap k of one method. :func:`plan_runs` expands the plan into runs; each run has a report *group* and a *label*:

- main runs: group = the setting, label = the method entry's label;
- load sweep: group = ``<setting>-load-<key leaf><value>`` (one group per load, so each is its own Table-2 row),
  label = the method;
- cap sweep: group = ``<setting>-cap``, label = ``<method>-k<k>``.

A run's directory is ``<out>/<group>/<label>/seed<seed>``. ``divopd report`` groups runs by the config's ``setting``
and ``method``, so when a label differs from its config method (``divopd-tokens``, ``divopd-k3``), the run's config
``setting`` is written as ``<group>~<label>``: a plain ``divopd report`` over the folder then shows it as its own
setting instead of silently merging it with the method it is built on, and ``divopd bench paper --report`` relabels
it (setting = group, method = label) so that it sits in its group's table beside the baseline.

A sweep point whose value is the one its main run already has (the tiny config's ``explorer.num_envs: 8``, DivOPD's
``sampler.cap: 4``) is not trained again: its planned run points at the main run (``PlannedRun.main``) and its group's
report reads that run. A sweep may run fewer seeds than the main runs (``seeds`` in the sweep; default: the plan's).

Rules (:func:`run_state`): a run with ``summary.json`` is finished and skipped; one with ``config.yaml`` but no summary
is resumed (``train(resume=run_dir)``); any other is started.

The code: :mod:`divopd.suite.plan` (the plan and its runs), :mod:`divopd.suite.runs` (skipping, resuming, training),
:mod:`divopd.suite.report` (the reports) and :mod:`divopd.commands.bench` (the command line); every name is
importable from here.
"""

from __future__ import annotations

from divopd.commands.bench import add_arguments, run
from divopd.suite.plan import COMBINED_REPORTS as COMBINED_REPORTS
from divopd.suite.plan import CONFIGS as CONFIGS
from divopd.suite.plan import DEFAULT_PLAN as DEFAULT_PLAN
from divopd.suite.plan import CapSweep as CapSweep
from divopd.suite.plan import LoadSweep as LoadSweep
from divopd.suite.plan import Plan, PlanError, PlannedRun, load_plan, plan_runs, select_runs
from divopd.suite.plan import PlanMethod as PlanMethod
from divopd.suite.plan import PlanSetting as PlanSetting
from divopd.suite.plan import Sweeps as Sweeps
from divopd.suite.plan import config_value as config_value
from divopd.suite.report import _group_runs as _group_runs
from divopd.suite.report import coverage_section as coverage_section
from divopd.suite.report import measured_best_cap as measured_best_cap
from divopd.suite.report import tune_cap_section as tune_cap_section
from divopd.suite.report import write_reports as write_reports
from divopd.suite.runs import dry_run_text as dry_run_text
from divopd.suite.runs import run_config as run_config
from divopd.suite.runs import run_state
from divopd.suite.runs import train_runs as train_runs

__all__ = ["Plan", "PlannedRun", "PlanError", "add_arguments", "load_plan", "plan_runs", "run", "run_state",
           "select_runs"]
