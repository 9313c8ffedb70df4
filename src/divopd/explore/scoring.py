"""Teacher scoring of student turns: one batched call per rollout or round, retried turn by turn when it fails so that
one bad turn cannot unscore its rollout (:func:`teacher_scores`), and the cut of an engine's prompt log probs to the
response positions that vLLM and a teacher server share (:func:`cut_prompt_logprobs`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from divopd.experience.turn import ResponseScores

__all__ = ["ResponseScores", "cut_prompt_logprobs", "teacher_scores"]

log = logging.getLogger(__name__)

ScoreCall = Callable[[list[list[int]], list[list[int]]], list[ResponseScores]]


def cut_prompt_logprobs(entries: Sequence[Any] | None, n_prompt: int, response: Sequence[int], topk: int,
                        read: Callable[[Any], Mapping[int, tuple[float, int | None]]]) -> ResponseScores:
    """Cut an engine's prompt log probs of prompt+response (one entry per position, ``None`` or empty without
    context) to the response positions; with ``topk`` > 0 the top-k too (ids int32, ranks 1..k, most likely first;
    NaN / id 0 where a rank is missing). ``read(entry)`` gives ``{token id: (logprob, rank)}`` of one entry (a vLLM
    engine's objects, a server's JSON). A response token absent from its entry raises ``ValueError``."""
    lps = np.full(len(response), np.nan, dtype=np.float32)
    ids = np.zeros((len(response), topk), dtype=np.int32)
    tlp = np.full((len(response), topk), np.nan, dtype=np.float32)
    entries = entries or []
    for i, tok in enumerate(response):
        pos = n_prompt + i
        entry = read(entries[pos]) if pos < len(entries) and entries[pos] else None
        if not entry:
            continue  # position 0 of the sequence has no context
        if int(tok) not in entry:
            raise ValueError(f"teacher: no log prob for response token {tok} at position {pos}")
        lps[i] = entry[int(tok)][0]
        if topk:
            ranked = sorted((rank, t, lp) for t, (lp, rank) in entry.items() if rank is not None and rank <= topk)
            for j, (_, t, lp) in enumerate(ranked[:topk]):
                ids[i, j], tlp[i, j] = t, lp
    return ResponseScores(lps, ids, tlp) if topk else ResponseScores(lps)


def teacher_scores(score_call: ScoreCall, prompts: list[list[int]], responses: list[list[int]],
                   stats: dict[str, float], explorer_id: int) -> list[ResponseScores | None]:
    """The teacher's scores per turn (``None``: unscored, also for a result whose length differs from its response):
    one batched ``score_call``, each turn retried alone if it fails. Counts ``teacher_failures``,
    ``time/teacher_score`` and ``teacher_masked_tokens`` (positions whose log prob is not finite) in ``stats``."""
    t0 = time.perf_counter()
    try:
        results: list[ResponseScores | None] = list(score_call(prompts, responses))
    except Exception as exc:  # a teacher failure never drops turns: retry one by one, else leave unscored
        log.warning("explorer %s: teacher scoring failed for %d turns (%s); retrying one by one",
                    explorer_id, len(prompts), exc)
        stats["teacher_failures"] += 1
        results = []
        for p, r in zip(prompts, responses, strict=True):
            try:
                results.append(score_call([p], [r])[0])
            except Exception as exc_one:
                log.warning("explorer %s: teacher scoring failed for one turn: %s", explorer_id, exc_one)
                results.append(None)
    stats["time/teacher_score"] += time.perf_counter() - t0
    out = [s if s is not None and len(s.logprobs) == len(r) else None for s, r in zip(results, responses, strict=True)]
    masked = sum(np.count_nonzero(~np.isfinite(np.asarray(s.logprobs, dtype=np.float64))) for s in out if s is not None)
    stats["teacher_masked_tokens"] = stats.get("teacher_masked_tokens", 0) + int(masked)
    return out
