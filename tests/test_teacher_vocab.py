"""Teacher vocabularies: identical → the direct path, bit for bit; an extension → scored directly with the
student-only tokens masked and counted; another tokenizer → the teacher's log probs mapped onto the student's tokens
by character spans (docs/concepts/teacher-vocabularies.md), checked against an independent computation with a real
HF teacher; and a short real `divopd train` with a cross-tokenizer teacher."""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from divopd.explore.envs import make_env
from divopd.explore.explorer import Explorer, ExplorerConfig
from divopd.explore.teacher import HFTeacher
from divopd.explore.vocab import ExtensionTeacher, adapt_teacher, compare_vocabularies
from divopd.explore.vocab_align import CrossTokenizerTeacher
from divopd.models.tiny import build_model, build_tokenizer

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = REPO / "cache" / "smollm2-135m"
PROMPT = "You are in room 2 . The coin is in room 4 . Valid actions: move east west take coin"
RESPONSES = ["move east", "move east take coin", "take coin move west west"]


def _texts() -> list[str]:
    env = make_env("tiny")
    texts = [PROMPT, *RESPONSES]
    for task in env.tasks("train")[:30]:
        texts.append(env.reset(task))
        for action in env.gold_actions(task) or []:
            texts += [action, env.step(action)[0]]
    return texts


@pytest.fixture(scope="module")
def toks() -> dict[str, object]:
    texts = _texts()
    return {"word": build_tokenizer(texts), "word2": build_tokenizer(texts),
            "bpe": build_tokenizer(texts, kind="bpe", vocab_size=300)}


def _teacher(tok: object, seed: int = 1) -> HFTeacher:
    return HFTeacher(build_model(tok, size="0.2m", seed=seed), tok, max_tokens_per_batch=4096)


def _ids(tok: object, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


# ------------------------------------------------------------------------------------------------ identical
def test_identical_vocabularies_keep_the_direct_path_bit_for_bit(toks: dict) -> None:
    word, word2 = toks["word"], toks["word2"]
    assert word is not word2 and compare_vocabularies(word, word2).kind == "identical"
    teacher = _teacher(word)
    assert adapt_teacher(teacher, word, word2) is teacher
    explorer = Explorer(ExplorerConfig(env="tiny"), build_model(word, size="0.2m"), word, teacher, word2)
    assert explorer._teacher is teacher and explorer.teacher_tokenizer is word2
    prompts = [_ids(word, PROMPT)] * len(RESPONSES)
    responses = [_ids(word, r) for r in RESPONSES]
    direct = teacher.score_turns(prompts, responses)
    via = explorer._teacher_scores(prompts, responses)
    for want, got in zip(direct, via, strict=True):
        lp = want.logprobs
        assert got.logprobs.dtype == lp.dtype and np.array_equal(got.logprobs, lp)  # the same arrays, bit for bit
    assert explorer.stats()["explorer/teacher_masked_tokens"] == 0


# ------------------------------------------------------------------------------------------------ extension
def test_an_extension_scores_directly_and_masks_exactly_the_extra_tokens(toks: dict) -> None:
    teacher_tok = toks["word"]
    student_tok = build_tokenizer(_texts())  # the same vocabulary, then two special tokens appended (Qwen3 vs 2.5)
    student_tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    think, end_think = student_tok.convert_tokens_to_ids(["<think>", "</think>"])
    match = compare_vocabularies(student_tok, teacher_tok)
    assert match.kind == "extension" and match.student_only == {think, end_think} and not match.teacher_only
    teacher = _teacher(teacher_tok)
    explorer = Explorer(ExplorerConfig(env="tiny"), build_model(student_tok, size="0.2m"), student_tok, teacher,
                        teacher_tok)
    assert isinstance(explorer._teacher, ExtensionTeacher) and explorer.teacher_tokenizer is student_tok

    move, east, take = (_ids(teacher_tok, w)[0] for w in ("move", " east", " take"))
    prompt = [think] + _ids(teacher_tok, PROMPT) + [end_think]  # prompt tokens the teacher lacks: sent as text
    responses = [[think, move, east, end_think, take], [move, east], [end_think]]
    scores = [s.logprobs for s in explorer._teacher_scores([prompt] * 3, responses)]
    for resp, lp in zip(responses, scores, strict=True):
        extra = np.isin(resp, [think, end_think])
        assert np.array_equal(~np.isfinite(lp), extra)  # masked exactly at the extra tokens, nowhere else
    assert explorer.stats()["explorer/teacher_masked_tokens"] == 3

    # the unmasked positions are the teacher's scores of the same text: each extra token sent as its text
    as_text = {t: _ids(teacher_tok, student_tok.decode([t])) for t in (think, end_think)}
    t_prompt = as_text[think] + _ids(teacher_tok, PROMPT) + as_text[end_think]
    t_resp = as_text[think] + [move, east] + as_text[end_think] + [take]
    assert max(t_prompt + t_resp) < len(teacher_tok)  # never an id the teacher lacks
    ref = teacher.score_turns([t_prompt], [t_resp])[0].logprobs
    k = len(as_text[think])
    expect = np.asarray([np.nan, ref[k], ref[k + 1], np.nan, ref[-1]], dtype=np.float32)
    np.testing.assert_allclose(scores[0], expect, rtol=0, atol=1e-5, equal_nan=True)
    moved = teacher.score_turns([t_prompt], [[move, east]])[0].logprobs
    np.testing.assert_allclose(scores[1], moved, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------ cross
def _offsets(tok: object, text: str) -> tuple[list[int], list[int]]:
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [int(e) for _, e in enc["offset_mapping"]]


def _reference_chunks(student_tok: object, teacher_tok: object, teacher_model: torch.nn.Module, prompt: str,
                      response: str) -> tuple[list[int], list[float], list[int]]:
    """Independently of divopd's mapping: the student's tokens of ``response``, the teacher's log prob of each
    aligned chunk (a direct forward over its own tokenization, grouped by the tokenizers' offset mappings) and the
    chunk of every student token."""
    s_ids, s_ends = _offsets(student_tok, response)
    t_ids, t_ends = _offsets(teacher_tok, response)
    t_prompt = _ids(teacher_tok, prompt)
    with torch.no_grad():
        logits = teacher_model(torch.tensor([t_prompt + t_ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    t_lp = [float(logp[len(t_prompt) - 1 + j, t]) for j, t in enumerate(t_ids)]
    shared = sorted(set(s_ends) & set(t_ends))
    chunk_of = [bisect.bisect_left(shared, e) for e in s_ends]
    chunk_lp = [0.0] * len(shared)
    for j, e in enumerate(t_ends):
        chunk_lp[bisect.bisect_left(shared, e)] += t_lp[j]
    return s_ids, chunk_lp, chunk_of


def _check_mapping(student_tok: object, teacher_tok: object, teacher_model: torch.nn.Module) -> tuple[int, int]:
    """Map every response and compare with :func:`_reference_chunks`; returns (aligned, straddled) token counts."""
    teacher = adapt_teacher(HFTeacher(teacher_model, teacher_tok, max_tokens_per_batch=4096), student_tok,
                            teacher_tok)
    assert isinstance(teacher, CrossTokenizerTeacher)
    aligned = straddled = 0
    for response in RESPONSES:
        s_ids, chunk_lp, chunk_of = _reference_chunks(student_tok, teacher_tok, teacher_model, PROMPT, response)
        (scores,) = teacher.score_turns([_ids(student_tok, PROMPT)], [s_ids])
        mapped = scores.logprobs
        assert scores.topk_ids is None and mapped.shape == (len(s_ids),) and np.isfinite(mapped).all()
        sizes = np.bincount(chunk_of)
        for k, c in enumerate(chunk_of):
            if sizes[c] == 1:  # boundaries align: exactly the teacher's log prob of this token's text
                aligned += 1
                assert mapped[k] == pytest.approx(chunk_lp[c], abs=1e-4)
            else:  # a teacher token straddles student boundaries: an even share, the chunk's sum exact
                straddled += 1
                assert mapped[k] == pytest.approx(chunk_lp[c] / sizes[c], abs=1e-4)
                assert chunk_lp[c] - 1e-4 <= mapped[k] <= 1e-4
        assert float(mapped.sum()) == pytest.approx(sum(chunk_lp), abs=1e-3)
    return aligned, straddled


def test_cross_tokenizer_maps_teacher_log_probs_onto_student_tokens(toks: dict) -> None:
    word, bpe = toks["word"], toks["bpe"]
    assert compare_vocabularies(word, bpe).kind == "cross"
    # a word-level student, a BPE teacher: a student word = one chunk of teacher subwords (all aligned)
    aligned, straddled = _check_mapping(word, bpe, build_model(bpe, size="0.2m", seed=1))
    assert aligned > 0 and straddled == 0
    # a BPE student, a word-level teacher: a teacher word straddles the student's subword boundaries
    aligned, straddled = _check_mapping(bpe, word, build_model(word, size="0.2m", seed=1))
    assert straddled > 0


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").is_file(), reason="SmolLM2-135M not in cache/")
def test_cross_tokenizer_with_smollm2_as_the_teacher(toks: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smol_tok = AutoTokenizer.from_pretrained(SMOLLM2)
    smol = AutoModelForCausalLM.from_pretrained(SMOLLM2, torch_dtype=torch.float32).eval()
    for student in (toks["word"], toks["bpe"]):
        aligned, _ = _check_mapping(student, smol_tok, smol)
        assert aligned > 0


def test_unrecoverable_pieces_are_glued_and_lost_text_is_masked(toks: dict) -> None:
    """A byte-level piece of a multi-byte character has no text of its own: it shares its chunk with the piece that
    completes it. A word the teacher cannot spell (``<unk>``) is masked (NaN), never scored as garbage (here it is
    the last word: every student token from its start is masked)."""
    word, bpe = toks["word"], toks["bpe"]
    ids = _ids(bpe, "move café")
    pieces = [bpe.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces)  # the student splits é into two byte pieces
    teacher_bpe = build_tokenizer(_texts() + ["move café"] * 20, kind="bpe", vocab_size=320)
    model = build_model(teacher_bpe, size="0.2m", seed=2)
    mapped = adapt_teacher(HFTeacher(model, teacher_bpe, max_tokens_per_batch=4096), bpe,
                           teacher_bpe).score_turns([_ids(bpe, PROMPT)], [ids])[0].logprobs
    assert np.isfinite(mapped).all()
    broken = [k for k, p in enumerate(pieces) if "\ufffd" in p]
    assert len({float(mapped[k]) for k in broken}) == 1  # glued pieces share one chunk evenly
    t_ids = _ids(teacher_bpe, "move café")
    with torch.no_grad():
        t_prompt = _ids(teacher_bpe, PROMPT)
        logp = torch.log_softmax(model(torch.tensor([t_prompt + t_ids])).logits[0].double(), -1)
    total = sum(float(logp[len(t_prompt) - 1 + j, t]) for j, t in enumerate(t_ids))
    assert float(mapped.sum()) == pytest.approx(total, abs=1e-4)  # nothing lost, nothing counted twice

    unknown = adapt_teacher(_teacher(word), bpe, word).score_turns([_ids(bpe, PROMPT)], [ids])[0].logprobs
    first_lost = len(_ids(bpe, "move"))
    assert np.isfinite(unknown[:first_lost]).all() and np.isnan(unknown[first_lost:]).all()


def test_cross_tokenizer_teacher_actions_come_back_in_student_ids(toks: dict) -> None:
    """+R: the teacher acts on its own tokenization of the prompt; its action text is re-tokenized by the student
    (special tokens through their counterparts), so a turn's records only ever hold student ids."""
    word, bpe = toks["word"], toks["bpe"]
    teacher = adapt_teacher(_teacher(bpe), word, bpe)
    kwargs = {"greedy": True, "temperature": 1.0, "max_new_tokens": 8, "seed": 0}
    got = teacher.generate([_ids(word, PROMPT)], **kwargs)[0]
    inner = _teacher(bpe).generate([_ids(bpe, PROMPT)], **kwargs)[0]  # the same teacher on its own prompt ids
    special = set(bpe.all_special_ids)
    expect: list[int] = []
    run: list[int] = []
    for i in [*inner.response_ids, None]:
        if i is None or i in special:
            expect += _ids(word, bpe.decode(run)) if run else []
            run = []
            if i is not None:
                expect.append(word.convert_tokens_to_ids(bpe.convert_ids_to_tokens(i)))
        else:
            run.append(i)
    assert got.response_ids == expect and got.stopped == inner.stopped and len(got.logprobs) == len(expect)


def test_topk_needs_a_shared_vocabulary(toks: dict) -> None:
    word, bpe = toks["word"], toks["bpe"]
    with pytest.raises(ValueError, match="teacher_topk needs the teacher's top-k ids"):
        Explorer(ExplorerConfig(env="tiny", teacher_topk=4), build_model(word, size="0.2m"), word, _teacher(bpe), bpe)


# ------------------------------------------------------------------------------------------------ a real run
@pytest.fixture(scope="module")
def cross_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """The tests' tiny word-level student and a tiny teacher with its own byte-level BPE tokenizer, and the config
    data of a short lockstep run pairing them."""
    from tiny_models import build_tiny_models

    root = tmp_path_factory.mktemp("cross")
    models = build_tiny_models(root / "models")
    bpe = build_tokenizer(_texts(), kind="bpe", vocab_size=300)
    build_model(bpe, size="0.2m", seed=1).save_pretrained(root / "bpe-teacher")
    bpe.save_pretrained(root / "bpe-teacher")
    data = {
        "setting": "test-tiny", "method": "divopd", "seed": 0, "updates": 3, "run_dir": str(root / "run"),
        "student": {"path": models["student"]}, "teacher": {"path": str(root / "bpe-teacher")},
        "sampler": {"batch_size": 6, "pool_factor": 4, "cap": 2, "max_staleness": 2},
        "learner": {"lr": 1e-3}, "runtime": {"kind": "lockstep"},
        "explorer": {"env": "tiny", "num_envs": 3, "max_steps": 5},
        "eval": {"every": 3, "tasks": 3, "at_start": False}, "checkpoint": {"every": 3, "keep": 1},
    }
    return data, root


def test_every_teacher_backend_is_bridged_where_it_is_loaded(cross_run: tuple[dict, Path], toks: dict) -> None:
    """``load_teacher`` wraps whatever backend it built, so the shared Ray teacher actor (which loads its teacher with
    it, in its own process) scores the student's ids too."""
    pytest.importorskip("ray")
    from divopd.models import load_tokenizer
    from divopd.train.config import load_config
    from divopd.train.runtime.common import load_teacher
    from divopd.train.runtime.ray_teacher import TeacherActor

    cfg = load_config(data=cross_run[0])
    teacher, tokenizer = load_teacher(cfg)
    assert isinstance(teacher, CrossTokenizerTeacher) and tokenizer.get_vocab() != toks["word"].get_vocab()
    actor = TeacherActor(cfg.model_dump(mode="json"))  # the actor's class, in this process
    assert isinstance(actor.teacher, CrossTokenizerTeacher)
    student = load_tokenizer(cfg.student.path)
    prompt, response = _ids(student, PROMPT), _ids(student, "move east take coin")
    (scores,) = actor.score_turns([prompt], [response])
    lp, again = scores.logprobs, teacher.score_turns([prompt], [response])[0].logprobs
    assert scores.topk_ids is None and lp.shape == (len(response),) and np.isfinite(lp).all()
    np.testing.assert_allclose(lp, again, rtol=0, atol=1e-5)


def test_teacher_tokenizer_names_the_tokenizer_the_decision_reads(cross_run: tuple[dict, Path]) -> None:
    from divopd.models import load_tokenizer
    from divopd.train.config import load_config
    from divopd.train.runtime.common import check_vocabularies

    data, root = cross_run
    student, teacher = data["student"]["path"], data["teacher"]["path"]
    own = load_config(data=data)
    assert check_vocabularies(own, load_tokenizer(teacher)).kind == "cross"
    named = load_config(data={**data, "teacher": {"path": teacher, "tokenizer": student}})
    assert named.teacher.tokenizer == student
    assert check_vocabularies(named, load_tokenizer(student)).kind == "identical"  # compared, not assumed
    off = load_config(data={**data, "teacher": {"path": student, "tokenizer": teacher, "cross_tokenizer": False}})
    with pytest.raises(ValueError, match=r"^teacher\.tokenizer: .* teacher\.cross_tokenizer is false"):
        check_vocabularies(off, load_tokenizer(teacher))


def test_a_short_train_with_a_cross_tokenizer_teacher(cross_run: tuple[dict, Path]) -> None:
    from divopd.experience.log import read_log
    from divopd.train import train
    from divopd.train.config import load_config

    data, root = cross_run
    run_dir = root / "run"
    models = {"student": data["student"]["path"]}
    cfg = load_config(data=data)
    summary = train(cfg)
    assert summary["updates"] == 3
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    updates = [r for r in records if r["kind"] == "update"]
    assert [r["update"] for r in updates] == [1, 2, 3]
    assert all(r["learner/valid_tokens"] > 0 and math.isfinite(r["learner/loss"]) for r in updates)
    turns = [lt.turn for lt in read_log(run_dir / "experience") if lt.turn.teacher_logprobs is not None]
    assert turns and all(len(t.teacher_logprobs) == t.response_len for t in turns)
    assert sum(int(np.isfinite(t.teacher_logprobs).sum()) for t in turns) > 0
    # the logged scores are the cross-tokenizer mapping's (the direct path would have scored word ids as BPE ids)
    from divopd.models import load_model, load_tokenizer

    student_tok = load_tokenizer(models["student"])
    model, teacher_tok = load_model(data["teacher"]["path"])
    cross = adapt_teacher(HFTeacher(model.eval(), teacher_tok, max_tokens_per_batch=4096), student_tok, teacher_tok)
    assert isinstance(cross, CrossTokenizerTeacher)
    for t in turns[:4]:
        again = cross.score_turns([t.prompt_ids.tolist()], [t.response_ids.tolist()])[0].logprobs
        np.testing.assert_allclose(t.teacher_logprobs, again, rtol=0, atol=1e-4, equal_nan=True)
    masked = sum(int(np.count_nonzero(~np.isfinite(t.teacher_logprobs))) for t in turns)
    assert updates[-1]["explorer/teacher_masked_tokens"] <= masked  # counted on arrival; the log holds them all
