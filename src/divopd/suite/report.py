"""The paper benchmark's reports: one ``divopd report`` per group and the combined ones, the ``divopd tune-cap`` pick
beside the cap sweep's measured best k, replay coverage per run, and ``report/index.md`` (:func:`write_reports`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from divopd.suite.plan import Plan, PlannedRun
from divopd.suite.runs import distinct_run_dirs, run_state


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
    from divopd.analysis.format import mean
    from divopd.experience.metrics import peak_sr

    by_k: dict[int, list[float]] = {}
    for r, loaded in pairs:
        peak = peak_sr([e.sr for e in loaded.evals])
        if peak is not None:
            by_k.setdefault(int(r.label.rsplit("-k", 1)[1]), []).append(peak)
    means = {k: mean(v) for k, v in sorted(by_k.items())}
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
    distinct = len(distinct_run_dirs(runs, out))
    shared = len(runs) - distinct
    index = ["# Paper benchmark suite", "",
             f"Plan: {distinct} runs; runs in `{out}`"
             + (f" ({shared} sweep points are main runs, and appear in both groups)." if shared else "."), ""]
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

