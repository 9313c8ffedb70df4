"""Explorer throughput: student turns per second on each environment with tiny models (CPU, one torch thread).

For each env: build a word tokenizer from a few episodes of the env's text, a random-init tiny student and teacher, and
time ``Explorer.collect`` (lockstep env instances, batched generation, batched teacher scoring at rollout end). Reports
turns/s (student turns of the rollouts that finished in the timed window, i.e. queued), env steps/s (every student
action taken in the window, finished or not: the generation throughput) and where the time goes.

    .venv/bin/python benchmarks/bench_explorer.py                      # tiny, twx, scienceworld
    .venv/bin/python benchmarks/bench_explorer.py --envs twx --size 5m --num-envs 8
    .venv/bin/python benchmarks/bench_explorer.py --envs twx --student runs/sft/student --teacher runs/sft/teacher
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def bench_env(env_name: str, env_kwargs: dict, args: argparse.Namespace) -> dict:
    from divopd.explore.envs.tiny import env_corpus
    from divopd.explore.explorer import Explorer, ExplorerConfig
    from divopd.models.tiny import build_model, build_tokenizer

    if args.student:  # trained models (they stop after a few tokens, unlike random ones)
        from divopd.models import load_model

        student, tok = load_model(args.student)
        teacher, _ = load_model(args.teacher or args.student)
    else:
        tok = build_tokenizer(env_corpus(env_name, env_kwargs), kind="word")
        student = build_model(tok, size=args.size, seed=0)
        teacher = build_model(tok, size=args.size, seed=1)
    cfg = ExplorerConfig(env=env_name, env_kwargs=env_kwargs, num_envs=args.num_envs, max_steps=args.max_steps,
                         generation={"max_new_tokens": args.max_new_tokens},
                         prompt={"max_prompt_tokens": args.max_prompt_tokens,
                                 "past_observation_max_words": args.past_observation_max_words})
    with Explorer(cfg, student, tok, teacher, seed=0) as explorer:
        explorer.collect(args.num_envs)  # warm up: env start, first generate
        before = explorer.stats()
        t0 = time.perf_counter()
        rollouts = explorer.collect(args.rollouts)
        seconds = time.perf_counter() - t0
        after = explorer.stats()
    d = {k: after[k] - before[k] for k in after}
    turns = sum(len(r.turns) for r in rollouts)
    return {
        "env": env_name, "size": args.student or args.size, "num_envs": args.num_envs, "rollouts": len(rollouts),
        "turns": turns,
        "seconds": seconds, "turns_per_s": turns / seconds, "env_steps_per_s": d["explorer/env_steps"] / seconds,
        "mean_prompt_tokens": sum(t.prompt_len for r in rollouts for t in r.turns) / max(turns, 1),
        "generate_s": d["explorer/time/generate"], "env_s": d["explorer/time/env"],
        "teacher_score_s": d["explorer/time/teacher_score"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["tiny", "twx", "scienceworld"])
    parser.add_argument("--size", default="1m", help="random-init tiny model size (without --student)")
    parser.add_argument("--student", default=None, help="HF folder of a trained student (e.g. a divopd sft output)")
    parser.add_argument("--teacher", default=None, help="HF folder of the teacher (default: the student)")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--past-observation-max-words", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kwargs = {"scienceworld": {"task_names": ["find-living-thing", "boil", "melt"]}}
    results = [bench_env(name, kwargs.get(name, {}), args) for name in args.envs]
    print("| env | model | envs | queued turns/s | env steps/s | mean prompt tok | generate s | env s | teacher s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['env']} | {r['size']} | {r['num_envs']} | {r['turns_per_s']:.1f} | {r['env_steps_per_s']:.1f} "
              f"| {r['mean_prompt_tokens']:.0f} | {r['generate_s']:.2f} | {r['env_s']:.2f} "
              f"| {r['teacher_score_s']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
