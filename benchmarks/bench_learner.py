"""Learner step time vs a bare forward+backward of the same model on the same tokens (issue "learner": target ≤ 1.10×).

For each tiny model size, one synthetic batch of multi-turn rows (prompts grow with the turn index, as histories do;
short responses) is timed four ways, interleaved, median over repeats:

* ``step[packed]`` / ``step[padded]`` — ``Learner.step`` (rows → inputs, forward, θ_old, OPD loss, backward, clip,
  AdamW).
* ``bare[same]`` — forward + backward of the same model on the learner's own inputs (same layout, logits only at
  response positions, loss = −Σ log π(y)), no optimizer: the cost floor of the learner's step.
* ``bare[hf-padded]`` — the textbook HF pass: right-padded batch, all logits, cross-entropy on response tokens.

``in-step overhead`` = (step seconds − its own forward+loss+backward seconds) ÷ the latter, read from the learner's
``learner/time_*`` metrics of the same steps: robust to machine load, unlike ratios of separate timings.

Usage: ``.venv/bin/python benchmarks/bench_learner.py [--sizes 1m 5m] [--rows 64] [--threads 1] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from divopd import Turn
from divopd.learn.learner import Learner, LearnerConfig
from divopd.models.packing import gather_logprobs, pack_sequences, selected_logits
from divopd.models.tiny import build_model, build_tokenizer


def synthetic_turns(vocab: int, rows: int, seed: int = 0) -> list[Turn]:
    """Rows from rollouts of 8 turns: prompt = 40 + 25·turn ± 10 tokens, response 4–16 tokens, all teacher-scored."""
    rng = np.random.default_rng(seed)
    turns = []
    for i in range(rows):
        turn = i % 8
        p = int(40 + 25 * turn + rng.integers(-10, 11))
        r = int(rng.integers(4, 17))
        turns.append(Turn(f"r{i // 8}", turn, 0, rng.integers(6, vocab, size=p), rng.integers(6, vocab, size=r),
                          student_logprobs=-rng.random(r) * 3, teacher_logprobs=-rng.random(r) * 3))
    return turns


def bare_same(model: torch.nn.Module, turns: list[Turn], layout: str, pad_id: int) -> None:
    packed = pack_sequences([t.prompt_ids for t in turns], [t.response_ids for t in turns], layout=layout,
                            pad_id=pad_id)
    loss = -gather_logprobs(selected_logits(model, packed), packed.targets).sum()
    loss.backward()
    model.zero_grad(set_to_none=True)


def bare_hf_padded(model: torch.nn.Module, turns: list[Turn], pad_id: int) -> None:
    seqs = [np.concatenate([t.prompt_ids, t.response_ids]) for t in turns]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, t) in enumerate(zip(seqs, turns, strict=True)):
        ids[i, :len(s)] = torch.from_numpy(s.astype(np.int64))
        att[i, :len(s)] = 1
        labels[i, t.prompt_len:len(s)] = torch.from_numpy(t.response_ids.astype(np.int64))
    logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             labels[:, 1:].reshape(-1), ignore_index=-100)
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_size(size: str, tok, turns: list[Turn], repeats: int, device: str) -> str:
    """One Markdown table row for model ``size``."""
    model = build_model(tok, size, seed=0).to(device)
    learners = {lay: Learner(build_model(tok, size, seed=0), LearnerConfig(lr=1e-5, packing=lay, device=device), tok)
                for lay in ("packed", "padded")}
    pad = tok.pad_token_id
    steps: list[dict[str, float]] = []
    fns = {
        "step_packed": lambda: steps.append(learners["packed"].step(turns)),
        "step_padded": lambda: learners["padded"].step(turns),
        "bare_packed": lambda: bare_same(model, turns, "packed", pad),
        "bare_padded": lambda: bare_same(model, turns, "padded", pad),
        "bare_hf": lambda: bare_hf_padded(model, turns, pad),
    }
    for fn in fns.values():  # warm-up
        fn()
    steps.clear()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):  # interleaved, so load changes hit every variant alike
        for k, fn in fns.items():
            times[k] += timed(fn, 1)
    lo = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    # overhead measured inside the same steps: everything but forward+loss+backward, relative to it
    over = statistics.median((m["learner/compute_s"] - m["learner/time_forward_backward_s"])
                             / m["learner/time_forward_backward_s"] for m in steps)
    params = sum(p.numel() for p in model.parameters()) / 1e6

    def cell(k: str) -> str:
        return f"{lo[k]:.3f} / {med[k]:.3f}"

    def ratio(a: str, b: str) -> str:
        return f"{lo[a] / lo[b]:.2f}× / {med[a] / med[b]:.2f}×"

    return (f"| {size} | {params:.2f} M | {cell('step_packed')} | {cell('step_padded')} | {cell('bare_packed')} "
            f"| {cell('bare_padded')} | {cell('bare_hf')} | {ratio('step_packed', 'bare_packed')} "
            f"| {ratio('step_padded', 'bare_padded')} | +{100 * over:.1f}% |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1m", "5m"])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab-words", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = build_tokenizer([" ".join(f"w{i}" for i in range(args.vocab_words))], kind="word")
    turns = synthetic_turns(len(tok), args.rows)
    n_tok = sum(t.prompt_len + t.response_len for t in turns)
    print(f"# {args.rows} rows, {n_tok} tokens (prompt+response), vocab {len(tok)}, threads {args.threads}, "
          f"device {args.device}, {args.repeats} interleaved repeats (min / median seconds)")
    print("| model | params | step packed | step padded | bare same-input packed | bare same-input padded "
          "| bare HF padded | step/bare packed | step/bare padded | in-step overhead |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        print(bench_size(size, tok, turns, args.repeats, args.device), flush=True)


if __name__ == "__main__":
    main()
