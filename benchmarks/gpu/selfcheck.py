"""Self-check of divopd's device paths on this machine: one JSON line per check, a summary table, exit 0 when every
check that ran passed.

    python benchmarks/gpu/selfcheck.py                      # CUDA when torch sees a GPU, else the CPU
    python benchmarks/gpu/selfcheck.py --device cpu --out docs/selfcheck/$(date -u +%F)-cpu.jsonl
    python benchmarks/gpu/selfcheck.py --device cuda --smollm2 /path/to/SmolLM2-135M-Instruct --out result.jsonl

Needs torch, transformers and divopd only; no network (it builds tiny random models itself; ``--smollm2 FOLDER``
adds the explorer, teacher and learner checks on a local SmolLM2-135M copy). vLLM rows run when ``vllm`` imports
(:mod:`check_vllm_nccl`'s checks), the Ray row when ``ray`` imports; otherwise they are skipped with the reason.

Checks (``--only`` picks some by name):

* ``hf_explorer`` / ``hf_teacher``: the HF generator's log probs and the teacher's scores (with top-k) on the device
  equal an HF forward on the CPU in fp32 (max abs error <= 2e-3).
* ``learner_fp32`` / ``learner_bf16``: one ``Learner.step`` on the device: loss and gradient norm within 1e-3 (fp32)
  or 5e-2 (bf16) relative of the CPU fp32 learner on the same batch.
* ``fsdp2``: the sharded learner (FSDP2; NCCL over every local GPU, gloo with 2 ranks on ``--device cpu``) equals
  world size 1: loss and gradient norm of two updates within 1e-3 relative.
* ``train_lockstep`` / ``train_threads`` / ``train_ray``: a 3-update ``divopd train`` with the student, teacher and
  learner on the device: exit 0, three update records, finite losses.
* ``learner_overhead``: seconds per ``Learner.step`` against a bare forward+backward on the same batch (a
  measurement: it fails only if it cannot run).
* ``vllm_reload`` / ``vllm_nccl``: :func:`check_vllm_nccl.check` (generation, scores and a weight update equal HF).

JSON lines go to stdout (and to ``--out``), the table to stderr. ``--device cuda`` on a machine without CUDA records
every device row as skipped with the reason and exits 2 with one line; ``docs/gen_reference.py`` builds the docs'
"What has run where" table from the files committed under ``docs/selfcheck/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT / "src"), str(HERE.parent), str(HERE)]
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

LOGPROB_ATOL = 2e-3
RTOL = {"float32": 1e-3, "bfloat16": 5e-2}
FSDP_RTOL = 1e-3
CHECKS = ["hf_explorer", "hf_teacher", "learner_fp32", "learner_bf16", "fsdp2", "train_lockstep", "train_threads",
          "train_ray", "learner_overhead", "vllm_reload", "vllm_nccl"]


class Skip(Exception):
    """A check that cannot run here; its message is the reason."""


def _importable(name: str) -> str | None:
    """None when ``name`` imports, else the one-line reason."""
    try:
        __import__(name)
    except Exception as exc:  # noqa: BLE001 (a broken install is a reason too)
        return f"{name} does not import here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return None


def describe_device(kind: str) -> str:
    if kind == "cuda":
        n = torch.cuda.device_count()
        return f"cuda: {n}x {torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    name = platform.processor() or platform.machine()
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"cpu: {name}, {os.cpu_count()} cores (torch {torch.__version__})"


def rel_err(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-8)


class Context:
    """What the checks share: the device, the tiny models (built once), a scratch folder."""

    def __init__(self, device: str, tmp: Path, smollm2: str | None) -> None:
        from transformers.utils import logging as hf_logging

        from divopd.explore.envs.tiny import build_tiny_pair

        hf_logging.disable_progress_bar()
        self.device, self.tmp = device, tmp
        self.paths: dict[str, str] = build_tiny_pair(tmp)
        self.models = {"tiny": self.paths["student"], **({"smollm2": smollm2} if smollm2 else {})}

    def prompts(self, tok: Any, n: int = 6) -> list[list[int]]:
        text = "You are an agent. Valid actions: move east, move west, take coin\n"
        return [list(tok(text * (1 + i % 3))["input_ids"]) for i in range(n)]


# ---------------------------------------------------------------------------------------------------- the checks
def check_hf_explorer(ctx: Context, model_name: str) -> dict[str, Any]:
    from divopd.explore.generation import HFGenerator
    from divopd.models import load_model
    from divopd.models.scoring import response_logprobs

    cpu_model, tok = load_model(ctx.models[model_name])
    dev_model, _ = load_model(ctx.models[model_name], device=ctx.device)
    prompts = ctx.prompts(tok)
    gens = HFGenerator(dev_model, tok).generate(prompts, greedy=False, temperature=1.0, max_new_tokens=12, seed=0)
    ref = response_logprobs(cpu_model, prompts, [g.response_ids for g in gens], pad_id=tok.pad_token_id or 0)
    err = max(float(np.abs(g.logprobs - r).max()) for g, r in zip(gens, ref, strict=True) if len(g.response_ids))
    return {"ok": err <= LOGPROB_ATOL, "max_abs_err": err, "tolerance": LOGPROB_ATOL,
            "tokens": sum(len(g.response_ids) for g in gens)}


def check_hf_teacher(ctx: Context, model_name: str) -> dict[str, Any]:
    from divopd.explore.teacher import HFTeacher
    from divopd.models import load_model

    cpu_model, tok = load_model(ctx.models[model_name])
    dev_model, _ = load_model(ctx.models[model_name], device=ctx.device)
    prompts = ctx.prompts(tok)
    responses = [list(tok(" move east\n")["input_ids"]), list(tok(" take coin\n")["input_ids"])] * 3
    got = HFTeacher(dev_model, tok, max_tokens_per_batch=4096).score_turns(prompts, responses, topk=4)
    ref = HFTeacher(cpu_model, tok, max_tokens_per_batch=4096).score_turns(prompts, responses, topk=4)
    err = max(float(np.abs(g.logprobs - r.logprobs).max()) for g, r in zip(got, ref, strict=True))
    top_err = max(float(np.abs(g.topk_logprobs - r.topk_logprobs).max()) for g, r in zip(got, ref, strict=True))
    return {"ok": max(err, top_err) <= LOGPROB_ATOL, "max_abs_err": err, "topk_max_abs_err": top_err,
            "tolerance": LOGPROB_ATOL}


def _learner_batch(vocab: int, rows: int = 16) -> list[Any]:
    from bench_learner import synthetic_turns

    return synthetic_turns(vocab, rows)


def _one_step(path: str, device: str, dtype: str) -> dict[str, float]:
    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.models import load_model

    model, tok = load_model(path)
    learner = Learner(model, LearnerConfig(lr=1e-4, device=device, dtype=dtype), tok)
    return learner.step(_learner_batch(model.get_input_embeddings().num_embeddings))


def check_learner(ctx: Context, model_name: str, dtype: str) -> dict[str, Any]:
    ref = _one_step(ctx.models[model_name], "cpu", "float32")
    got = _one_step(ctx.models[model_name], ctx.device, dtype)
    errs = {k: rel_err(got[f"learner/{k}"], ref[f"learner/{k}"]) for k in ("loss", "grad_norm")}
    return {"ok": all(e <= RTOL[dtype] for e in errs.values()), "loss": got["learner/loss"],
            "loss_cpu_fp32": ref["learner/loss"], "grad_norm": got["learner/grad_norm"],
            "grad_norm_cpu_fp32": ref["learner/grad_norm"], **{f"{k}_rel_err": e for k, e in errs.items()},
            "tolerance": RTOL[dtype]}


def check_fsdp2(ctx: Context) -> dict[str, Any]:
    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.learn.sharded import ShardedLearner
    from divopd.models import load_model

    world = torch.cuda.device_count() if ctx.device == "cuda" else 2
    if world < 2:
        raise Skip(f"FSDP2 over NCCL needs 2 or more GPUs; this machine has {world}")
    path = ctx.paths["student"]
    model, tok = load_model(path)
    turns = _learner_batch(model.get_input_embeddings().num_embeddings)
    single = Learner(model, LearnerConfig(lr=1e-4, device=ctx.device), tok)
    ref = [single.step(turns) for _ in range(2)]
    sharded = ShardedLearner(path, LearnerConfig(lr=1e-4, device=ctx.device, world_size=world))
    try:
        got = [sharded.step(turns) for _ in range(2)]
        backend = ",".join(sorted({str(r.get("backend")) for r in sharded.rank_info}))
    finally:
        sharded.close()
    errs = {f"{k}_rel_err_update{i + 1}": rel_err(g[f"learner/{k}"], r[f"learner/{k}"])
            for i, (g, r) in enumerate(zip(got, ref, strict=True)) for k in ("loss", "grad_norm")}
    return {"ok": max(errs.values()) <= FSDP_RTOL, "world_size": world, "backend": backend, **errs,
            "tolerance": FSDP_RTOL}


def check_train(ctx: Context, kind: str) -> dict[str, Any]:
    import yaml

    if kind == "ray" and (why := _importable("ray")):
        raise Skip(why)
    run_dir = ctx.tmp / f"run-{kind}"
    data = {"setting": "selfcheck", "method": "divopd", "updates": 3, "run_dir": str(run_dir),
            "student": {"path": ctx.paths["student"], "device": ctx.device},
            "teacher": {"path": ctx.paths["teacher"], "device": ctx.device},
            "learner": {"lr": 1e-3, "device": ctx.device},
            "sampler": {"batch_size": 6, "pool_factor": 4, "cap": 2, "max_staleness": 2},
            "explorer": {"env": "tiny", "num_envs": 3, "max_steps": 5, "eval_tasks": 3},
            "eval": {"every": 3, "tasks": 3, "at_start": False}, "checkpoint": {"every": 3, "keep": 1},
            "runtime": {"kind": kind, **({"ray_num_cpus": 2} if kind == "ray" else {})}}
    config = ctx.tmp / f"train-{kind}.yaml"
    config.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "divopd", "train", str(config)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"ok": False, "exit_code": proc.returncode, "wall_s": wall, "error": tail[:300]}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    updates = [r for r in records if "learner/loss" in r]
    losses = [r["learner/loss"] for r in updates]
    ok = len(updates) == 3 and all(x is not None and math.isfinite(x) for x in losses)
    return {"ok": ok, "updates": len(updates), "losses": losses, "wall_s": wall}


def check_learner_overhead(ctx: Context, repeats: int = 5) -> dict[str, Any]:
    from bench_learner import bare_same
    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.models import load_model

    model, tok = load_model(ctx.paths["student"], device=ctx.device)
    bare_model, _ = load_model(ctx.paths["student"], device=ctx.device)
    turns = _learner_batch(model.get_input_embeddings().num_embeddings, rows=32)
    learner = Learner(model, LearnerConfig(lr=1e-4, device=ctx.device), tok)
    sync = torch.cuda.synchronize if ctx.device == "cuda" else (lambda: None)

    def timed(fn: Callable[[], object]) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    step, bare, over = [], [], []
    for i in range(repeats + 1):  # the first round warms up
        s = timed(lambda: learner.step(turns))
        b = timed(lambda: bare_same(bare_model, turns, "packed", tok.pad_token_id))
        if i:
            m = learner.last_update.metrics()
            step.append(s), bare.append(b)
            over.append((m["learner/compute_s"] - m["learner/time_forward_backward_s"])
                        / m["learner/time_forward_backward_s"])
    return {"ok": True, "step_s_median": statistics.median(step), "bare_s_median": statistics.median(bare),
            "step_over_bare": statistics.median(step) / statistics.median(bare),
            "in_step_overhead": statistics.median(over), "rows": len(turns), "repeats": repeats,
            "note": "a measurement, not a verdict"}


def check_vllm(ctx: Context, path: str) -> dict[str, Any]:
    if why := _importable("vllm"):
        raise Skip(why)
    if path == "nccl" and (ctx.device != "cuda" or torch.cuda.device_count() < 2):
        raise Skip("vLLM's NCCL weight sync needs 2 or more GPUs (the engine on one, the sender on another)")
    from check_vllm_nccl import check, tiny_folder

    folder = ctx.tmp / "vllm-tiny"
    if not folder.exists():
        tiny_folder(folder)
    out = check(str(folder), path)
    return {"ok": bool(out.pop("ok")), **out, "tolerance": 2e-3}


def plan(ctx: Context) -> list[tuple[str, str, Callable[[], dict[str, Any]]]]:
    """(check, model, call) in the order they run."""
    rows: list[tuple[str, str, Callable[[], dict[str, Any]]]] = []
    for model in ctx.models:
        rows += [("hf_explorer", model, lambda m=model: check_hf_explorer(ctx, m)),
                 ("hf_teacher", model, lambda m=model: check_hf_teacher(ctx, m)),
                 ("learner_fp32", model, lambda m=model: check_learner(ctx, m, "float32")),
                 ("learner_bf16", model, lambda m=model: check_learner(ctx, m, "bfloat16"))]
    rows += [("fsdp2", "tiny", lambda: check_fsdp2(ctx))]
    rows += [(f"train_{k}", "tiny", lambda k=k: check_train(ctx, k)) for k in ("lockstep", "threads", "ray")]
    rows += [("learner_overhead", "tiny", lambda: check_learner_overhead(ctx))]
    rows += [(f"vllm_{p}", "tiny-0.5m", lambda p=p: check_vllm(ctx, p)) for p in ("reload", "nccl")]
    return rows


# ---------------------------------------------------------------------------------------------------- driver
def run(device: str, out: Path | None, only: list[str] | None, smollm2: str | None) -> int:
    kind = device
    no_cuda = kind == "cuda" and not torch.cuda.is_available()
    desc = describe_device("cpu" if no_cuda else kind)
    base = {"device_kind": kind, "device": desc, "torch": torch.__version__, "python": platform.python_version()}
    results: list[dict[str, Any]] = []
    sink = out.open("w") if out else None
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory(prefix="divopd-selfcheck-") as tmp:
        ctx = Context("cpu" if no_cuda else kind, Path(tmp), smollm2)
        for name, model, call in plan(ctx):
            if only and name not in only:
                continue
            rec: dict[str, Any] = {"check": name, "model": model, **base}
            t0 = time.perf_counter()
            try:
                if no_cuda:
                    raise Skip(f"no CUDA device here (torch {torch.__version__}: torch.cuda.is_available() is "
                               "False); run this on a GPU machine")
                numbers = call()
                ok = bool(numbers.pop("ok"))
                rec.update(status="pass" if ok else "fail", reason="" if ok else numbers.pop("error", "out of "
                           "tolerance"), numbers=numbers)
            except Skip as exc:
                rec.update(status="skip", reason=str(exc), numbers={})
            except Exception as exc:  # noqa: BLE001 (a self-check reports every failure as a row)
                rec.update(status="fail", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                           numbers={})
            rec["seconds"] = round(time.perf_counter() - t0, 2)
            rec["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            line = json.dumps(rec, allow_nan=False, default=float)
            print(line, flush=True)
            if sink:
                sink.write(line + "\n")
                sink.flush()
            results.append(rec)
    if sink:
        sink.close()
    print(summary(results, desc), file=sys.stderr)
    if no_cuda:
        print(f"selfcheck: --device cuda asked, but this machine has no CUDA device (torch {torch.__version__}); "
              "nothing ran", file=sys.stderr)
        return 2
    return 0 if all(r["status"] != "fail" for r in results) else 1


def summary(results: list[dict[str, Any]], desc: str) -> str:
    lines = [f"divopd self-check on {desc}", "| check | model | status | seconds | reason / numbers |",
             "|---|---|---|---|---|"]
    for r in results:
        detail = r["reason"] or ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in r["numbers"].items() if not isinstance(v, list))
        lines.append(f"| {r['check']} | {r['model']} | {r['status']} | {r['seconds']:.1f} | {detail} |")
    counts = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skip")}
    lines.append(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto (default): cuda when torch sees a GPU, else cpu")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON lines to this file")
    p.add_argument("--only", nargs="+", default=None, metavar="CHECK", help=f"run only these: {', '.join(CHECKS)}")
    p.add_argument("--smollm2", default=None, metavar="FOLDER",
                   help="a local SmolLM2-135M(-Instruct) HF folder: adds explorer, teacher and learner rows on it")
    args = p.parse_args(argv)
    if args.only and (unknown := sorted(set(args.only) - set(CHECKS))):
        print(f"selfcheck: unknown check {', '.join(unknown)}; checks: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    if args.smollm2 and not (Path(args.smollm2) / "config.json").is_file():
        print(f"selfcheck: --smollm2 {args.smollm2}: not an HF model folder (no config.json)", file=sys.stderr)
        return 2
    if args.out and args.out.exists() and args.out.stat().st_size and not args.out.read_text().startswith('{"check"'):
        print(f"selfcheck: --out {args.out} exists and is not a self-check file; not overwriting it", file=sys.stderr)
        return 2
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    return run(device, args.out, args.only, args.smollm2)


if __name__ == "__main__":
    sys.exit(main())
