"""Learner step time vs a bare forward+backward of the same model on the same tokens (issue "learner": target ≤ 1.10×).

For each tiny model size, one synthetic batch of multi-turn rows (prompts grow with the turn index, as histories do;
short responses) is timed four ways, interleaved, median over repeats:

* ``step[packed]`` / ``step[padded]`` — ``Learner.step`` (rows → inputs, forward, θ_old, OPD loss, backward, clip,
  AdamW).
* ``bare[same]`` — forward + backward of the same model on the learner's own inputs (same layout, logits only at
  response positions, loss = −Σ log π(y)), no optimizer: the cost floor of the learner's step.
* ``bare[hf-padded]`` — the textbook HF pass: right-padded batch, all logits, cross-entropy on response tokens.

Usage: ``.venv/bin/python benchmarks/bench_learner.py [--sizes 1m 5m] [--rows 64] [--threads 1] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from divopd import Turn
from divopd.learner import Learner, LearnerConfig
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
          f"device {args.device}, median of {args.repeats}")
    print("| model | params | step packed (s) | step padded (s) | bare same-input F+B (s) | bare HF padded F+B (s) "
          "| step/bare (packed) | step/bare (padded) | step packed / bare HF |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        model = build_model(tok, size, seed=0).to(args.device)
        learners = {lay: Learner(build_model(tok, size, seed=0), LearnerConfig(lr=1e-5, packing=lay,
                                                                                device=args.device), tok)
                    for lay in ("packed", "padded")}
        fns = {
            "step_packed": lambda lr=learners: lr["packed"].step(turns),
            "step_padded": lambda lr=learners: lr["padded"].step(turns),
            "bare_packed": lambda m=model: bare_same(m, turns, "packed", tok.pad_token_id),
            "bare_padded": lambda m=model: bare_same(m, turns, "padded", tok.pad_token_id),
            "bare_hf": lambda m=model: bare_hf_padded(m, turns, tok.pad_token_id),
        }
        for fn in fns.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.repeats):  # interleaved, so load changes hit every variant alike
            for k, fn in fns.items():
                times[k] += timed(fn, 1)
        med = {k: statistics.median(v) for k, v in times.items()}
        params = sum(p.numel() for p in model.parameters()) / 1e6
        bare_same_s = f"{med['bare_packed']:.3f} / {med['bare_padded']:.3f}"
        print(f"| {size} | {params:.2f} M | {med['step_packed']:.3f} | {med['step_padded']:.3f} | {bare_same_s} "
              f"| {med['bare_hf']:.3f} | {med['step_packed'] / med['bare_packed']:.2f}× "
              f"| {med['step_padded'] / med['bare_padded']:.2f}× | {med['step_packed'] / med['bare_hf']:.2f}× |")


if __name__ == "__main__":
    main()
