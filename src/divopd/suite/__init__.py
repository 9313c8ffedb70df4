"""``divopd bench paper`` / ``make paper``: the paper benchmark suite (its method rows, producer-load and cap sweeps)
on the demo's CPU setting, from a declarative plan (:mod:`divopd.suite.plan`: the plan, its runs, their groups and
labels), trained resumably (:mod:`divopd.suite.runs`) and reported per group (:mod:`divopd.suite.report`). The package
also holds replay coverage (:mod:`divopd.suite.coverage`), the demos (:mod:`divopd.suite.demo`,
:mod:`divopd.suite.demo_replay`) and their models (:mod:`divopd.suite.models`).
"""
