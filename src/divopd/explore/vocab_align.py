"""Cross-tokenizer teachers (our reading; the paper does not specify it): the teacher scores the student's turn under
its own tokenization and its token log probs are mapped onto the student's tokens by character spans. The rule, steps
1-5 (segments, clean ends, aligned chunks, split, not mappable): docs/concepts/teacher-vocabularies.md."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from divopd.explore.generation import Generation
from divopd.explore.teacher import ResponseScores, Teacher

__all__ = ["CrossTokenizerTeacher", "TurnPlan", "Translator", "adds_dummy_prefix", "clean_ends", "map_logprobs",
           "offset_ends", "plan_coverage", "plan_turn", "special_anchors"]

_CONTEXT = 4  # ids of left context when decoding a prefix (a leading space must not depend on the cut)


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _text_after(tokenizer: Any, ids: Sequence[int], context: Sequence[int]) -> str:
    """The text of ``ids`` decoded after ``context`` (a leading space kept)."""
    ctx = list(context)[-_CONTEXT:]
    head, full = _decode(tokenizer, ctx), _decode(tokenizer, ctx + list(ids))
    return full[len(head):] if full.startswith(head) else _decode(tokenizer, ids)


def clean_ends(tokenizer: Any, ids: Sequence[int], text: str, context: Sequence[int] = ()) -> list[int | None]:
    """Per token, the character of ``text`` where it ends cleanly (the ids up to it decode to ``text[:c]``, after
    ``context``), else ``None`` (not recoverable on its own, or the decoding left ``text``)."""
    pieces = (_text_after(tokenizer, ids[:k], context) for k in range(1, len(ids) + 1))
    return [len(piece) if text.startswith(piece) else None for piece in pieces]


def _squeeze(text: str) -> str:
    return "".join(text.split())


def offset_ends(tokenizer: Any, ids: Sequence[int], offsets: Sequence[tuple[int, int]],
                text: str) -> tuple[list[int | None], list[bool]]:
    """Per token of ``tokenizer``'s encoding of ``text`` (``offsets``: each token's span in ``text``), its clean end
    (step 2; whitespace aside) or ``None``, and whether it is *lost* (an ``<unk>`` for text it cannot spell)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    unk_text = _squeeze(_decode(tokenizer, [unk])) if unk is not None else ""
    shown, at = "", 0  # the text up to character ``at`` as the decoding shows it (unknown spans as <unk>), squeezed
    ends: list[int | None] = []
    lost: list[bool] = []
    for k, (start, end) in enumerate(offsets):
        gone = unk is not None and int(ids[k]) == unk and at <= start < end and _squeeze(text[start:end]) != unk_text
        if gone:
            shown, at = shown + _squeeze(text[at:start]) + unk_text, end
        same = _squeeze(_decode(tokenizer, ids[:k + 1])) == shown + _squeeze(text[at:max(end, at)])
        ends.append(end if same and end > 0 else None)
        lost.append(gone)
    return ends, lost


def adds_dummy_prefix(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` starts every text with a word boundary (a SentencePiece dummy prefix, or a decoder that
    joins words with spaces): two texts encoded apart decode, joined, with a space between them."""
    try:
        a, b = (tokenizer.encode(t, add_special_tokens=False) for t in ("a", "b"))
        return _decode(tokenizer, list(a) + list(b)) == _decode(tokenizer, a) + " " + _decode(tokenizer, b)
    except Exception:  # noqa: BLE001 (a tokenizer that cannot encode the probe: no prefix assumed)
        return False


def special_anchors(source: Any, target: Any) -> dict[int, int]:
    """``{source special id: target id}``: ``eos`` and ``bos`` by meaning, every other special token by its string."""
    vocab = target.get_vocab()
    anchors: dict[int, int] = {}
    for sid in getattr(source, "all_special_ids", []):
        token = source.convert_ids_to_tokens(int(sid))
        if token in vocab:
            anchors[int(sid)] = int(vocab[token])
    for name in ("eos_token_id", "bos_token_id"):
        s, t = getattr(source, name, None), getattr(target, name, None)
        if s is not None and t is not None:
            anchors[int(s)] = int(t)
    return anchors


def _chunks(student_ends: list[int | None], teacher_ends: list[int | None],
            length: int) -> tuple[list[int], list[int], int]:
    """The chunk index of every student and teacher token (chunk ``n_chunks`` = past the last shared cut)."""
    shared = sorted({e for e in student_ends if e} & {e for e in teacher_ends if e})

    def index(ends: list[int | None], last: int | None) -> list[int]:
        out, nxt = [0] * len(ends), last
        for k in range(len(ends) - 1, -1, -1):  # a token without a clean end is glued to the next clean one
            nxt = ends[k] if ends[k] is not None else nxt
            out[k] = len(shared) if nxt is None else bisect.bisect_left(shared, nxt)
        return out

    return index(student_ends, length), index(teacher_ends, None), len(shared)


@dataclass
class _Segment:
    student: list[int]  # student ids of the segment (positions in the response, in order)
    teacher: list[int]  # teacher ids sent for it
    student_chunk: list[int]  # chunk index per student token (within the segment)
    teacher_chunk: list[int]
    n_chunks: int
    lost: list[int] = field(default_factory=list)  # chunks that hold a lost teacher token (an unknown word)


@dataclass
class TurnPlan:
    """One turn translated for the teacher: its prompt and response ids and how to map the scores back."""

    teacher_prompt: list[int]
    teacher_response: list[int]
    segments: list[_Segment]


class Translator:
    """Token ids of one tokenizer (``source``) as ids of another (``target``), through text, anchored on the special
    tokens both have (:func:`special_anchors`)."""

    def __init__(self, source: Any, target: Any) -> None:
        self.source, self.target = source, target
        self.anchors = special_anchors(source, target)
        bos = getattr(target, "bos_token_id", None)
        lead = target("", add_special_tokens=True)["input_ids"] if bos is not None else []
        self.lead = [int(bos)] if bos is not None and list(lead)[:1] == [bos] else []
        self.dummy_prefix = adds_dummy_prefix(target)

    def split(self, ids: Sequence[int]) -> list[tuple[bool, list[int]]]:
        """``ids`` as ``(is_anchor, ids)`` runs: each anchor alone, other ids in maximal runs."""
        runs: list[tuple[bool, list[int]]] = []
        for i in (int(x) for x in ids):
            if i in self.anchors:
                runs.append((True, [i]))
            elif runs and not runs[-1][0]:
                runs[-1][1].append(i)
            else:
                runs.append((False, [i]))
        return runs

    def text(self, ids: Sequence[int], context: Sequence[int]) -> str:
        """The text of ``ids`` after ``context`` (the source's decoding, a leading space kept)."""
        return _text_after(self.source, ids, context)

    def encode_ends(self, text: str) -> tuple[list[int], list[int | None] | None, list[bool]]:
        """The target's ids of ``text`` as a text of its own (a leading space is the dummy prefix where the target adds
        one); per id its clean end (:func:`offset_ends`; the whole list ``None`` without offsets: a slow tokenizer,
        the caller uses :func:`clean_ends`), and whether it is lost."""
        if not text:
            return [], [], []
        cut = 1 if self.dummy_prefix and text[0] == " " else 0  # the prefix the target adds stands for this space
        body = text[cut:]
        if not body:  # a lone space: no word for a prefix to start
            cut, body = 0, text
        try:
            enc = self.target(body, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, TypeError, ValueError):
            ids = [int(t) for t in self.target.encode(body, add_special_tokens=False)]
            return ids, None, [False] * len(ids)  # clean_ends: no cut after an unknown token, nothing to mark
        ids = [int(t) for t in enc["input_ids"]]
        spans = [(int(a) + cut, int(e) + cut) for a, e in enc["offset_mapping"]]
        return ids, *offset_ends(self.target, ids, spans, text)

    def translate(self, ids: Sequence[int], *, lead: bool = True) -> list[int]:
        """All of ``ids`` in the target's ids (with the target's leading ``bos`` when it adds one and ``lead``)."""
        out: list[int] = []
        done: list[int] = []
        for anchor, run in self.split(ids):
            out.extend([self.anchors[run[0]]] if anchor else self.encode_ends(self.text(run, done))[0])
            done.extend(run)
        if lead and self.lead and out[:1] != self.lead:
            out = self.lead + out
        return out


def plan_turn(tr: Translator, prompt: Sequence[int], response: Sequence[int]) -> TurnPlan:
    """The teacher's ids of one turn and, for every response segment, its aligned chunks (steps 1-3)."""
    teacher_prompt = tr.translate(prompt)
    done, t_done = [int(x) for x in prompt], list(teacher_prompt)
    segments, teacher_response = [], []
    for anchor, run in tr.split(response):
        if anchor:
            t_ids = [tr.anchors[run[0]]]
            seg = _Segment(run, t_ids, [0], [0], 1)
        else:
            text = tr.text(run, done)
            t_ids, t_ends, t_lost = tr.encode_ends(text)
            s_ends = clean_ends(tr.source, run, text, done)
            if t_ends is None:
                t_ends = clean_ends(tr.target, t_ids, text, t_done)
            s_chunk, t_chunk, n = _chunks(s_ends, t_ends, len(text))
            lost = sorted({c for c, gone in zip(t_chunk, t_lost, strict=True) if gone})
            seg = _Segment(run, t_ids, s_chunk, t_chunk, n, lost)
        segments.append(seg)
        teacher_response.extend(t_ids)
        done.extend(run)
        t_done.extend(t_ids)
    return TurnPlan(teacher_prompt, teacher_response, segments)


def map_logprobs(plan: TurnPlan, teacher_logprobs: np.ndarray) -> np.ndarray:
    """Per student response token, its share of its chunk's teacher log prob (NaN where not mappable)."""
    lps = np.asarray(teacher_logprobs, dtype=np.float64)
    if len(lps) != len(plan.teacher_response):
        raise ValueError(f"teacher returned {len(lps)} log probs for {len(plan.teacher_response)} response tokens")
    out: list[np.ndarray] = []
    at = 0
    for seg in plan.segments:
        seg_lps = lps[at:at + len(seg.teacher)]
        at += len(seg.teacher)
        total = np.zeros(seg.n_chunks + 1)
        np.add.at(total, np.asarray(seg.teacher_chunk, dtype=np.int64), seg_lps)
        has_teacher = np.bincount(np.asarray(seg.teacher_chunk, dtype=np.int64), minlength=seg.n_chunks + 1) > 0
        s_chunk = np.asarray(seg.student_chunk, dtype=np.int64)
        count = np.bincount(s_chunk, minlength=seg.n_chunks + 1)
        share = np.where(has_teacher, total / np.maximum(count, 1), np.nan)
        share[seg.n_chunks] = np.nan  # past the teacher's last clean cut: not mappable
        share[np.asarray(seg.lost, dtype=np.int64)] = np.nan  # the teacher's <unk>: not the text's probability
        out.append(share[s_chunk])
    return (np.concatenate(out) if out else np.zeros(0)).astype(np.float32)


def plan_coverage(plan: TurnPlan) -> tuple[int, int]:
    """``(mappable, total)`` student response tokens of ``plan`` (no teacher forward: the tokenizations decide)."""
    mapped = map_logprobs(plan, np.zeros(len(plan.teacher_response), dtype=np.float32))
    return int(np.isfinite(mapped).sum()), len(mapped)


class CrossTokenizerTeacher:
    """A teacher with its own tokenizer as a Teacher of the student's ids: each turn translated (:func:`plan_turn`),
    scored, and its log probs mapped back (:func:`map_logprobs`)."""

    speaks_student_ids = True

    def __init__(self, inner: Teacher, student_tokenizer: Any, teacher_tokenizer: Any) -> None:
        self.inner, self.student_tokenizer, self.tokenizer = inner, student_tokenizer, teacher_tokenizer
        self.to_teacher = Translator(student_tokenizer, teacher_tokenizer)
        self.to_student = Translator(teacher_tokenizer, student_tokenizer)

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[ResponseScores]:
        if topk > 0:
            raise ValueError("a cross-tokenizer teacher has no top-k in the student's vocabulary "
                             "(learner.estimator: topk needs a shared vocabulary)")
        plans = [plan_turn(self.to_teacher, p, r) for p, r in zip(prompts, responses, strict=True)]
        scored = [i for i, pl in enumerate(plans) if pl.teacher_response]
        results = self.inner.score_turns([plans[i].teacher_prompt for i in scored],
                                         [plans[i].teacher_response for i in scored], topk=0) if scored else []
        by_turn = dict(zip(scored, results, strict=True))
        return [ResponseScores(map_logprobs(plan, by_turn[i].logprobs if i in by_turn else np.zeros(0, np.float32)))
                for i, plan in enumerate(plans)]

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]:
        """The teacher acts on its tokenization of the prompt; the student re-tokenizes its response (log probs NaN:
        none is the student's)."""
        t_prompts = [self.to_teacher.translate(p) for p in prompts]
        gens = self.inner.generate(t_prompts, greedy=greedy, temperature=temperature, max_new_tokens=max_new_tokens,
                                   seed=seed)
        student_ids = [self.to_student.translate(g.response_ids, lead=False) for g in gens]
        return [Generation(ids, np.full(len(ids), np.nan, dtype=np.float32), g.stopped)
                for ids, g in zip(student_ids, gens, strict=True)]
