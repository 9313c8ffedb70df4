"""The paper benchmark's plan: its schema (:class:`Plan`), loading it (:func:`load_plan`, :class:`PlanError`), and its
expansion into runs (:func:`plan_runs`, :class:`PlannedRun`) and a selection of them (:func:`select_runs`)."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from divopd.errors import UsageError, describe_validation_error, read_yaml_mapping
from divopd.sampling import method_names
from divopd.train.packaged import CONFIGS as PACKAGED_CONFIGS
from divopd.train.packaged import setting_names

#: The paper suite's plan, shipped in the package (``benchmarks/paper/plan.yaml`` in a checkout links to it).
DEFAULT_PLAN = Path(__file__).resolve().parent / "paper_plan.yaml"
#: The packaged setting every plan starts from unless it names another (``configs:``).
CONFIGS = PACKAGED_CONFIGS / "tiny.yaml"
COMBINED_REPORTS = ("settings", "load")  # <out>/report/<name>/: every main run together, the load sweep together

class PlanError(UsageError):
    """A plan file that cannot be used; the message names the file and what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_name(name: str, what: str) -> None:
    if not name or "/" in name or "~" in name or name.startswith(".") or any(c.isspace() for c in name):
        raise ValueError(f"{what} {name!r}: use a plain name without '/', '~', spaces or a leading '.'")


class PlanSetting(_Strict):
    """One setting: config overrides (dotted key -> value) applied to every run of it."""

    overrides: dict[str, Any] = Field(default_factory=dict)


class PlanMethod(_Strict):
    """One method row: a config method (a row of divopd.sampling.method_rows, run on the plan's setting), its label
    (default: the method), overrides."""

    method: str
    label: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] | None = None  # main runs of this row (default: the plan's seeds)

    @property
    def name(self) -> str:
        return self.label or self.method

    @model_validator(mode="after")
    def _check(self) -> PlanMethod:
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
        if any(k < 1 for k in self.values):
            raise ValueError(f"cap sweep: every k must be >= 1, got {self.values}")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"cap sweep: values repeat: {self.values}")
        return self


class Sweeps(_Strict):
    load: LoadSweep | None = None
    cap: CapSweep | None = None


class Plan(_Strict):
    """A benchmark plan (the paper's: :data:`DEFAULT_PLAN`)."""

    out: str = "runs/paper"
    configs: str = Field("tiny", description="what every run starts from (docs/guides/paper-suite.md): a packaged "
                         "setting's name, its models built into `cache` from the recipe of that name, or the path of "
                         "a training config of your own (.yaml), its models used as they are")
    cache: str = "cache/demo"
    updates: int = Field(150, ge=1)
    seeds: list[int] = Field(min_length=1)
    settings: dict[str, PlanSetting] = Field(min_length=1)
    methods: list[PlanMethod] = Field(min_length=1)
    sweeps: Sweeps = Field(default_factory=Sweeps)

    @property
    def own_config(self) -> bool:
        """Whether ``configs`` is the path of a config file of the user's own (not a packaged setting's name)."""
        return self.configs.endswith((".yaml", ".yml"))

    @property
    def config_file(self) -> Path:
        """The config file every run starts from: the packaged setting file of ``configs``, or ``configs`` itself."""
        return Path(self.configs) if self.own_config else PACKAGED_CONFIGS / f"{self.configs}.yaml"

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.own_config and not self.config_file.is_file():
            raise ValueError(f"configs {self.configs!r}: no such config file (a path is relative to the working "
                             "directory)")
        if not self.own_config:
            from divopd.suite.models import RECIPES

            _check_name(self.configs, "configs")
            if not self.config_file.is_file():
                raise ValueError(f"configs {self.configs!r}: no packaged setting of that name; settings: "
                                 f"{', '.join(setting_names())}")
            if self.configs not in RECIPES:
                raise ValueError(f"configs {self.configs!r}: its models have no recipe in divopd.suite.models "
                                 f"(known: {', '.join(RECIPES)})")
        for method in [m.method for m in self.methods] + ([self.sweeps.cap.method] if self.sweeps.cap else []):
            if method not in method_names():  # every row is a method row of the registry
                raise ValueError(f"unknown method {method!r}; known: {', '.join(method_names())}")
        for what, seeds in (("seeds", self.seeds), ("load sweep: seeds", self.sweeps.load and self.sweeps.load.seeds),
                            ("cap sweep: seeds", self.sweeps.cap and self.sweeps.cap.seeds),
                            *((f"method {m.name}: seeds", m.seeds) for m in self.methods)):
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
    method: str  # config method (a method row, run on the plan's setting file)
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
    data = read_yaml_mapping(path, "plan", "out, seeds, settings, methods, sweeps", PlanError)
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"{path}: {describe_validation_error(exc)}") from None


def config_value(method: str, overrides: tuple[str, ...], key: str, configs: Path = CONFIGS) -> Any:
    """The value of dotted ``key`` in the config of row ``method`` on setting file ``configs`` with ``overrides``
    applied (None: no such key)."""
    from divopd.train.config import load_config

    node: Any = load_config(configs, [f"method={method}", *overrides]).model_dump(mode="json")
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def plan_runs(plan: Plan) -> list[PlannedRun]:
    """Expand the plan into runs: settings × methods × seeds, then the load sweep, then the cap sweep. A sweep point
    that equals a main run's config (same row and seed, the swept key already at that value) gets ``main`` set."""
    runs: list[PlannedRun] = []
    main: dict[tuple[str, str, int], PlannedRun] = {}
    by_label = {m.name: m for m in plan.methods}
    for setting, s in plan.settings.items():
        for m in plan.methods:
            for seed in m.seeds or plan.seeds:
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
            main_values[(setting, label, key)] = config_value(r.method, r.overrides, key, plan.config_file)
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


def select_runs(runs: list[PlannedRun], only: list[str] | None,
                seeds: list[int] | None = None) -> list[PlannedRun]:
    """Runs whose ``GROUP/LABEL`` matches one of ``only`` (shell globs; ``GROUP`` alone means every label) and, when
    ``seeds`` is given, whose seed is one of them."""
    if seeds is not None:
        runs = [r for r in runs if r.seed in seeds]
        if not runs:
            raise PlanError(f"--seeds {' '.join(map(str, seeds))}: no run of the plan has these seeds")
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

