"""``divopd bench paper`` / ``make paper``: the runner of the paper benchmark suite (issue 8) on the demo's CPU setting.

The suite is a declarative plan (``benchmarks/paper/plan.yaml``, schema :class:`Plan`): settings (each = the tiny
demo config ``configs/tiny/<method>.yaml`` plus the setting's overrides), method entries (a config ``method`` with an
optional distinct ``label`` and overrides, e.g. DivOPD with ``sampler.cap_unit: tokens`` as ``divopd-tokens``), seeds,
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
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from divopd.errors import UsageError, describe_validation_error, describe_yaml_error

REPO = Path(__file__).resolve().parents[3]
DEFAULT_PLAN = REPO / "benchmarks" / "paper" / "plan.yaml"
CONFIGS = REPO / "configs" / "tiny"
COMBINED_REPORTS = ("settings", "load")  # <out>/report/<name>/: every main run together, the load sweep together

__all__ = ["Plan", "PlannedRun", "PlanError", "add_arguments", "load_plan", "plan_runs", "run", "run_state",
           "select_runs"]


class PlanError(UsageError):
    """A plan file that cannot be used; the message names the file and what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_name(name: str, what: str) -> None:
    if not name or "/" in name or "~" in name or name.startswith(".") or any(c.isspace() for c in name):
        raise ValueError(f"{what} {name!r}: use a plain name without '/', '~', spaces or a leading '.'")


def _check_method(method: str) -> None:
    if not (CONFIGS / f"{method}.yaml").is_file():
        known = sorted(p.stem for p in CONFIGS.glob("*.yaml") if not p.stem.startswith("_"))
        raise ValueError(f"method {method!r} has no config configs/tiny/{method}.yaml; known: {', '.join(known)}")


class PlanSetting(_Strict):
    """One setting: config overrides (dotted key -> value) applied to every run of it."""

    overrides: dict[str, Any] = Field(default_factory=dict)


class PlanMethod(_Strict):
    """One method row: a config method (configs/tiny/<method>.yaml), its label (default: the method), overrides."""

    method: str
    label: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label or self.method

    @model_validator(mode="after")
    def _check(self) -> PlanMethod:
        _check_method(self.method)
        _check_name(self.name, "method label")
        return self


class LoadSweep(_Strict):
    """Producer-load sweep (the paper's Table 2): ``key`` takes each of ``values`` for each of ``methods``."""

    setting: str
    key: str = "explorer.num_envs"
    values: list[Any] = Field(min_length=1)
    methods: list[str] = Field(default_factory=lambda: ["vanilla", "divopd-base"], min_length=1)
    seeds: list[int] | None = None  # default: the plan's seeds


class CapSweep(_Strict):
    """Cap sensitivity (the paper's Table 19): ``method`` at every k in ``values``."""

    setting: str
    method: str = "divopd"
    values: list[int] = Field(min_length=1)
    seeds: list[int] | None = None  # default: the plan's seeds

    @model_validator(mode="after")
    def _check(self) -> CapSweep:
        _check_method(self.method)
        if any(k < 1 for k in self.values):
            raise ValueError(f"cap sweep: every k must be >= 1, got {self.values}")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"cap sweep: values repeat: {self.values}")
        return self


class Sweeps(_Strict):
    load: LoadSweep | None = None
    cap: CapSweep | None = None


class Plan(_Strict):
    """The benchmark plan (``benchmarks/paper/plan.yaml``)."""

    out: str = "runs/paper"
    cache: str = "cache/demo"
    updates: int = Field(150, ge=1)
    seeds: list[int] = Field(min_length=1)
    settings: dict[str, PlanSetting] = Field(min_length=1)
    methods: list[PlanMethod] = Field(min_length=1)
    sweeps: Sweeps = Field(default_factory=Sweeps)

    @model_validator(mode="after")
    def _check(self) -> Plan:
        for what, seeds in (("seeds", self.seeds), ("load sweep: seeds", self.sweeps.load and self.sweeps.load.seeds),
                            ("cap sweep: seeds", self.sweeps.cap and self.sweeps.cap.seeds)):
            if seeds is not None and (not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds)):
                raise ValueError(f"{what} must be distinct and >= 0, got {seeds}")
        for name in self.settings:
            _check_name(name, "setting")
            if name in COMBINED_REPORTS:
                raise ValueError(f"setting {name!r}: the name is taken by a combined report {COMBINED_REPORTS}")
        labels = [m.name for m in self.methods]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"method labels repeat: {dup} (give each variant its own label)")
        load = self.sweeps.load
        if load is not None:
            if load.setting not in self.settings:
                raise ValueError(f"load sweep: setting {load.setting!r} is not in settings {sorted(self.settings)}")
            missing = [m for m in load.methods if m not in labels]
            if missing:
                raise ValueError(f"load sweep: methods {missing} are not method labels of the plan {labels}")
            if len({str(v) for v in load.values}) != len(load.values):
                raise ValueError(f"load sweep: values repeat: {load.values}")
        cap = self.sweeps.cap
        if cap is not None and cap.setting not in self.settings:
            raise ValueError(f"cap sweep: setting {cap.setting!r} is not in settings {sorted(self.settings)}")
        clash = sorted(set(self.settings) & {r.group for r in plan_runs(self) if r.kind != "main"})
        if clash:
            raise ValueError(f"setting names clash with sweep groups: {clash}")
        return self


@dataclass(frozen=True)
class PlannedRun:
    """One training run of the plan."""

    kind: Literal["main", "load", "cap"]
    setting: str  # the plan setting it is built on
    group: str  # report group (<out>/<group>/...)
    label: str  # method row in its group's report
    method: str  # config method (configs/tiny/<method>.yaml)
    seed: int
    overrides: tuple[str, ...]  # KEY=VALUE, setting's then method's then sweep point's
    main: PlannedRun | None = None  # a sweep point identical to this main run: trained and stored once, there

    @property
    def key(self) -> str:
        return f"{self.group}/{self.label}/seed{self.seed}"

    def run_dir(self, out: str | Path) -> Path:
        if self.main is not None:
            return self.main.run_dir(out)
        return Path(out) / self.group / self.label / f"seed{self.seed}"

    @property
    def config_setting(self) -> str:
        """The config's ``setting``: the group, or ``<group>~<label>`` when the label is not the config method."""
        return self.group if self.label == self.method else f"{self.group}~{self.label}"


def _as_overrides(d: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f"{k}={json.dumps(v)}" for k, v in d.items())


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; errors name the file and the problem."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file") from None
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the plan file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: not a YAML text file ({exc.reason})") from None
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not valid YAML: {describe_yaml_error(exc)}") from None
    if data is None:
        raise PlanError(f"{path}: empty plan file; a plan is a mapping (out, seeds, settings, methods, sweeps)")
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a plan is a mapping (out, seeds, settings, methods, sweeps)")
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"{path}: {describe_validation_error(exc)}") from None


def config_value(method: str, overrides: tuple[str, ...], key: str) -> Any:
    """The value of dotted ``key`` in configs/tiny/<method>.yaml with ``overrides`` applied (None: no such key)."""
    from divopd.train.config import load_config

    node: Any = load_config(CONFIGS / f"{method}.yaml", list(overrides)).model_dump(mode="json")
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def plan_runs(plan: Plan) -> list[PlannedRun]:
    """Expand the plan into runs: settings × methods × seeds, then the load sweep, then the cap sweep.

    A sweep point that equals its main run's config (same method row, the swept key already at that value, a seed the
    main runs have) gets ``main`` set: it is that run, not a new one.
    """
    runs: list[PlannedRun] = []
    main: dict[tuple[str, str, int], PlannedRun] = {}
    by_label = {m.name: m for m in plan.methods}
    for setting, s in plan.settings.items():
        for m in plan.methods:
            for seed in plan.seeds:
                r = PlannedRun("main", setting, setting, m.name, m.method, seed,
                               _as_overrides(s.overrides) + _as_overrides(m.overrides))
                runs.append(r)
                main[(setting, m.name, seed)] = r

    main_values: dict[tuple[str, str, str], Any] = {}  # (setting, label, key) -> the main runs' value (seed-free)

    def same(setting: str, label: str, seed: int, key: str, value: Any) -> PlannedRun | None:
        r = main.get((setting, label, seed))
        if r is None:
            return None
        if (setting, label, key) not in main_values:
            main_values[(setting, label, key)] = config_value(r.method, r.overrides, key)
        return r if main_values[(setting, label, key)] == value else None

    load = plan.sweeps.load
    if load is not None:
        s = plan.settings[load.setting]
        leaf = load.key.split(".")[-1]
        for value in load.values:
            group = f"{load.setting}-load-{leaf}{value}"
            for label in load.methods:
                m = by_label[label]
                for seed in load.seeds or plan.seeds:
                    ov = _as_overrides(s.overrides) + _as_overrides(m.overrides) + (f"{load.key}={json.dumps(value)}",)
                    runs.append(PlannedRun("load", load.setting, group, label, m.method, seed, ov,
                                           same(load.setting, label, seed, load.key, value)))
    cap = plan.sweeps.cap
    if cap is not None:
        s = plan.settings[cap.setting]
        row = by_label.get(cap.method)
        plain_row = row is not None and row.method == cap.method and not row.overrides  # a main run to share
        for k in cap.values:
            for seed in cap.seeds or plan.seeds:
                twin = same(cap.setting, cap.method, seed, "sampler.cap", k) if plain_row else None
                runs.append(PlannedRun("cap", cap.setting, f"{cap.setting}-cap", f"{cap.method}-k{k}", cap.method,
                                       seed, _as_overrides(s.overrides) + (f"sampler.cap={k}",), twin))
    return runs


def select_runs(runs: list[PlannedRun], only: list[str] | None) -> list[PlannedRun]:
    """Runs whose ``GROUP/LABEL`` matches one of ``only`` (shell globs; ``GROUP`` alone means every label)."""
    if not only:
        return list(runs)
    chosen = []
    for pattern in only:
        group_pat, _, label_pat = pattern.partition("/")
        hits = [r for r in runs if fnmatch.fnmatchcase(r.group, group_pat)
                and fnmatch.fnmatchcase(r.label, label_pat or "*")]
        if not hits:
            groups = sorted({r.group for r in runs})
            raise PlanError(f"--only {pattern!r} matches no run; groups: {', '.join(groups)}")
        chosen.extend(r for r in hits if r not in chosen)
    return [r for r in runs if r in chosen]


def run_state(run_dir: Path) -> Literal["done", "partial", "todo"]:
    """``done`` (summary.json: skipped), ``partial`` (config.yaml, no summary: resumed) or ``todo`` (started).

    A summary that records fewer updates than the run's config asks for (a run stopped by ``max_seconds`` or an
    interrupt that still wrote one) counts as ``partial``, so it is resumed rather than kept short.
    """
    if (run_dir / "summary.json").is_file():
        try:
            done = json.loads((run_dir / "summary.json").read_text()).get("updates")
            wanted = yaml.safe_load((run_dir / "config.yaml").read_text()).get("updates")
        except (OSError, ValueError, AttributeError, yaml.YAMLError):
            return "done"
        if isinstance(done, int) and isinstance(wanted, int) and done < wanted:
            return "partial"
        return "done"
    if (run_dir / "config.yaml").is_file():
        return "partial"
    return "todo"


def run_config(r: PlannedRun, plan: Plan, out: Path, models: dict[str, Path]):  # -> TrainConfig
    """The training config of one planned run: configs/tiny/<method>.yaml + the demo models + the run's overrides."""
    from divopd.train.config import load_config

    r = r.main or r  # a sweep point shared with a main run has that run's config
    fixed = [f"seed={r.seed}", f"updates={plan.updates}", f"setting={json.dumps(r.config_setting)}",
             f"run_dir={json.dumps(str(r.run_dir(out)))}", f"student.path={json.dumps(str(models['student']))}",
             f"teacher.path={json.dumps(str(models['teacher']))}"]
    return load_config(CONFIGS / f"{r.method}.yaml", [*r.overrides, *fixed])


def dry_run_text(runs: list[PlannedRun], out: Path) -> str:
    """The plan as text: one line per run with its state, then counts."""
    lines = []
    for r in runs:
        state = run_state(r.run_dir(out))
        extra = " ".join(r.overrides)
        shared = f"  (= main run {r.main.key})" if r.main is not None else ""
        lines.append(f"{state:7s} {r.run_dir(out)}  [{r.method}{' ' + extra if extra else ''}]{shared}")
    dirs = dict.fromkeys(r.run_dir(out) for r in runs)  # a sweep point shared with a main run counts once
    counts = {s: sum(run_state(d) == s for d in dirs) for s in ("done", "partial", "todo")}
    lines.append(f"{len(dirs)} runs: {counts['done']} done, {counts['partial']} to resume, {counts['todo']} to start")
    return "\n".join(lines)


def train_runs(runs: list[PlannedRun], plan: Plan, out: Path, models: dict[str, Path]) -> None:
    """Train every selected run that is not finished (resume the partial ones)."""
    from divopd.train import train

    for i, r in enumerate(runs, 1):
        r = r.main or r  # a sweep point shared with a main run is trained as that run
        run_dir = r.run_dir(out)
        state = run_state(run_dir)
        if state == "done":
            print(f"bench: [{i}/{len(runs)}] {r.key} finished, kept", flush=True)
            continue
        t0 = time.perf_counter()
        print(f"bench: [{i}/{len(runs)}] {'resuming' if state == 'partial' else 'training'} {r.key}", flush=True)
        if state == "partial":
            summary = train(None, resume=run_dir, progress=sys.stderr.isatty())
        else:
            summary = train(run_config(r, plan, out, models), progress=sys.stderr.isatty())
        print(f"bench: {r.key}: peak SR {summary.get('peak_sr')}, arrival/drain "
              f"{summary.get('arrival_drain_ratio')}, {time.perf_counter() - t0:.0f}s", flush=True)


def _group_runs(runs: list[PlannedRun], out: Path) -> dict[str, list[tuple[PlannedRun, Any]]]:
    """Loaded runs (report.Run, relabelled: setting = group, method = label) per group (runs not started: left out)."""
    from divopd.analysis.report import load_run

    groups: dict[str, list[tuple[PlannedRun, Any]]] = {}
    for r in runs:
        if run_state(r.run_dir(out)) == "todo":
            continue
        loaded = load_run(r.run_dir(out))
        loaded.setting, loaded.method = r.group, r.label
        groups.setdefault(r.group, []).append((r, loaded))
    return groups


def measured_best_cap(pairs: list[tuple[PlannedRun, Any]]) -> tuple[int | None, dict[int, float]]:
    """The cap sweep's measured best k: highest mean (over seeds) peak SR; ties go to the larger k."""
    from divopd.analysis.metrics import peak_sr

    by_k: dict[int, list[float]] = {}
    for r, loaded in pairs:
        peak = peak_sr([e.sr for e in loaded.evals])
        if peak is not None:
            by_k.setdefault(int(r.label.rsplit("-k", 1)[1]), []).append(peak)
    means = {k: sum(v) / len(v) for k, v in sorted(by_k.items())}
    if not means:
        return None, {}
    best = max(means.items(), key=lambda kv: (kv[1], kv[0]))[0]
    return best, means


def write_reports(runs: list[PlannedRun], plan: Plan, out: Path) -> Path:
    """One ``divopd report`` per group into <out>/report/<group>/, tune-cap per setting, an index.md; returns it."""
    from divopd.analysis.report import write_report

    report_dir = out / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    groups = _group_runs(runs, out)
    index = ["# Paper benchmark suite", "", f"Plan: {len(runs)} runs; runs in `{out}`.", ""]
    for group, pairs in groups.items():
        labels = [r.label for r, _ in pairs]
        baseline = "vanilla" if "vanilla" in labels else labels[0]
        write_report([loaded for _, loaded in pairs], report_dir / group, baseline=baseline)
        done = sum(loaded.finished for _, loaded in pairs)
        index.append(f"- [{group}]({group}/report.md): {len(pairs)} runs ({done} finished), baseline {baseline}")
    for kind, name, what in (("main", "settings", "every setting's main runs together: geometric means across them"),
                             ("load", "load", "the load sweep together: one setting per producer load (Table 2)")):
        pairs = [(r, loaded) for g in groups.values() for r, loaded in g if r.kind == kind]
        if len({r.group for r, _ in pairs}) > 1:
            baseline = "vanilla" if any(r.label == "vanilla" for r, _ in pairs) else pairs[0][0].label
            write_report([loaded for _, loaded in pairs], report_dir / name, baseline=baseline)
            index.append(f"- [{name}]({name}/report.md): {what}")
    if not groups:
        index.append("No run has started yet.")
    index += ["", "## Choosing k: `divopd tune-cap` pick vs the measured best k", ""]
    index += tune_cap_section(runs, plan, out, report_dir, groups)
    index += ["", "## Replay coverage (Table 11) on each run's own experience log", ""]
    index += coverage_section(groups, out, report_dir)
    path = report_dir / "index.md"
    path.write_text("\n".join(index) + "\n")
    return path


def coverage_section(groups: dict[str, list[tuple[PlannedRun, Any]]], out: Path, report_dir: Path) -> list[str]:
    """Per group: :func:`divopd.suite.coverage.run_coverage` of every run, as Markdown (also ``coverage.md``/json)."""
    from divopd.analysis.replay import write_json
    from divopd.suite.coverage import coverage_markdown, run_coverage

    lines: list[str] = []
    for group, pairs in groups.items():
        by_label: dict[str, list[Any]] = {}
        for r, _ in pairs:
            by_label.setdefault(r.label, []).append(run_coverage(r.run_dir(out)))
        table = coverage_markdown(by_label)
        write_json(by_label, report_dir / group / "coverage.json")
        (report_dir / group / "coverage.md").write_text(f"# Replay coverage: {group}\n\n" + "\n".join(table) + "\n")
        lines += [f"### {group}", "", *table, ""]
    return lines


def tune_cap_section(runs: list[PlannedRun], plan: Plan, out: Path, report_dir: Path,
                     groups: dict[str, list[tuple[PlannedRun, Any]]]) -> list[str]:
    """``divopd tune-cap`` on one finished vanilla run's experience log per setting, beside the cap sweep's best k."""
    from divopd.analysis.replay import write_json
    from divopd.analysis.tune_cap import markdown_table, title, tune_cap
    from divopd.train.config import load_config

    cap = plan.sweeps.cap
    caps = cap.values if cap is not None else [2, 3, 4, 6]
    method = cap.method if cap is not None else "divopd"
    lines = []
    for setting in plan.settings:
        vanilla = next((r for r in runs if r.kind == "main" and r.group == setting and r.method == "vanilla"
                        and run_state(r.run_dir(out)) == "done" and (r.run_dir(out) / "experience").is_dir()), None)
        if vanilla is None:
            lines.append(f"- {setting}: no finished vanilla run with an experience log yet")
            continue
        cfg = load_config(vanilla.run_dir(out) / "config.yaml")
        result = tune_cap(vanilla.run_dir(out) / "experience", caps, method=method,
                          batch_size=cfg.sampler.batch_size, pool_factor=cfg.sampler.pool_factor,
                          max_staleness=cfg.sampler.max_staleness, updates=cfg.updates, seed=cfg.seed)
        write_json(result, report_dir / f"tune-cap-{setting}.json")
        (report_dir / f"tune-cap-{setting}.md").write_text(f"{title(result)}\n\n{markdown_table(result)}\n")
        line = f"- {setting} ({vanilla.key}): tune-cap picks k = {result['recommended']}"
        sweep = groups.get(f"{setting}-cap") if cap is not None and cap.setting == setting else None
        if sweep:
            best, means = measured_best_cap(sweep)
            shown = ", ".join(f"k={k}: {v:.1f}" for k, v in means.items())
            agree = "agrees" if best == result["recommended"] else "differs"
            if sum(v == means.get(best) for v in means.values()) > 1:
                agree += " (the best mean peak SR is tied; ties go to the larger k)"
            line += f"; measured best k = {best} by mean peak SR ({shown}) — the pick {agree}"
        else:
            line += "; no cap-sweep runs for this setting"
        lines.append(line + f" ([table](tune-cap-{setting}.md))")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``divopd bench``."""
    parser.add_argument("suite", choices=("paper",), help="benchmark suite (paper: issue 8's plan)")
    parser.add_argument("--plan", default=str(DEFAULT_PLAN), help="plan file (default: benchmarks/paper/plan.yaml)")
    parser.add_argument("--out", default=None, help="runs folder (default: the plan's out, runs/paper)")
    parser.add_argument("--only", action="append", default=[], metavar="GROUP[/LABEL]",
                        help="only these runs (shell globs, repeatable), e.g. coin2/divopd or '*-cap'")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their state; train nothing")
    parser.add_argument("--report", action="store_true", help="only write the reports from the runs that exist")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``divopd bench``."""
    plan = load_plan(args.plan)  # PlanError: one line, exit 2 (divopd.cli)
    out = Path(args.out or plan.out)
    runs = select_runs(plan_runs(plan), args.only)
    if args.dry_run:
        print(dry_run_text(runs, out))
        return 0
    if not args.report:
        import torch

        from divopd.suite.demo import prepare_models
        from divopd.train.run import quiet_hf_progress

        quiet_hf_progress()
        torch.set_num_threads(1)
        train_runs(runs, plan, out, prepare_models(Path(plan.cache)))
    index = write_reports(runs, plan, out)
    print(index.read_text())
    print(f"divopd bench: reports in {index.parent}")
    return 0
