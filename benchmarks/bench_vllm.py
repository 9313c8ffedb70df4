"""Explorer turns/s with HF vs vLLM behind the explorer, side by side in one run, on the same env, tasks and model.

For each model (a tiny random Llama with head_dim 64, which the CPU attention kernel accepts; SmolLM2-135M-Instruct
when ``cache/smollm2-135m`` exists, see ``benchmarks/build_smollm2.py``) and each backend (``hf``: HF generate + a
packed HF teacher forward; ``vllm``: a vLLM engine for the student and one for the teacher, prefix caching on;
``vllm-noprefix``: the same with prefix caching off), an explorer plays multi-turn TextWorld-Express episodes (the
prompt of turn t holds turns 0..t-1, so consecutive prompts share their prefix). After a warm-up round it times
``Explorer.collect`` and reports student turns/s, where the time goes, and the weight publication time into the
generator (HF ``load_state_dict`` vs the engine's in-place reload; median of 3).

    .venv-vllm/bin/python benchmarks/bench_vllm.py                 # tiny + SmolLM2 if built
    .venv-vllm/bin/python benchmarks/bench_vllm.py --models tiny --rollouts 16 --json out.json

Both backends sample with different random streams, so the episodes (and their lengths) differ; the tasks, prompts
format, model and decoding settings are the same. Needs vllm (``make setup-vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from divopd.explore.envs.tiny import env_corpus  # noqa: E402

SMOLLM2 = ROOT / "cache" / "smollm2-135m"
ENV, ENV_KWARGS = "twx", {"game": "coin", "params": "numLocations=3,includeDoors=0"}


def tiny_folder(out: Path) -> str:
    """A random-init tiny Llama of size ``0.5m`` (hidden 128, 2 heads of 64, 2 layers) with a word tokenizer from the
    env's text."""
    from divopd.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer(env_corpus(ENV, ENV_KWARGS), kind="word")
    build_model(tok, size="0.5m", seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def build(backend: str, folder: str, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """An explorer with the student and the teacher on ``backend``."""
    from divopd.explore.explorer import Explorer, ExplorerConfig
    from divopd.models import load_model

    cfg = ExplorerConfig(env=ENV, env_kwargs=ENV_KWARGS, num_envs=args.num_envs, max_steps=args.max_steps,
                         generation={"max_new_tokens": args.max_new_tokens},
                         prompt={"max_prompt_tokens": args.max_prompt_tokens})
    if backend == "hf":
        student, tok = load_model(folder)
        teacher, _ = load_model(folder)
        return Explorer(cfg, student, tok, teacher, seed=0), student, None
    from divopd import VLLMGenerator

    engine = {"dtype": "float32", "max_model_len": args.max_prompt_tokens + args.max_new_tokens + 8,
              "enable_prefix_caching": backend == "vllm", "kv_cache_memory_bytes": 2**29}
    student = VLLMGenerator(folder, seed=0, **engine)
    teacher = VLLMGenerator(folder, seed=1, **engine)
    return Explorer(cfg, None, student.tokenizer, teacher, seed=0, student_backend=student), student, teacher


def publish_seconds(backend: str, generator: Any, folder: str) -> float:
    """Median seconds of 3 weight publications into the student's generator (perturbed weights each time)."""
    from divopd.models import load_model

    model, _ = load_model(folder)
    times = []
    for i in range(3):
        state = {k: v + 0.001 * (i + 1) for k, v in model.state_dict().items()}
        t0 = time.perf_counter()
        if backend == "hf":
            generator.load_state_dict(state)
        else:
            generator.update_weights(state)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(model: str, folder: str, backend: str, args: argparse.Namespace) -> dict:
    explorer, student, teacher = build(backend, folder, args)
    with explorer:
        explorer.collect(args.num_envs)  # warm up: env start, the engines' first steps
        before = explorer.stats()
        t0 = time.perf_counter()
        rollouts = explorer.collect(args.rollouts)
        seconds = time.perf_counter() - t0
        after = explorer.stats()
        d = {k: after[k] - before[k] for k in after}
        turns = sum(len(r.turns) for r in rollouts)
        publish = publish_seconds(backend, student, folder)
    if teacher is not None:
        teacher.close()
    return {"model": model, "backend": backend, "rollouts": len(rollouts), "turns": turns, "seconds": seconds,
            "turns_per_s": turns / seconds, "env_steps_per_s": d["explorer/env_steps"] / seconds,
            "mean_prompt_tokens": sum(t.prompt_len for r in rollouts for t in r.turns) / max(turns, 1),
            "generate_s": d["explorer/time/generate"], "teacher_score_s": d["explorer/time/teacher_score"],
            "env_s": d["explorer/time/env"], "publish_s": publish}


def table(rows: list[dict]) -> str:
    lines = ["| model | backend | turns/s | env steps/s | mean prompt tokens | generate s | teacher score s | "
             "publish s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['backend']} | {r['turns_per_s']:.2f} | {r['env_steps_per_s']:.2f} | "
                     f"{r['mean_prompt_tokens']:.0f} | {r['generate_s']:.1f} | {r['teacher_score_s']:.1f} | "
                     f"{r['publish_s']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2", help="tiny and/or smollm2 (skipped when not built)")
    p.add_argument("--backends", default="hf,vllm,vllm-noprefix")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the HF backend")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)  # before any engine: vLLM's CPU worker then pins its own threads
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = {"tiny": tiny_folder(Path(tmp) / "tiny")}
        if SMOLLM2.is_dir():
            folders["smollm2"] = str(SMOLLM2)
        backends = args.backends.split(",")
        backends.sort(key=lambda b: b != "hf")  # HF first: a vLLM CPU engine takes over torch's thread settings
        for backend in backends:
            for model in args.models.split(","):
                if model not in folders:
                    print(f"skip {model}: no model folder", file=sys.stderr)
                    continue
                row = bench(model, folders[model], backend, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
    rows.sort(key=lambda r: (r["model"], r["backend"]))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
