"""Cross-tokenizer teachers of the tokenizer families real models use (``divopd.models.tiny.build_tokenizer``,
trained offline with the ``tokenizers`` library, since no package here ships a SentencePiece model file: a Llama-2-style
SentencePiece BPE with a dummy prefix, a Metaspace Unigram, a word-level vocabulary whose decoder joins words with
spaces, a byte-level BPE), each as teacher and as student, against an independent HF forward of the teacher: a
response that starts without a space scores like one that does (nothing masked the text does not force); the
student's end of sequence is scored as the teacher's (its meaning), not as a teacher token of the same string; and a
vocabulary that is a same-id subset of the other takes the path that scores more of a probe text
(docs/concepts/teacher-vocabularies.md)."""

from __future__ import annotations

import bisect
import itertools
import logging

import numpy as np
import pytest
import torch

from divopd.explore.teacher import HFTeacher
from divopd.explore.vocab import ExtensionTeacher, adapt_teacher, compare_vocabularies, probe_coverage
from divopd.explore.vocab_align import CrossTokenizerTeacher, Translator
from divopd.models.tiny import build_model, build_tokenizer
from test_teacher_vocab import _texts

#: family → build_tokenizer kind, and whether it starts every encoded text with a word boundary (a dummy prefix ``▁``,
#: or a decoder that joins words with spaces)
KINDS = {"sentencepiece": "sentencepiece", "metaspace": "metaspace", "word": "whitespace", "bpe": "bpe"}
FAMILIES = tuple(KINDS)
DUMMY_PREFIX = {"sentencepiece": True, "metaspace": True, "word": True, "bpe": False}
PROMPT = "You are in room 2 . The coin is in room 4 . Valid actions: move east west take coin\nAction:"
RESPONSES = ["move east", " move east", "take coin move west west", " take coin"]


@pytest.fixture(scope="module")
def fams() -> dict[str, object]:
    texts = _texts() + [PROMPT] * 5
    return {f: build_tokenizer(texts, kind=kind, vocab_size=600) for f, kind in KINDS.items()}


@pytest.fixture(scope="module")
def models(fams: dict) -> dict[str, torch.nn.Module]:
    return {f: build_model(tok, size="0.2m", seed=3) for f, tok in fams.items()}


def _ids(tok: object, text: str) -> list[int]:
    return [int(t) for t in tok.encode(text, add_special_tokens=False)]


def _student_text(tok: object, prompt: list[int], response: list[int]) -> tuple[str, list[int]]:
    """The student's text of ``response`` after ``prompt`` (its own decoder's) and each token's end in it."""
    def dec(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    head = dec(prompt)
    return dec(prompt + response)[len(head):], [len(dec(prompt + response[:k + 1])) - len(head)
                                                for k in range(len(response))]


def _teacher_encoding(family: str, tok: object, text: str) -> tuple[list[int], list[int]]:
    """The teacher's ids of ``text`` as a text of its own and each one's end (the tokenizer's offsets): in a family
    that starts every text with a word boundary, that boundary stands for a leading space."""
    cut = 1 if DUMMY_PREFIX[family] and text.startswith(" ") and len(text) > 1 else 0
    enc = tok(text[cut:], add_special_tokens=False, return_offsets_mapping=True)
    return [int(t) for t in enc["input_ids"]], [int(e) + cut for _, e in enc["offset_mapping"]]


def _reference(s_fam: str, t_fam: str, fams: dict, model: torch.nn.Module,
               response: str) -> tuple[list[int], list[float], list[int], set[int]]:
    """Independently of divopd's mapping: the student's ids of ``response``, the teacher's log prob of each aligned
    chunk (a plain forward over its own tokenization; chunks cut where both tokenizations end at one character; the
    last index: text after the teacher's last token), each student token's chunk, and the chunks that hold a teacher
    ``<unk>`` (the log prob of an unknown word, not of the text)."""
    student, teacher = fams[s_fam], fams[t_fam]
    s_prompt, s_ids = _ids(student, PROMPT), _ids(student, response)
    text, s_ends = _student_text(student, s_prompt, s_ids)
    prompt_text = student.decode(s_prompt, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    t_prompt = _teacher_encoding(t_fam, teacher, prompt_text)[0]
    t_ids, t_ends = _teacher_encoding(t_fam, teacher, text)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([t_prompt + t_ids])).logits[0].double(), dim=-1)
    t_lp = [float(logp[len(t_prompt) - 1 + j, t]) for j, t in enumerate(t_ids)]
    shared = sorted(set(s_ends) & set(t_ends) - {0})
    chunk_lp = [0.0] * (len(shared) + 1)
    for j, e in enumerate(t_ends):
        chunk_lp[bisect.bisect_left(shared, max(e, 1))] += t_lp[j]
    unknown = {bisect.bisect_left(shared, max(e, 1)) for e, t in zip(t_ends, t_ids, strict=True)
               if t == teacher.unk_token_id}
    return s_ids, chunk_lp, [bisect.bisect_left(shared, e) for e in s_ends], unknown


def _check_against_reference(s_fam: str, t_fam: str, fams: dict, models: dict, response: str) -> np.ndarray:
    """The mapped log probs of ``response``: NaN exactly on the student tokens of a chunk that holds a teacher
    ``<unk>`` or lies after the teacher's last token (the teacher has no token for that text), every other token its
    even share of its chunk's reference log prob."""
    student, teacher_tok, model = fams[s_fam], fams[t_fam], models[t_fam]
    teacher = adapt_teacher(HFTeacher(model, teacher_tok, max_tokens_per_batch=4096), student, teacher_tok)
    s_ids, chunk_lp, chunk_of, unknown = _reference(s_fam, t_fam, fams, model, response)
    mapped = teacher.score_turns([_ids(student, PROMPT)], [s_ids])[0].logprobs
    sizes = np.bincount(chunk_of)
    forced = [c in unknown or c == len(chunk_lp) - 1 for c in chunk_of]
    assert np.isnan(mapped[forced]).all(), (response, mapped)
    keep = ~np.asarray(forced, dtype=bool)
    expect = np.asarray([chunk_lp[c] / sizes[c] for c in chunk_of])
    np.testing.assert_allclose(mapped[keep], expect[keep], rtol=0, atol=1e-4)
    return mapped


PAIRS = [p for p in itertools.permutations(FAMILIES, 2)]


@pytest.mark.parametrize(("s_fam", "t_fam"), PAIRS, ids=[f"{s}-student-{t}-teacher" for s, t in PAIRS])
def test_every_family_pair_maps_every_token_against_a_plain_forward(s_fam: str, t_fam: str, fams: dict,
                                                                    models: dict) -> None:
    student, teacher_tok, model = fams[s_fam], fams[t_fam], models[t_fam]
    assert compare_vocabularies(student, teacher_tok).kind == "cross"
    teacher = adapt_teacher(HFTeacher(model, teacher_tok, max_tokens_per_batch=4096), student, teacher_tok)
    assert isinstance(teacher, CrossTokenizerTeacher)
    for response in RESPONSES:
        s_ids, chunk_lp, chunk_of, _ = _reference(s_fam, t_fam, fams, model, response)
        mapped = teacher.score_turns([_ids(student, PROMPT)], [s_ids])[0].logprobs
        assert np.isfinite(mapped).all(), (response, mapped)  # the text forces no mask here: every word is known
        sizes = np.bincount(chunk_of)
        expect = np.asarray([chunk_lp[c] / sizes[c] for c in chunk_of])
        np.testing.assert_allclose(mapped, expect, rtol=0, atol=1e-4)
        assert float(mapped.sum()) == pytest.approx(sum(chunk_lp), abs=1e-3)


@pytest.mark.parametrize("t_fam", ["sentencepiece", "metaspace", "word"])
def test_a_response_without_a_leading_space_scores_like_one_with_it(t_fam: str, fams: dict, models: dict) -> None:
    """A teacher that starts every text with a word boundary sees ``move east`` and `` move east`` as one text: the
    same teacher ids, so a byte-level student's two spellings get the same scores word for word."""
    student, teacher_tok = fams["bpe"], fams[t_fam]
    teacher = adapt_teacher(HFTeacher(models[t_fam], teacher_tok, max_tokens_per_batch=4096), student, teacher_tok)
    prompt = _ids(student, PROMPT)
    for bare in ("move east", "take coin move west west"):
        a, b = _ids(student, bare), _ids(student, " " + bare)
        assert a != b and len(a) == len(b)  # "move" vs "Ġmove": one token per word either way
        lp_a, lp_b = (sc.logprobs for sc in teacher.score_turns([prompt, prompt], [a, b]))
        assert np.isfinite(lp_a).all()
        np.testing.assert_allclose(lp_a, lp_b, rtol=0, atol=1e-5)


UNKNOWN = [("bpe", "metaspace", "take coin ~ move east"),  # a character the Unigram never saw
           ("bpe", "word", "take coin ~ move east"),  # a word-level teacher: "~" is a word it lacks
           ("bpe", "word", "Youtake move east"),  # two known words without a space: one word the teacher lacks
           ("sentencepiece", "word", "There isYour coin. move east")]


@pytest.mark.parametrize(("s_fam", "t_fam", "response"), UNKNOWN,
                         ids=[f"{s}-student-{t}-teacher-{i}" for i, (s, t, _) in enumerate(UNKNOWN)])
def test_an_unknown_word_masks_its_own_chunk_only(s_fam: str, t_fam: str, response: str, fams: dict,
                                                  models: dict) -> None:
    """What the text forces stays masked: text the teacher cannot spell becomes its ``<unk>``, whose log prob is that
    of some unknown word, not of the text: the student tokens of that chunk are masked. The tokens after it are
    scored, exactly as the teacher's own tokenization scores them (its offsets say where the unknown text ends)."""
    assert fams[t_fam].unk_token_id in _ids(fams[t_fam], response)
    mapped = _check_against_reference(s_fam, t_fam, fams, models, response)
    lost = np.flatnonzero(np.isnan(mapped))
    assert 0 < len(lost) <= len(mapped) - 2 and np.isfinite(mapped[lost[-1] + 1:]).all(), mapped


@pytest.mark.parametrize("s_fam", ["bpe", "sentencepiece", "metaspace"])
def test_a_space_joining_teacher_masks_only_whitespace_it_has_no_token_for(s_fam: str, fams: dict,
                                                                           models: dict) -> None:
    """A word-level teacher whose decoder joins words with spaces (``take coin .``) sees punctuation and words as the
    student wrote them: all scored. It has no token for whitespace: a newline between two words shares the next
    word's chunk (its sum is exact), a newline after the last word has no teacher token at all and stays masked."""
    for response, masked in [("take coin.", 0), ("move east. take coin", 0), ("take\nmove east", 0),
                             ("take coin.\n", 1), ("\n", -1)]:  # -1: every token (a lone newline)
        mapped = _check_against_reference(s_fam, "word", fams, models, response)
        assert int(np.isnan(mapped).sum()) == (masked if masked >= 0 else len(mapped)), (response, mapped)


# ------------------------------------------------------------------------------------------------ eos rule
def _named_tokenizer(texts: list[str], eos: str, extra: list[str]) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", *extra], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token=eos,
                                   additional_special_tokens=[t for t in extra if t != eos],
                                   clean_up_tokenization_spaces=False)


def test_the_students_eos_is_scored_as_the_teachers_eos_not_as_a_token_of_the_same_string() -> None:
    """A GPT-2-style student ends with ``<|endoftext|>``; an Instruct teacher has ``<|endoftext|>`` too, but its end
    of turn (its ``eos``) is ``<|im_end|>``: the student's end is scored as the teacher's ``<|im_end|>``."""
    texts = _texts()
    student = _named_tokenizer(texts, "<|endoftext|>", ["<|endoftext|>"])
    teacher_tok = _named_tokenizer(texts + ["go north"], "<|im_end|>", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    model = build_model(teacher_tok, size="0.2m", seed=4)
    teacher = adapt_teacher(HFTeacher(model, teacher_tok, max_tokens_per_batch=4096), student, teacher_tok)
    assert isinstance(teacher, CrossTokenizerTeacher)
    s_eos, t_eos = student.eos_token_id, teacher_tok.eos_token_id
    t_same = teacher_tok.convert_tokens_to_ids("<|endoftext|>")
    assert t_same != t_eos and Translator(student, teacher_tok).anchors[s_eos] == t_eos
    assert Translator(teacher_tok, student).anchors[t_eos] == s_eos  # +R: the teacher's end is the student's
    prompt, words = _ids(student, PROMPT), _ids(student, "move east")
    lp = teacher.score_turns([prompt], [words + [s_eos]])[0].logprobs
    t_prompt, t_words = _ids(teacher_tok, PROMPT), _ids(teacher_tok, "move east")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([t_prompt + t_words + [t_eos]])).logits[0].double(), -1)
    at = len(t_prompt) + len(t_words) - 1
    assert lp[-1] == pytest.approx(float(logp[at, t_eos]), abs=1e-5)  # the meaning: end of turn
    assert abs(float(logp[at, t_eos]) - float(logp[at, t_same])) > 1e-3  # ... which differs from the same string


# ------------------------------------------------------------------------------------------------ subset vocabulary
def test_a_same_id_subset_vocabulary_takes_the_path_that_scores_more(caplog: pytest.LogCaptureFixture) -> None:
    """A byte-level BPE with fewer merges is a same-id subset of one with more: as teacher of the larger one, the
    extension path would mask every merge it lacks; the cross path scores them all, and is taken. The other way round
    (nothing to mask) the extension path stays."""
    texts = _texts()
    small, large = build_tokenizer(texts, kind="bpe", vocab_size=280), build_tokenizer(texts, kind="bpe",
                                                                                         vocab_size=340)
    assert set(small.get_vocab().items()) <= set(large.get_vocab().items())  # same ids: an extension by ids
    match = compare_vocabularies(large, small)
    assert match.kind == "cross" and match.student_only and match.nested
    assert match.coverage["extension"] < match.coverage["cross"] == 1.0
    assert "extension path scores" in match.describe()
    ext = compare_vocabularies(large, small, allow_cross=False)  # teacher.cross_tokenizer: false, or a top-k
    assert ext.kind == "extension" and ext.student_only == match.student_only
    assert probe_coverage(large, small, match.student_only) == match.coverage
    assert compare_vocabularies(small, large).kind == "extension"  # the student lacks nothing: no mask, no probe

    model = build_model(small, size="0.2m", seed=5)
    teacher = adapt_teacher(HFTeacher(model, small, max_tokens_per_batch=4096), large, small, match)
    assert isinstance(teacher, CrossTokenizerTeacher)
    masked = adapt_teacher(HFTeacher(model, small, max_tokens_per_batch=4096), large, small, ext)
    assert isinstance(masked, ExtensionTeacher)
    prompt, response = _ids(large, PROMPT), _ids(large, "take coin move west west")
    lp = teacher.score_turns([prompt], [response])[0].logprobs
    lp_ext = masked.score_turns([prompt], [response])[0].logprobs
    assert np.isfinite(lp).all() and np.isnan(lp_ext).any()
    t_prompt, t_resp = _ids(small, PROMPT), _ids(small, "take coin move west west")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([t_prompt + t_resp])).logits[0].double(), -1)
    total = sum(float(logp[len(t_prompt) - 1 + j, t]) for j, t in enumerate(t_resp))
    assert float(lp.sum()) == pytest.approx(total, abs=1e-4)  # the teacher's own tokenization of the text, exactly
    with caplog.at_level(logging.INFO):
        from divopd.explore.explorer import Explorer, ExplorerConfig

        explorer = Explorer(ExplorerConfig(env="tiny"), build_model(large, size="0.2m"), large,
                            HFTeacher(model, small, max_tokens_per_batch=4096), small)
    assert isinstance(explorer._teacher, CrossTokenizerTeacher)


# ------------------------------------------------------------------------------------------------ a real run
def _forced(student: object, teacher: object, response: list[int]) -> list[bool]:
    """Independently of divopd's mapping, for a byte-level word student and a whitespace-splitting word-level teacher:
    per response token, whether the text forces its mask. A token whose letters lie in a word the teacher scores as
    ``<unk>`` is forced; a whitespace-only token shares the fate of the next word in its run (special tokens cut
    runs), and is forced where no word follows (the teacher has no token for it)."""
    special = set(student.all_special_ids)
    out = [False] * len(response)
    runs, start = [], 0
    for k in range(len(response) + 1):
        if k == len(response) or response[k] in special:
            runs.append((start, k))
            start = k + 1
    for a, b in runs:
        pieces = [student.decode([t]) for t in response[a:b]]
        text = "".join(pieces)
        enc = teacher(text, add_special_tokens=False, return_offsets_mapping=True)
        unknown = [span for t, span in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
                   if t == teacher.unk_token_id]
        at, fate = 0, []
        for piece in pieces:
            letters = [i for i in range(at, at + len(piece)) if not text[i].isspace()]
            fate.append(None if not letters else any(s <= letters[0] < e for s, e in unknown))
            at += len(piece)
        nxt = True  # no word after it: forced
        for j in range(len(fate) - 1, -1, -1):
            nxt = fate[j] if fate[j] is not None else nxt
            out[a + j] = nxt
    return out


@pytest.mark.slow
def test_a_short_train_with_a_word_level_teacher_masks_only_what_the_text_forces(tmp_path: object) -> None:
    """The benchmark's pair (``benchmarks/teacher_families.py``) in a real short run: the random student writes words
    without spaces between them and newlines at the end; exactly the tokens of words the whitespace-splitting teacher
    cannot spell, and whitespace with no word after it, are masked, and the run's metric counts them."""
    import json

    from divopd.experience.log import read_log
    from divopd.explore.envs.tiny import build_tiny_pair, tiny_corpus
    from divopd.models import load_tokenizer
    from divopd.train import train
    from divopd.train.config import load_config

    student_path = build_tiny_pair(tmp_path / "pair")["student"]
    words = build_tokenizer(tiny_corpus(), kind="whitespace", vocab_size=600)
    build_model(words, size="0.2m", seed=1).save_pretrained(tmp_path / "teacher")
    words.save_pretrained(tmp_path / "teacher")
    cfg = load_config(data={
        "setting": "tiny", "method": "divopd", "seed": 0, "updates": 2, "run_dir": str(tmp_path / "run"),
        "student": {"path": student_path}, "teacher": {"path": str(tmp_path / "teacher")},
        "runtime": {"kind": "lockstep"}, "eval": {"every": 1000, "at_start": False}})
    train(cfg)
    student, teacher = load_tokenizer(student_path), load_tokenizer(str(tmp_path / "teacher"))
    masked = forced = tokens = 0
    for lt in read_log(tmp_path / "run" / "experience"):
        if lt.turn.teacher_logprobs is None:
            continue
        lost = ~np.isfinite(np.asarray(lt.turn.teacher_logprobs, dtype=np.float64))
        expect = _forced(student, teacher, lt.turn.response_ids.tolist())
        assert lost.tolist() == expect, (student.convert_ids_to_tokens(lt.turn.response_ids.tolist()), lost)
        tokens, masked, forced = tokens + len(lost), masked + int(lost.sum()), forced + sum(expect)
    assert 0 < masked == forced < tokens
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["explorer/teacher_masked_tokens"] for r in records if r.get("kind") == "update"][-1] == masked
