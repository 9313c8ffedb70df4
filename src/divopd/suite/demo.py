"""``make demo`` / ``python -m divopd.suite.demo``: a real asynchronous OPD run on a laptop CPU, vanilla vs DivOPD.

The setting's models (``coin6-dart``'s are shipped and copied; others are built once with ``divopd sft``,
:func:`divopd.suite.models.prepare_models`), then its ``method`` rows vanilla and divopd per seed (only the sampler
differs; lockstep runtime, reproducible), ``--jobs`` runs side by side in child processes (finished runs kept,
interrupted ones resumed), then ``divopd report`` over the runs and ``divopd replay`` over the vanilla run's log, all
in ``runs/demo/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from divopd.errors import UsageError
from divopd.suite.models import SHIPPED, default_cache, prepare_models, recipe_for
from divopd.train.packaged import CONFIGS as PACKAGED_CONFIGS
from divopd.train.packaged import config_path

#: The demo's setting: the study group ``coin6-dart`` of ``benchmarks/regime/plan-coin6-dart.yaml`` (a test checks that
#: the two agree).
SETTING = "coin6-dart"
#: Its packaged setting file.
CONFIGS = PACKAGED_CONFIGS / f"{SETTING}.yaml"


_UPDATE = re.compile(r"update (\d+) SR ")
_EVAL = re.compile(r"eval @(\d+): .*\"eval/success_rate\": ([0-9.]+)")


def demo_config(configs: Path, method: str, seed: int, out: Path, models: dict[str, Path], updates: int | None,
                extra: list[str] | None = None):  # -> TrainConfig
    """The training config of one demo run: the setting file ``configs`` with row ``method`` + the cached models +
    overrides."""
    from divopd.train.config import load_config

    overrides = [f"method={method}", f"seed={seed}", f"out_dir={out}", f"student.path={models['student']}",
                 f"teacher.path={models['teacher']}", *(extra or [])]
    if updates is not None:
        overrides.insert(2, f"updates={updates}")
    return load_config(configs, overrides)


def _command(cfg: Any, run_dir: Path) -> list[str]:
    """``divopd train`` of one run in a child process (resumed when its directory holds a started run)."""
    base = [sys.executable, "-m", "divopd.cli", "train", "--no-progress"]
    if (run_dir / "config.yaml").is_file():
        return [*base, "--resume", str(run_dir)]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    path = run_dir.parent / f".{run_dir.name}.config.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return [*base, str(path), "--run-dir", str(run_dir)]


class _Board:
    """Progress of the runs in flight: rich bars on a terminal, prefixed log lines otherwise."""

    def __init__(self, enabled: bool) -> None:
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bars = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[info]}"), TimeElapsedColumn())
            self._bars.start()

    def add(self, name: str, total: int) -> None:
        if self._bars is not None:
            self._tasks[name] = self._bars.add_task(name, total=total, info="")

    def line(self, name: str, text: str) -> None:
        m, e = _UPDATE.search(text), _EVAL.search(text)
        if self._bars is None:
            print(f"[{name}] " + (f"eval @{e.group(1)}: held-out SR {100 * float(e.group(2)):.1f}%" if e else text),
                  flush=True)
            return
        if m:
            self._bars.update(self._tasks[name], completed=int(m.group(1)))
        if e:
            self._bars.update(self._tasks[name], info=f"SR {100 * float(e.group(2)):.0f}% @{e.group(1)}")

    def close(self) -> None:
        if self._bars is not None:
            self._bars.stop()


def run_methods(out: Path, models: dict[str, Path], methods: list[str], seeds: list[int], updates: int | None,
                extra: list[str] | None = None, *, configs: Path = CONFIGS, jobs: int = 2,
                progress: bool = False) -> list[Path]:
    """Train every (method, seed) not finished yet, ``jobs`` at a time; returns the run directories."""
    todo, run_dirs = [], []
    for seed in seeds:
        for method in methods:
            cfg = demo_config(configs, method, seed, out, models, updates, extra)
            run_dir = cfg.resolved_run_dir()
            run_dirs.append(run_dir)
            if (run_dir / "summary.json").is_file():
                print(f"demo: {run_dir} is finished, kept", flush=True)
            else:
                todo.append((f"{method} s{seed}", cfg, run_dir))
    board = _Board(progress)
    env = os.environ | {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    try:
        while todo:
            batch, todo = todo[:jobs], todo[jobs:]
            procs = []
            for name, cfg, run_dir in batch:
                print(f"demo: training {name} ({cfg.updates} updates) -> {run_dir}", flush=True)
                board.add(name, cfg.updates)
                procs.append((name, run_dir, subprocess.Popen(
                    _command(cfg, run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)))
            _follow(procs, board)
    finally:
        board.close()
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        print(f"demo: {run_dir.parent.name} seed {summary.get('seed', run_dir.name)}: peak SR {summary['peak_sr']}, "
              f"arrival/drain {summary['arrival_drain_ratio']:.2f}", flush=True)
    return run_dirs


def _follow(procs: list[tuple[str, Path, subprocess.Popen]], board: _Board) -> None:
    """Relay the children's log lines until all end; a failed run stops the demo with its last lines."""
    import selectors

    sel = selectors.DefaultSelector()
    tails: dict[str, deque[str]] = {}
    for name, _, proc in procs:
        sel.register(proc.stderr, selectors.EVENT_READ, name)
        tails[name] = deque(maxlen=20)
    open_streams = len(procs)
    while open_streams:
        for key, _ in sel.select():
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            text = line.rstrip()
            tails[key.data].append(text)
            if " INFO " in text or "Error" in text:
                board.line(key.data, text.split(" INFO ", 1)[-1])
    for name, run_dir, proc in procs:
        try:  # its output streams are closed: the process is exiting
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=30)
        if code != 0:  # run_methods closes the board
            raise RuntimeError(f"demo: {name} failed (exit {proc.returncode}) in {run_dir}:\n" + "\n".join(tails[name]))


def replay_vanilla_log(run_dir: Path, out: Path, batch_size: int, updates: int) -> dict[str, Any]:
    """Replay the selection rules over one run's own experience log (the paper's shared-buffer replay)."""
    from divopd.analysis.replay import ReplayConfig, plot_replay, replay, write_json
    from divopd.sampling.method_rows import method_names

    result = replay(run_dir / "experience", ReplayConfig(methods=method_names("demo-replay"), batch_size=batch_size,
                                                          updates=updates))
    write_json(result, out / "replay.json")
    plot_replay(result, out / "replay.png", title=f"replay over {run_dir.parent.name} seed log")
    return result


def replay_markdown(result: dict[str, Any]) -> str:
    from divopd.analysis.format import fmt, md_table

    header = ["method", "valid rollouts", "used", "unused fraction", "effective rollouts / batch", "max rollout share"]
    rows = [[method, str(m["valid_rollouts"]), str(m["used_rollouts"]), fmt(m["unused_fraction"], pct=True),
             fmt(m["effective_rollouts_mean"]), fmt(m["max_rollout_share_mean"], pct=True)]
            for method, m in result["methods"].items()]
    return "\n".join(md_table(header, rows, align="lrrrrr")) + "\n"


def write_demo_report(run_dirs: list[Path], report_dir: Path) -> Path:
    """``divopd report`` over the runs, plus the replay of the vanilla run's log; returns report.md."""
    from divopd.analysis.report import find_run_dirs, load_run, write_report
    from divopd.train.config import load_config

    runs = [load_run(p) for p in find_run_dirs([str(d) for d in run_dirs])]
    write_report(runs, report_dir)
    vanilla = next((d for d in run_dirs if d.parent.name == "vanilla"), None)
    if vanilla is not None and (vanilla / "experience").is_dir():
        cfg = load_config(vanilla / "config.yaml")
        result = replay_vanilla_log(vanilla, report_dir, cfg.sampler.batch_size, cfg.updates)
        with open(report_dir / "report.md", "a") as f:
            f.write("\n## Shared-buffer replay of the vanilla run's experience log\n\n"
                    f"Every selection rule replayed over the same log (B={cfg.sampler.batch_size}, "
                    f"c={cfg.sampler.pool_factor:g}, k={cfg.sampler.cap}, S={cfg.sampler.max_staleness}); "
                    "see `divopd replay`.\n\n" + replay_markdown(result) + "\n![replay](replay.png)\n")
    return report_dir / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m divopd.suite.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo", help="output folder (runs, report)")
    parser.add_argument("--configs", default=SETTING, help="the setting: coin6-dart (default), another packaged one "
                        "with a model recipe (coin4, ...), tiny (the 2-room cold start), or a setting file named like "
                        "one of them")
    parser.add_argument("--cache", default=None, help="folder of the teacher and student (default cache/<setting>; "
                        "tiny: cache/demo); shipped models (divopd/shipped/<setting>) are copied there")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--updates", type=int, default=None, help="updates per run (default: the config's)")
    parser.add_argument("--methods", nargs="+", default=["vanilla", "divopd"])
    parser.add_argument("--jobs", type=int, default=2, help="runs trained side by side (one torch thread each)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override for every run")
    args = parser.parse_args(argv)
    try:
        configs = config_path(args.configs)
        recipe = recipe_for(configs)
    except (UsageError, KeyError) as exc:
        print(f"demo: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    name = configs.stem
    if args.jobs < 1:
        print(f"demo: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    import torch

    from divopd.cli import quiet_third_party_loggers

    quiet_third_party_loggers()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    out = Path(args.out)
    cache = Path(args.cache) if args.cache else default_cache(name)
    overrides = list(args.overrides)
    try:
        for method in args.methods:  # every method row, before anything is built or trained
            demo_config(configs, method, args.seeds[0], out, {"student": cache, "teacher": cache}, args.updates,
                        overrides)
        models = prepare_models(cache, recipe, shipped=SHIPPED / name)  # refuses a cache folder divopd did not write
    except UsageError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    try:
        run_dirs = run_methods(out, models, args.methods, args.seeds, args.updates, overrides, configs=configs,
                               jobs=args.jobs, progress=sys.stderr.isatty())
    except RuntimeError as exc:  # a run failed: its last log lines, no traceback of the demo itself
        print(exc, file=sys.stderr)
        return 1
    report = write_demo_report(run_dirs, out / "report")
    print(report.read_text())
    print(f"demo: done in {time.perf_counter() - t0:.0f}s; report in {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
