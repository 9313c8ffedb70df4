"""Teacher scoring of a finished rollout's student turns: one batched no-grad pass (:func:`score_responses`), retried
turn by turn when it fails so that one bad turn cannot unscore its rollout (:func:`teacher_scores`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["cut_prompt_logprobs", "score_responses", "teacher_scores"]

log = logging.getLogger(__name__)

ScoreCall = Callable[[list[list[int]], list[list[int]]], list[tuple[np.ndarray, Any]]]


def score_responses(teacher: Any, prompts: list[list[int]], responses: list[list[int]], *, topk: int, pad_id: int,
                    max_tokens_per_batch: int) -> list[tuple[np.ndarray, Any]]:
    """Per turn, the teacher's log probs of the response tokens and, with ``topk`` > 0, its (ids, logprobs) top-k."""
    from divopd.models.scoring import response_logprobs

    out = response_logprobs(teacher, prompts, responses, topk=topk, pad_id=pad_id,
                            max_tokens_per_batch=max_tokens_per_batch)
    if topk > 0:
        return [(s.logprobs, (s.topk_ids, s.topk_logprobs)) for s in out]
    return [(lp, None) for lp in out]


def cut_prompt_logprobs(entries: Sequence[Any] | None, n_prompt: int, response: Sequence[int], topk: int,
                        read: Callable[[Any], Mapping[int, tuple[float, int | None]]]) -> tuple[np.ndarray, Any]:
    """Cut an engine's prompt log probs of prompt+response (one entry per position, ``None`` or empty without
    context) to the response positions: ``(logprobs [L] float32, None)``, or with ``topk`` > 0 ``(logprobs, (ids
    [L, k] int32, logprobs [L, k] float32))``, ranks 1..k, most likely first (NaN / id 0 where a rank is missing).
    ``read(entry)`` gives ``{token id: (logprob, rank)}`` of one entry (a vLLM engine's objects, a server's JSON). A
    response token absent from its entry raises ``ValueError``."""
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
    return lps, ((ids, tlp) if topk else None)


def teacher_scores(score_call: ScoreCall, prompts: list[list[int]], responses: list[list[int]],
                   stats: dict[str, float], explorer_id: int) -> tuple[list, list]:
    """Teacher log probs per turn (``None`` = unscored) and the top-k (ids, logprobs) per turn (``None``: none kept).

    One batched ``score_call``; if it fails, each turn is retried alone. Counts ``teacher_failures``,
    ``time/teacher_score`` and ``teacher_masked_tokens`` (scored positions whose log prob is not finite: not
    teacher-valid) in ``stats``. A result whose length differs from its response counts as unscored.
    """
    n = len(prompts)
    t0 = time.perf_counter()
    try:
        results = score_call(prompts, responses)
    except Exception as exc:  # a teacher failure never drops turns: retry one by one, else leave unscored
        log.warning("explorer %s: teacher scoring failed for %d turns (%s); retrying one by one",
                    explorer_id, n, exc)
        stats["teacher_failures"] += 1
        results = []
        for p, r in zip(prompts, responses, strict=True):
            try:
                results.append(score_call([p], [r])[0])
            except Exception as exc_one:
                log.warning("explorer %s: teacher scoring failed for one turn: %s", explorer_id, exc_one)
                results.append(None)
    stats["time/teacher_score"] += time.perf_counter() - t0
    lps, topk = [], []
    for r, resp in zip(results, responses, strict=True):
        if r is None or len(r[0]) != len(resp):
            lps.append(None)
            topk.append(None)
        else:
            lps.append(r[0])
            topk.append(r[1])
            stats["teacher_masked_tokens"] = stats.get("teacher_masked_tokens", 0) + \
                int(np.count_nonzero(~np.isfinite(np.asarray(r[0], dtype=np.float64))))
    return lps, topk


def make_score_call(teacher: Any, *, topk: int) -> ScoreCall:
    """The explorer's batched teacher call: ``teacher.score_turns`` (a :class:`~divopd.explore.teacher.Teacher`)
    with the run's ``topk``."""
    return lambda prompts, responses: teacher.score_turns(prompts, responses, topk=topk)
