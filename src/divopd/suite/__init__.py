"""``divopd bench paper`` / ``make paper``: the runner of the paper benchmark suite (the paper's method rows, its
producer-load and cap sweeps) on the demo's CPU setting.

The suite is a declarative plan (``divopd/suite/paper_plan.yaml``, schema :class:`~divopd.suite.plan.Plan`): settings
(each = the packaged setting ``tiny``, or the plan's ``configs``, with the run's ``method``, plus the setting's
overrides), method entries (a config ``method`` with an optional distinct ``label`` and overrides, e.g. DivOPD with
``sampler.cap_unit: tokens`` as ``divopd-tokens``), seeds, and two sweeps: producer load (one key, three values, e.g.
vanilla vs divopd-base at three ``explorer.num_envs``) and the cap k of one method.
:func:`~divopd.suite.plan.plan_runs` expands the plan into runs; each run has a report *group* and a *label*:

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

Rules (:func:`~divopd.suite.runs.run_state`): a run with ``summary.json`` is finished and skipped; one with
``config.yaml`` but no summary is resumed (``train(resume=run_dir)``); any other is started.

The code: :mod:`divopd.suite.plan` (the plan and its runs), :mod:`divopd.suite.runs` (skipping, resuming, training),
:mod:`divopd.suite.report` (the reports) and :mod:`divopd.commands.bench` (the command line). The package also holds
replay coverage (:mod:`divopd.suite.coverage`), the demos (:mod:`divopd.suite.demo`, :mod:`divopd.suite.demo_replay`)
and their models (:mod:`divopd.suite.models`).
"""
