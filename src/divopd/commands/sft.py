"""``divopd sft``: behaviour cloning on an environment's expert trajectories — the tiny teacher for CPU runs, and the
students' warm start. Each expert step becomes one example whose prompt is built exactly as the explorer builds it and
whose response is the action + eos; the model (a fresh tiny one, or ``--init``) is trained, saved with ``sft.json`` and
evaluated greedily on ``--eval-split``. docs/guides/own-model.md builds a teacher and a student for an own environment.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from divopd.errors import ConfigError, UsageError, check_model_folder, check_tokenizer_folder, describe_validation_error

__all__ = ["EXPERTS", "add_arguments", "collect_gold_examples", "epsilon_move", "miss_move", "run"]

#: ``--expert``: whose trajectories are cloned. ``gold``: the environment's gold path; ``explore``: an observable-state
#: expert that labels any state, TextWorld-Express *coin* (the search of :mod:`divopd.explore.envs.coin_expert`) and
#: *twc* (the put-away rule of :mod:`divopd.explore.envs.twc_expert`).
EXPERTS = ("gold", "explore")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="twx",
                        help="environment: a registry name (twx, scienceworld, tiny, webshop-offline, ...) or the "
                        "import path module:Class of an Env subclass of your own (e.g. mypkg.envs:MyEnv; the module "
                        "must be importable: installed, or on PYTHONPATH)")
    parser.add_argument("--env-kwargs", default="{}", help='JSON constructor arguments, e.g. \'{"game": "coin"}\'')
    parser.add_argument("--out", required=True, help="output folder (HF model + tokenizer + sft.json)")
    parser.add_argument("--init", default=None, help="start from this HF model folder instead of a fresh tiny model")
    parser.add_argument("--size", default="1m",
                        help="tiny model size when --init is not given (0.2m, 0.5m, 1m, 5m, 20m)")
    parser.add_argument("--arch", default="llama", choices=["llama", "qwen2"], help="tiny model architecture")
    parser.add_argument("--tokenizer", default="word", choices=["word", "bpe"], help="tiny tokenizer kind")
    parser.add_argument("--tokenizer-from", default=None,
                        help="reuse the tokenizer of this HF folder (a student must share its teacher's vocabulary)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--train-tasks", type=int, default=400, help="gold trajectories from this many train tasks")
    parser.add_argument("--expert", default="gold", choices=EXPERTS,
                        help="trajectories to clone: the env's gold paths, or (twx coin and twc only) an "
                        "observable-state expert: on coin a search that takes the coin when visible and otherwise "
                        "visits unvisited rooms; on twc take/open/put towards the gold path's goal from any state")
    parser.add_argument("--expert-max-steps", type=int, default=30, help="step limit of --expert explore episodes")
    parser.add_argument("--expert-noise", type=float, default=0.0,
                        help="--expert explore only: at each step, with this probability, execute a random action "
                        "(a listed one, or on coin a move that may not exist) while the record keeps the expert's "
                        "label, so the clone also sees, and recovers from, states off the expert's path (DART-style)")
    parser.add_argument("--expert-epsilon", type=float, default=0.0,
                        help="--expert explore on coin only: at each step where the expert moves, with this "
                        "probability the executed and the recorded action is a random listed move instead, so the "
                        "clone is a weaker searcher that still takes the coin whenever it sees it")
    parser.add_argument("--expert-miss", type=float, default=0.0,
                        help="--expert explore on TextWorld-Express coin only: at each step where the expert takes the "
                        "coin, with this probability the executed and the recorded action is a random listed move "
                        "instead, so the clone walks past the coin it sees (its mistakes sit on one turn per visit)")
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out episodes for the success rate")
    parser.add_argument("--eval-split", default="dev", help="held-out split (dev or test)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=20, help="step limit of evaluation episodes")
    parser.add_argument("--num-envs", type=int, default=8, help="env instances for evaluation (lockstep batch)")
    parser.add_argument("--prompt", default="{}",
                        help='JSON PromptConfig fields (must match the explorer), e.g. {"max_prompt_tokens": 768}')
    parser.add_argument("--threads", type=int, default=1, help="torch threads (keep 1 beside other jobs)")


#: What ``--expert-noise`` may execute besides the listed actions, per game. coin: the four moves exist in no room all
#: at once, so an invalid move (the student's usual mistake) is among the perturbations. twc: the valid actions only.
NOISE_ACTIONS: dict[str, tuple[str, ...]] = {
    "coin": ("move north", "move south", "move east", "move west", "take coin"),
    "twc": (),
}
#: The TextWorld-Express games ``--expert explore`` knows (:mod:`divopd.explore.envs.coin_expert`,
#: :mod:`divopd.explore.envs.twc_expert`).
EXPLORE_GAMES = tuple(NOISE_ACTIONS)


def _expert_policy(env: Any, task: str, expert: str, game: str,
                   max_steps: int) -> tuple[int, Callable[[int, str, list[tuple[str, str]], list[str]], str]] | None:
    """One task's expert as ``(step limit, act(step, first observation, history, valid actions))``; ``None`` when the
    gold path it needs is empty. ``gold`` replays the gold path; ``explore`` is the game's observable-state expert."""
    from divopd.explore.envs.coin_expert import coin_explorer_action
    from divopd.explore.envs.twc_expert import putaway_goal, twc_putaway_action

    if expert == "explore" and game != "twc":
        return max_steps, lambda i, first, history, valid: coin_explorer_action(first, history, valid)
    gold = env.gold_actions(task)
    if not gold:
        return None
    if expert == "gold":
        return len(gold), lambda i, first, history, valid: gold[i]
    goal = putaway_goal(gold)
    return max_steps, lambda i, first, history, valid: twc_putaway_action(goal, valid)


def collect_gold_examples(env: Any, tasks: list[str], *, expert: str = "gold",
                          max_steps: int = 30, noise: float = 0.0, seed: int = 0,
                          game: str = "coin", epsilon: float = 0.0,
                          miss: float = 0.0) -> tuple[list[dict[str, Any]], int]:
    """Play each task's expert trajectory (:func:`_expert_policy`); returns (one record per step: the prompt's parts
    and the action, for any tokenizer to encode; the number of tasks whose trajectory failed). ``noise`` executes a
    random action (valid, or of the game's :data:`NOISE_ACTIONS`) while the record keeps the expert's label;
    ``epsilon`` (:func:`epsilon_move`) and ``miss`` (:func:`miss_move`) change both; with any of them every episode's
    records are kept. All draws come from one generator seeded by ``seed`` (a zero probability draws nothing)."""
    import random

    rng = random.Random(seed)
    records, failed = [], 0
    for task in tasks:
        policy = _expert_policy(env, task, expert, game, max_steps)
        if policy is None:
            failed += 1
            continue
        n_steps, act = policy
        first = env.reset(task)
        history: list[tuple[str, str]] = []
        steps = []
        info: dict[str, Any] = {}
        for i in range(n_steps):
            valid = env.valid_actions()
            action = act(i, first, history, valid)
            if epsilon:
                action = epsilon_move(action, valid, epsilon, rng)
            if miss:
                action = miss_move(action, valid, miss, rng)
            steps.append({"first": first, "history": list(history), "valid": valid, "action": action})
            if noise and rng.random() < noise:
                action = rng.choice(sorted(set(valid) | set(NOISE_ACTIONS.get(game, ()))))
            obs, _, done, info = env.step(action)
            history.append((action, obs))
            if done:
                break
        if info.get("success") or noise or epsilon or miss:
            records.extend(steps)
        failed += not info.get("success")
    return records, failed


def epsilon_move(action: str, valid: list[str], epsilon: float, rng: Any) -> str:
    """The epsilon-greedy searcher's action: a move of the expert may become a random listed move (the same one too)."""
    return _random_move_instead(action, valid, epsilon, rng, swap=action.startswith("move "))


def miss_move(action: str, valid: list[str], miss: float, rng: Any) -> str:
    """The coin-missing searcher's action: the expert's ``take coin`` may become a random listed move."""
    return _random_move_instead(action, valid, miss, rng, swap=action == "take coin")


def _random_move_instead(action: str, valid: list[str], p: float, rng: Any, swap: bool) -> str:
    """``action``, or with probability ``p`` a uniformly random listed move when ``swap`` holds and a move is listed.
    The coin is drawn only then (so a zero probability or a kept action draws nothing), then the move."""
    moves = sorted(a for a in valid if a.startswith("move "))
    if swap and moves and rng.random() < p:
        return rng.choice(moves)
    return action


def _texts(records: list[dict[str, Any]], prompt_config: Any) -> list[str]:
    from divopd.explore.prompting import build_messages

    texts = [prompt_config.system, prompt_config.valid_actions_prefix]
    for r in records:
        texts.extend(m["content"] for m in build_messages(prompt_config, r["first"], r["history"], r["valid"]))
        texts.append(r["action"])
    return texts


def _json_object(flag: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: not valid JSON ({exc.msg} at column {exc.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: expected a JSON object like '{{\"key\": value}}', got {text!r}")
    return value


def check_arguments(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """Validate the arguments before anything heavy runs; returns ``(env_kwargs, prompt_config)``. Raises
    :class:`~divopd.errors.UsageError` naming the flag."""
    from pydantic import ValidationError

    from divopd.explore.envs import SPLITS, env_class
    from divopd.explore.prompting import PromptConfig

    try:  # a registry name or an import path module:Class, imported here (one line on failure)
        env_class(args.env)
    except ConfigError as exc:
        raise UsageError(f"--env: {str(exc).removeprefix('explorer.env: ')}") from exc
    env_kwargs = _json_object("--env-kwargs", args.env_kwargs)
    try:
        prompt_config = PromptConfig(**_json_object("--prompt", args.prompt))
    except ValidationError as exc:
        raise UsageError(f"--prompt: {describe_validation_error(exc)}") from exc
    for flag, value in (("--train-tasks", args.train_tasks), ("--eval-tasks", args.eval_tasks),
                        ("--epochs", args.epochs), ("--batch-size", args.batch_size), ("--max-steps", args.max_steps),
                        ("--num-envs", args.num_envs), ("--threads", args.threads), ("--vocab-size", args.vocab_size)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.expert == "explore" and (args.env != "twx" or env_kwargs.get("game", "coin") not in EXPLORE_GAMES):
        raise UsageError(f"--expert explore: only for TextWorld-Express {' or '.join(EXPLORE_GAMES)} "
                         f"(--env twx, --env-kwargs game)")
    if args.expert_max_steps < 1:
        raise UsageError(f"--expert-max-steps must be at least 1, got {args.expert_max_steps}")
    if not 0.0 <= args.expert_noise < 1.0:
        raise UsageError(f"--expert-noise must be in [0, 1), got {args.expert_noise}")
    if args.expert_noise and args.expert != "explore":
        raise UsageError("--expert-noise: only with --expert explore (a gold path cannot label off-path states)")
    for flag, p in (("--expert-epsilon", args.expert_epsilon), ("--expert-miss", args.expert_miss)):
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"{flag} must be in [0, 1], got {p}")
        if p and (args.expert != "explore" or env_kwargs.get("game", "coin") != "coin"):
            raise UsageError(f"{flag}: only with --expert explore on TextWorld-Express coin")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.eval_split not in SPLITS:
        raise UsageError(f"--eval-split: unknown split {args.eval_split!r}; expected one of {', '.join(SPLITS)}")
    if args.init:
        check_model_folder(args.init, "--init")
    else:
        from divopd.models.tiny import SIZES

        if args.size not in SIZES:
            raise UsageError(f"--size: unknown tiny model size {args.size!r}; expected one of {', '.join(SIZES)}")
        if args.tokenizer_from:
            check_tokenizer_folder(args.tokenizer_from, "--tokenizer-from")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: a file, not a folder")
    return env_kwargs, prompt_config


def run(args: argparse.Namespace) -> int:
    env_kwargs, prompt_config = check_arguments(args)

    import torch

    from divopd.explore.envs import make_env
    from divopd.explore.explorer import Explorer, ExplorerConfig
    from divopd.explore.prompting import encode_action, encode_prompt
    from divopd.learn.sft import train_sft
    from divopd.models import load_model, load_tokenizer
    from divopd.models.tiny import build_model, build_tokenizer

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    t0 = time.perf_counter()

    # 1. gold trajectories
    env = make_env(args.env, **env_kwargs)
    try:
        tasks = env.tasks("train")[: args.train_tasks]
        records, failed = collect_gold_examples(env, tasks, expert=args.expert,
                                                max_steps=args.expert_max_steps, noise=args.expert_noise,
                                                seed=args.seed, game=env_kwargs.get("game", "coin"),
                                                epsilon=args.expert_epsilon, miss=args.expert_miss)
    finally:
        env.close()
    if not records:
        print(f"divopd sft: no gold trajectory succeeded on {args.env} ({failed} failed)")
        return 1
    print(f"{args.expert}: {len(records)} steps from {len(tasks) - failed} tasks ({failed} failed) "
          f"in {time.perf_counter() - t0:.1f}s")

    # 2. tokenizer + model
    if args.init:
        model, tokenizer = load_model(args.init)
    else:
        tokenizer = load_tokenizer(args.tokenizer_from) if args.tokenizer_from else build_tokenizer(
            _texts(records, prompt_config), kind=args.tokenizer, vocab_size=args.vocab_size)
        model = build_model(tokenizer, size=args.size, arch=args.arch, seed=args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    examples, truncated = [], 0
    for r in records:
        enc = encode_prompt(tokenizer, prompt_config, r["first"], r["history"], r["valid"])
        truncated += enc.truncated
        examples.append((enc.ids, encode_action(tokenizer, r["action"])))
    mean_prompt = sum(len(p) for p, _ in examples) / len(examples)
    print(f"model: {n_params / 1e6:.2f}M params, vocab {len(tokenizer)}; {len(examples)} examples, "
          f"mean prompt {mean_prompt:.0f} tokens, {truncated} truncated")

    # 3. train
    result = train_sft(model, tokenizer, examples, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                       seed=args.seed, log_every=max(1, len(examples) // args.batch_size),
                       log_fn=lambda m: print(f"  epoch {m['sft/epoch']:.0f} step {m['sft/step']:.0f} "
                                              f"loss {m['sft/loss']:.4f}"))
    model.eval()
    print(f"trained: {result['steps']} steps, final loss {result['final_loss']:.4f}, {result['seconds']:.0f}s")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

    # 4. held-out success (greedy, student-only)
    config = ExplorerConfig(env=args.env, env_kwargs=env_kwargs, num_envs=args.num_envs, eval_split=args.eval_split,
                            eval_tasks=args.eval_tasks, max_steps=args.max_steps, prompt=prompt_config)
    with Explorer(config, model, tokenizer, seed=args.seed) as explorer:
        metrics = explorer.evaluate(greedy=True)
    print(f"held-out {args.eval_split}: success rate {metrics['eval/success_rate']:.3f}, mean score "
          f"{metrics['eval/mean_score']:.3f}, mean steps {metrics['eval/mean_steps']:.1f} "
          f"({metrics['eval/episodes']:.0f} episodes, {metrics['eval/seconds']:.0f}s)")
    summary = {
        "env": args.env, "env_kwargs": env_kwargs, "prompt": prompt_config.model_dump(), "params": n_params,
        "expert": args.expert, "expert_noise": args.expert_noise,
        "expert_epsilon": args.expert_epsilon, "expert_miss": args.expert_miss, "gold_steps": len(records),
        "gold_tasks": len(tasks) - failed, "gold_failed": failed,
        "truncated_examples": truncated, "sft": {k: v for k, v in result.items() if k != "epoch_losses"},
        "epoch_losses": result.get("epoch_losses"), "eval": metrics, "seconds": time.perf_counter() - t0,
        "args": vars(args) | {"_run": None},
    }
    (out / "sft.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"saved {out} in {summary['seconds']:.0f}s total")
    return 0
