"""A synthetic asynchronous producer that writes a real experience log (``divopd simulate``) for ``divopd replay``
when no training run is at hand. Time is in learner updates (``arrival_update = floor(time)``); the producer finishes
about ``R`` rollouts per update, so ``R`` against the drain rate ``B`` sets the load. The distributions are the presets'
(:mod:`divopd.analysis.sim_presets`); docs/guides/replay.md states the model step by step. Seeded and deterministic."""

from __future__ import annotations

import argparse
import heapq
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from divopd.analysis.sim_presets import PRESETS, Preset
from divopd.experience.log import SCHEMA, ExperienceLogWriter

__all__ = ["PRESETS", "Preset", "SimulationSummary", "simulate", "add_arguments", "run"]


@dataclass
class SimulationSummary:
    """What a simulation wrote."""

    preset: str
    updates: int
    explorers: int
    rollouts_per_update: float
    rollouts: int
    turns: int
    successes: int
    truncated_turns: int
    mean_horizon: float
    mean_success_horizon: float | None
    mean_failure_horizon: float | None
    turns_per_update: float
    batch_size: int
    arrival_drain_ratio: float


def sample_horizon(preset: Preset, success: bool, rng: np.random.Generator) -> int:
    """Outcome-dependent horizon: success short (log-normal), failure runs to the step limit."""
    if not success:
        return preset.step_limit
    h = round(float(rng.lognormal(math.log(preset.success_median), preset.success_sigma)))
    return int(min(max(h, preset.min_horizon), preset.step_limit - 1))


def expected_horizon(preset: Preset, draws: int = 20000) -> float:
    """Mean horizon of the preset (fixed-seed Monte Carlo), used to pace the explorers."""
    rng = np.random.default_rng(12345)
    n_success = int(round(draws * preset.success_rate))
    succ = sum(sample_horizon(preset, True, rng) for _ in range(n_success))
    return (succ + (draws - n_success) * preset.step_limit) / draws


def prompt_lengths(preset: Preset, obs: np.ndarray, resp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-turn prompt length (capped at the budget) and the truncation flag (history past the context budget)."""
    step = (obs + resp).astype(np.int64)
    before = np.concatenate([[0], np.cumsum(step)[:-1]])  # history tokens of turns < i
    if preset.history_window is not None:
        w = preset.history_window
        shifted = np.concatenate([np.zeros(w, dtype=np.int64), before])[: len(before)]
        before = before - shifted  # only the last w turns
    full = preset.base_prompt + before + obs
    truncated = full > preset.context_budget
    return np.minimum(full, preset.context_budget).astype(np.int32), truncated


def policy_version(start: float, delay: int) -> int:
    """Version lag: an explorer pulls weights when a rollout starts, ``delay`` updates late."""
    return max(0, math.floor(start) - delay)


#: The per-turn columns a chunk concatenates as they are, with their Arrow types.
_COLUMN_TYPES = {"turn_index": pa.int32(), "policy_version": pa.int64(), "arrival": pa.int64(),
                 "arrival_update": pa.int64(), "prompt_truncated": pa.bool_(), "prompt_len": pa.int32(),
                 "success": pa.bool_()}


class _Chunk:
    """Columnar buffers of rows not yet written."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in ("rollout_id", *_COLUMN_TYPES, "response_len")}
        self.student: list[np.ndarray] = []
        self.teacher: list[np.ndarray] = []
        self.rows = 0

    def add(self, r: dict[str, Any], finish: float, arrival: int) -> None:
        """Append the turns of rollout ``r`` (finished at ``finish``), numbered from ``arrival`` in arrival order."""
        h = len(r["resp"])
        c = self.cols
        c["rollout_id"].append(np.full(h, r["id"], dtype=object))
        c["turn_index"].append(np.arange(h, dtype=np.int32))
        c["policy_version"].append(np.full(h, r["version"], dtype=np.int64))
        c["arrival"].append(np.arange(arrival, arrival + h, dtype=np.int64))
        c["arrival_update"].append(np.full(h, math.floor(finish), dtype=np.int64))
        c["prompt_truncated"].append(r["truncated"])
        c["prompt_len"].append(r["prompt"])
        c["response_len"].append(r["resp"])
        c["success"].append(np.full(h, r["success"], dtype=bool))
        self.student.append(r["student"])
        self.teacher.append(r["teacher"])
        self.rows += h

    def to_batch(self, env: str) -> pa.RecordBatch:
        c = self.cols
        n = self.rows
        resp = np.concatenate(c["response_len"]).astype(np.int32)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(resp, out=offsets[1:])
        off = pa.array(offsets)
        student = pa.ListArray.from_arrays(off, pa.array(np.concatenate(self.student), type=pa.float32()))
        teacher = pa.ListArray.from_arrays(off, pa.array(np.concatenate(self.teacher), type=pa.float32()))
        columns = {
            "rollout_id": pa.array(np.concatenate(c["rollout_id"]).tolist(), type=pa.string()),
            **{k: pa.array(np.concatenate(c[k]), type=t) for k, t in _COLUMN_TYPES.items()},
            "response_len": pa.array(resp, type=pa.int32()),
            "action_mask": pa.nulls(n, type=pa.list_(pa.bool_())),
            "student_logprobs": student,
            "teacher_logprobs": teacher,
            "teacher_valid_mask": pa.nulls(n, type=pa.list_(pa.bool_())),
            "env": pa.array([env] * n, type=pa.string()),
            "teacher_acted": pa.array(np.zeros(n, dtype=bool), type=pa.bool_()),
        }
        fields = [f for f in SCHEMA if f.name in columns]
        return pa.RecordBatch.from_arrays([columns[f.name] for f in fields], schema=pa.schema(fields))


def _new_rollout(preset: Preset, rng: np.random.Generator, e: int, index: int, t0: float,
                 step_time: float) -> tuple[float, dict[str, Any]]:
    """(finish time, rows) of the ``index``-th rollout of explorer ``e``, started at ``t0``."""
    success = bool(rng.random() < preset.success_rate)
    horizon = sample_horizon(preset, success, rng)
    resp = np.clip(np.rint(rng.lognormal(math.log(preset.response_median), preset.response_sigma, horizon)), 4, 512)
    obs = np.clip(np.rint(rng.lognormal(math.log(preset.obs_median), preset.obs_sigma, horizon)), 1, 4096)
    resp = resp.astype(np.int32)
    prompt, truncated = prompt_lengths(preset, obs.astype(np.int64), resp.astype(np.int64))
    total = int(resp.sum())
    mu = rng.lognormal(math.log(preset.disagreement_median), preset.disagreement_sigma, horizon)
    if not success:
        mu = mu * preset.fail_factor
    student = -rng.exponential(preset.student_nll, total)
    gap = rng.normal(np.repeat(mu, resp), preset.token_noise)
    teacher = np.minimum(student - gap, 0.0)
    teacher[np.repeat(truncated, resp)] = np.nan  # truncated prompt: no teacher-scored token
    finish = t0 + horizon * step_time * float(rng.uniform(0.8, 1.2))
    version = policy_version(t0, e % (preset.max_delay + 1))
    return finish, {"id": f"{preset.name}-e{e:03d}-{index:06d}", "version": version, "success": success, "resp": resp,
                    "prompt": prompt, "truncated": truncated, "student": student.astype(np.float32),
                    "teacher": teacher.astype(np.float32)}


def simulate(preset: Preset | str, out: str | os.PathLike, explorers: int = 8, rollouts_per_update: float | None = None,
             updates: int = 100, seed: int = 0, batch_size: int = 256, overwrite: bool = False,
             row_group_size: int = 16384) -> SimulationSummary:
    """Run the synthetic producer for ``updates`` learner updates and write its experience log to ``out``; rollouts
    that would finish at or after ``updates`` are not written (their turns never reach the queue)."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    R = preset.default_rollouts_per_update if rollouts_per_update is None else rollouts_per_update
    if explorers < 1 or R <= 0 or updates < 1 or batch_size < 1:
        raise ValueError("explorers, rollouts_per_update, updates and batch_size must be positive")
    rng = np.random.default_rng(seed)
    step_time = explorers / (R * expected_horizon(preset))

    counts = {"rollouts": 0, "turns": 0, "successes": 0, "truncated": 0, "succ_h": 0, "fail_h": 0}
    next_id = [0] * explorers
    heap: list[tuple[float, int, int, dict[str, Any]]] = []

    def start(e: int, t0: float) -> None:
        finish, rollout = _new_rollout(preset, rng, e, next_id[e], t0, step_time)
        next_id[e] += 1
        heapq.heappush(heap, (finish, e, next_id[e], rollout))

    for e in range(explorers):
        start(e, 0.0)

    chunk = _Chunk()
    arrival = 0
    with ExperienceLogWriter(out, row_group_size=row_group_size, overwrite=overwrite) as writer:
        while heap:
            finish, e, _, r = heapq.heappop(heap)
            if finish >= updates:
                continue  # this explorer's rollout ends after the horizon; it retires
            h = len(r["resp"])
            chunk.add(r, finish, arrival)
            arrival += h
            counts["rollouts"] += 1
            counts["turns"] += h
            counts["truncated"] += int(r["truncated"].sum())
            counts["successes"] += int(r["success"])
            counts["succ_h" if r["success"] else "fail_h"] += h
            if chunk.rows >= row_group_size:
                writer.write_batch(chunk.to_batch(preset.name))
                chunk = _Chunk()
            start(e, finish)
        if chunk.rows:
            writer.write_batch(chunk.to_batch(preset.name))
    n_fail = counts["rollouts"] - counts["successes"]
    return SimulationSummary(
        preset=preset.name, updates=updates, explorers=explorers, rollouts_per_update=R, rollouts=counts["rollouts"],
        turns=counts["turns"], successes=counts["successes"], truncated_turns=counts["truncated"],
        mean_horizon=counts["turns"] / max(counts["rollouts"], 1),
        mean_success_horizon=counts["succ_h"] / counts["successes"] if counts["successes"] else None,
        mean_failure_horizon=counts["fail_h"] / n_fail if n_fail else None, turns_per_update=counts["turns"] / updates,
        batch_size=batch_size, arrival_drain_ratio=counts["turns"] / (updates * batch_size))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="alfworld", help="environment preset")
    parser.add_argument("--explorers", type=int, default=8, help="E, explorers running rollouts (default 8)")
    parser.add_argument("--rollouts-per-update", type=float, default=None,
                        help="R, rollouts finished per learner update (default: the preset's, load ≈ 2 at B=256)")
    parser.add_argument("--updates", type=int, default=100, help="U, learner updates to simulate (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256, help="B, the drain rate for the printed load ratio")
    parser.add_argument("--success-rate", type=float, default=None, help="override the preset's success rate")
    parser.add_argument("--out", required=True, help="log path: FILE.parquet, or a directory for part files")
    parser.add_argument("--force", action="store_true", help="overwrite an existing .parquet file")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from divopd.errors import UsageError

    console = Console(width=None if Console().is_terminal else 160)
    preset = PRESETS[args.preset]
    for flag, value in (("--explorers", args.explorers), ("--rollouts-per-update", args.rollouts_per_update),
                        ("--updates", args.updates), ("--batch-size", args.batch_size)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    if args.success_rate is not None:
        if not 0 <= args.success_rate <= 1:
            raise UsageError(f"--success-rate must be in [0, 1], got {args.success_rate}")
        preset = replace(preset, success_rate=args.success_rate)
    out = Path(args.out)
    if out.suffix != ".parquet" and out.is_dir() and any(out.glob("part-*.parquet")):
        raise UsageError(f"--out {out} already holds part files; choose a new --out")
    if out.suffix == ".parquet" and out.exists() and not args.force:
        raise UsageError(f"--out {out} exists; pass --force to overwrite it")
    if out.suffix != ".parquet" and out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: a file that is not a .parquet log; give FILE.parquet or a directory")
    try:
        s = simulate(preset, out, explorers=args.explorers, rollouts_per_update=args.rollouts_per_update,
                     updates=args.updates, seed=args.seed, batch_size=args.batch_size, overwrite=args.force)
    except (ValueError, FileExistsError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(str(exc)) from exc
    console.print(
        f"wrote {out}: {s.turns} turns of {s.rollouts} rollouts ({s.successes} successes) over {s.updates} updates; "
        f"horizon mean {s.mean_horizon:.1f} (success {s.mean_success_horizon or 0:.1f}, failure "
        f"{s.mean_failure_horizon or 0:.1f}); truncated prompts {s.truncated_turns} "
        f"({100 * s.truncated_turns / max(s.turns, 1):.1f}%)"
    )
    console.print(f"measured arrival/drain ratio: {s.turns_per_update:.1f} turns/update ÷ B={s.batch_size} = "
                  f"{s.arrival_drain_ratio:.2f}")
    return 0
