"""Teacher and student vocabularies: compared once at start (identical, extension or cross) and bridged by a
wrapper around any inner teacher (:func:`adapt_teacher`), so the explorer always speaks the student's token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from divopd.explore.generation import Generation
from divopd.explore.teacher import ResponseScores, Teacher
from divopd.explore.teacher_server import probe_text
from divopd.explore.vocab_align import CrossTokenizerTeacher, Translator, plan_coverage, plan_turn

__all__ = ["ExtensionTeacher", "PROBE_PROMPT", "VocabMatch", "adapt_teacher", "compare_vocabularies", "expand_ids",
           "probe_coverage", "student_ids_teacher"]

VocabKind = Literal["identical", "extension", "cross"]


@dataclass(frozen=True)
class VocabMatch:
    """How the teacher's vocabulary relates to the student's: its ``kind``; the ids only the student has (masked
    where they are responses) and only the teacher has; the sizes; the fraction of a probe text each path scores
    where both were measured (:func:`probe_coverage`); ``nested``: one vocabulary holds the other at equal ids."""

    kind: VocabKind
    student_only: frozenset[int] = field(default_factory=frozenset)
    teacher_only: frozenset[int] = field(default_factory=frozenset)
    student_size: int = 0
    teacher_size: int = 0
    coverage: dict[str, float] = field(default_factory=dict)
    nested: bool = False

    def describe(self) -> str:
        """One phrase for logs and error messages."""
        measured = ""
        if self.coverage:
            measured = ("; on a probe text the extension path scores {:.1%} of the student's tokens, the "
                        "cross-tokenizer path {:.1%}").format(self.coverage["extension"], self.coverage["cross"])
        if self.nested:
            return (f"{'an extension' if self.kind == 'extension' else 'cross'} ({self.teacher_size} teacher vs "
                    f"{self.student_size} student tokens; {len(self.student_only)} student-only, "
                    f"{len(self.teacher_only)} teacher-only, shared ids equal{measured})")
        return f"{self.kind} ({self.teacher_size} teacher vs {self.student_size} student tokens)"


def compare_vocabularies(student_tokenizer: Any, teacher_tokenizer: Any, *, allow_cross: bool = True) -> VocabMatch:
    """The start-up decision: ``identical`` when both map every token to the same id; ``extension`` when one token
    set contains the other at equal ids, unless the student has tokens the teacher lacks and the cross-tokenizer path
    scores more of a probe text (:func:`probe_coverage`; only with ``allow_cross``); else ``cross``."""
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    sizes = {"student_size": len(student), "teacher_size": len(teacher)}
    if student_tokenizer is teacher_tokenizer or student == teacher:
        return VocabMatch("identical", **sizes)
    s_keys, t_keys = student.keys(), teacher.keys()
    nested = s_keys <= t_keys or t_keys <= s_keys
    if not (nested and all(student[k] == teacher[k] for k in s_keys & t_keys)):
        return VocabMatch("cross", **sizes)
    match = VocabMatch("extension", frozenset(student[k] for k in s_keys - t_keys),
                       frozenset(teacher[k] for k in t_keys - s_keys), nested=True, **sizes)
    if not match.student_only or not allow_cross:
        return match  # nothing the extension path would mask (or no other path allowed)
    coverage = probe_coverage(student_tokenizer, teacher_tokenizer, match.student_only)
    kind: VocabKind = "cross" if coverage["cross"] > coverage["extension"] else "extension"
    return VocabMatch(kind, match.student_only, match.teacher_only, coverage=coverage, nested=True, **sizes)


#: The prompt of the start-up probe's turn (its response: the student's probe text, added tokens left out).
PROBE_PROMPT = "You see a coin and a door to the east.\nAction:"


def probe_coverage(student_tokenizer: Any, teacher_tokenizer: Any, student_only: frozenset[int]) -> dict[str, float]:
    """The fraction of the probe response's student tokens each path scores: ``extension`` (all but the
    ``student_only`` ones) and ``cross`` (those the character-span mapping maps)."""
    prompt = [int(t) for t in student_tokenizer.encode(PROBE_PROMPT, add_special_tokens=False)]
    response = [int(t) for t in student_tokenizer.encode(" " + probe_text(student_tokenizer, skip_added=True),
                                                         add_special_tokens=False)]
    if not response:
        return {"extension": 1.0, "cross": 1.0}
    extension = sum(t not in student_only for t in response) / len(response)
    mapped, total = plan_coverage(plan_turn(Translator(student_tokenizer, teacher_tokenizer), prompt, response))
    return {"extension": extension, "cross": mapped / total}


def adapt_teacher(teacher: Teacher, student_tokenizer: Any, teacher_tokenizer: Any,
                  match: VocabMatch | None = None) -> Teacher:
    """``teacher`` as a Teacher of the student's ids: itself when identical (or adapted already), else an
    :class:`ExtensionTeacher` or a :class:`~divopd.explore.vocab_align.CrossTokenizerTeacher`."""
    if getattr(teacher, "speaks_student_ids", False):
        return teacher
    match = match or compare_vocabularies(student_tokenizer, teacher_tokenizer)
    if match.kind == "identical":
        return teacher
    if match.kind == "extension":
        return ExtensionTeacher(teacher, student_tokenizer, teacher_tokenizer, match)
    return CrossTokenizerTeacher(teacher, student_tokenizer, teacher_tokenizer)


def student_ids_teacher(teacher: Teacher, student_tokenizer: Any, teacher_tokenizer: Any, *,
                        topk: int = 0) -> tuple[Teacher, Any]:
    """The explorer's teacher and the tokenizer of its +R prompts: both unchanged with the student's vocabulary, else
    the adapted teacher and the student's tokenizer. ``ValueError`` when ``topk`` > 0 and the teacher's ids are not
    all in the student's vocabulary."""
    match = None if getattr(teacher, "speaks_student_ids", False) else \
        compare_vocabularies(student_tokenizer, teacher_tokenizer, allow_cross=topk <= 0)
    if match is not None and match.kind == "identical":
        return teacher, teacher_tokenizer
    if topk > 0 and match is not None and (match.kind == "cross" or match.teacher_only):
        raise ValueError(f"Explorer: teacher_topk needs the teacher's top-k ids in the student's vocabulary; the "
                         f"teacher's vocabulary is {match.describe()}")
    return adapt_teacher(teacher, student_tokenizer, teacher_tokenizer, match), student_tokenizer


def expand_ids(ids: Sequence[int], missing: frozenset[int], source_tokenizer: Any,
               target_tokenizer: Any) -> tuple[list[int], list[int]]:
    """``ids`` in the target vocabulary (an id in ``missing`` becomes the target's tokenization of its text), and per
    source position the index of its target id (``-1`` for a replaced token)."""
    out: list[int] = []
    where: list[int] = []
    for i in ids:
        i = int(i)
        if i in missing:
            text = source_tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            out.extend(int(t) for t in target_tokenizer.encode(text, add_special_tokens=False))
            where.append(-1)
        else:
            where.append(len(out))
            out.append(i)
    return out, where


class ExtensionTeacher:
    """A teacher whose vocabulary extends the student's or the other way round (equal shared ids): a student token
    the teacher lacks is sent as its text, and gets NaN at a response position (counted as masked)."""

    speaks_student_ids = True

    def __init__(self, inner: Teacher, student_tokenizer: Any, teacher_tokenizer: Any, match: VocabMatch) -> None:
        self.inner, self.student_tokenizer, self.tokenizer = inner, student_tokenizer, teacher_tokenizer
        self.match = match

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[ResponseScores]:
        missing = self.match.student_only
        if not any(int(i) in missing for seq in (*prompts, *responses) for i in seq):
            return self.inner.score_turns(prompts, responses, topk=topk)  # nothing to translate: the direct call
        t_prompts = [expand_ids(p, missing, self.student_tokenizer, self.tokenizer)[0] for p in prompts]
        expanded = [expand_ids(r, missing, self.student_tokenizer, self.tokenizer) for r in responses]
        results = self.inner.score_turns(t_prompts, [ids for ids, _ in expanded], topk=topk)
        out = []
        for (ids, where), scores in zip(expanded, results, strict=True):
            if len(scores.logprobs) != len(ids):
                raise ValueError(f"teacher returned {len(scores.logprobs)} log probs for {len(ids)} response tokens")
            idx = np.asarray(where, dtype=np.int64)
            keep = idx >= 0
            mapped = np.full(len(where), np.nan, dtype=np.float32)
            mapped[keep] = np.asarray(scores.logprobs, dtype=np.float32)[idx[keep]]
            if scores.topk_ids is None or scores.topk_logprobs is None:
                out.append(ResponseScores(mapped))
                continue
            top_ids, top_lps = np.asarray(scores.topk_ids), np.asarray(scores.topk_logprobs, dtype=np.float32)
            k = top_ids.shape[1] if top_ids.ndim == 2 else 0
            m_ids = np.zeros((len(where), k), dtype=top_ids.dtype)
            m_lps = np.full((len(where), k), np.nan, dtype=np.float32)
            m_ids[keep], m_lps[keep] = top_ids[idx[keep]], top_lps[idx[keep]]
            out.append(ResponseScores(mapped, m_ids, m_lps))
        return out

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]:
        """The teacher acts on the student's prompt; a response token the student lacks is re-tokenized from its text
        (log prob NaN)."""
        s_tok, t_tok, m = self.student_tokenizer, self.tokenizer, self.match
        t_prompts = [expand_ids(p, m.student_only, s_tok, t_tok)[0] for p in prompts]
        gens = self.inner.generate(t_prompts, greedy=greedy, temperature=temperature, max_new_tokens=max_new_tokens,
                                   seed=seed)
        out = []
        for g in gens:
            ids, where = expand_ids(g.response_ids, m.teacher_only, t_tok, s_tok)
            lps = np.full(len(ids), np.nan, dtype=np.float32)
            for pos, w in enumerate(where):
                if w >= 0:
                    lps[w] = g.logprobs[pos]
            out.append(Generation(ids, lps, g.stopped))
        return out
