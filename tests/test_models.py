"""Tiny offline models, HF loading, packing and no-grad scoring (divopd.models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from divopd.models import load_model, resolve_dtype
from divopd.models.packing import pack_sequences
from divopd.models.scoring import ResponseScores, response_logprobs
from divopd.models.tiny import SIZES, build_model, build_tokenizer

torch.set_num_threads(1)

TEXTS = [
    "You are in the kitchen. You see a fridge, a counter and a red apple.",
    "take red apple", "open fridge", "go north", "You are in the corridor. There is a door to the north.",
    "Your task is to cook a meal: slice the apple, then eat it.",
]


@pytest.fixture(scope="module", params=["word", "bpe"])
def tok(request):
    return build_tokenizer(TEXTS * 2, kind=request.param, vocab_size=400)


def chat_ids(tokenizer, messages, gen=True) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True, return_dict=False)


def test_tokenizer_roundtrip_and_chat_template(tok):
    text = "take red apple"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and tok.unk_token_id not in ids
    msgs = [{"role": "system", "content": "Your task is to cook a meal"}, {"role": "user", "content": "go north"}]
    prompt = chat_ids(tok, msgs)
    assert prompt[-1] == tok.convert_tokens_to_ids("<|assistant|>")
    # an assistant message in the history is <|assistant|> + content + eos: the response a model must produce
    full = chat_ids(tok, msgs + [{"role": "assistant", "content": text}], gen=False)
    assert full == prompt + ids + [tok.eos_token_id]
    assert tok.pad_token_id is not None and tok.eos_token_id != tok.pad_token_id
    with pytest.raises(Exception, match="unknown role"):
        chat_ids(tok, [{"role": "tool", "content": "x"}])


def test_build_tokenizer_rejects_bad_input():
    with pytest.raises(ValueError, match="kind"):
        build_tokenizer(TEXTS, kind="char")
    with pytest.raises(ValueError, match="no texts"):
        build_tokenizer([])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_save_load_roundtrip_offline(tok, arch, tmp_path):
    model = build_model(tok, size="0.2m", arch=arch, seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model(str(tmp_path))
    assert isinstance(loaded_tok, PreTrainedTokenizerFast)
    msgs = [{"role": "user", "content": "open fridge then go north"}]
    assert chat_ids(loaded_tok, msgs) == chat_ids(tok, msgs)  # same ids, no Qwen2Tokenizer re-tokenisation
    ids = torch.tensor([chat_ids(tok, msgs)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    bf16, _ = load_model(str(tmp_path), dtype="bfloat16")
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_model_sizes_and_seed():
    tok = build_tokenizer(TEXTS, kind="word")
    counts = {}
    for size in SIZES:
        if size == "20m":
            continue  # same code path; skipped to keep the suite fast
        counts[size] = sum(p.numel() for p in build_model(tok, size=size).parameters())
    assert 0.1e6 < counts["0.2m"] < 0.3e6 and 0.8e6 < counts["1m"] < 1.5e6 and 3e6 < counts["5m"] < 6e6
    assert 0.3e6 < counts["0.5m"] < 0.6e6
    half = build_model(tok, size="0.5m").config
    assert half.hidden_size // half.num_attention_heads == 64  # what vLLM's CPU attention kernel needs
    a, b = build_model(tok, "0.2m", seed=1), build_model(tok, "0.2m", seed=1)
    c = build_model(tok, "0.2m", seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))
    with pytest.raises(ValueError, match="size"):
        build_model(tok, size="7b")
    with pytest.raises(ValueError, match="arch"):
        build_model(tok, arch="gpt2")
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("float8")


def reference_logprobs(model, prompt, response) -> np.ndarray:
    """One sequence at a time, all logits, no packing: the ground truth."""
    out = np.full(len(response), np.nan)
    if not len(prompt) + len(response):
        return out
    with torch.no_grad():
        lg = torch.log_softmax(model(torch.tensor([list(prompt) + list(response)])).logits[0].float(), -1)
    for i, y in enumerate(response):
        if len(prompt) + i - 1 >= 0:
            out[i] = lg[len(prompt) + i - 1, y].item()
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_scoring_matches_unpacked_reference_in_both_layouts(arch):
    tok = build_tokenizer(TEXTS, kind="word")
    model = build_model(tok, "0.2m", arch=arch, seed=0)
    rng = np.random.default_rng(0)
    v = len(tok)
    prompts = [rng.integers(3, v, size=n).tolist() for n in [0, 1, 5, 11, 3, 0, 7]]
    responses = [rng.integers(3, v, size=n).tolist() for n in [3, 1, 0, 6, 2, 0, 4]]
    ref = [reference_logprobs(model, p, r) for p, r in zip(prompts, responses, strict=True)]
    for layout in ("packed", "padded"):
        for budget in (8192, 9):  # one forward pass, or many small ones
            got = response_logprobs(model, prompts, responses, layout=layout, max_tokens_per_batch=budget)
            for g, r in zip(got, ref, strict=True):
                assert g.dtype == np.float32 and g.shape == r.shape
                assert np.array_equal(np.isnan(g), np.isnan(r))
                np.testing.assert_allclose(g[~np.isnan(g)], r[~np.isnan(r)], atol=2e-5)


def test_packed_layout_has_less_padding_and_resets_positions():
    prompts = [[1] * 10, [2] * 2, [3] * 3, [4] * 4]
    responses = [[5, 6], [7], [8, 9], [5]]
    packed = pack_sequences(prompts, responses, layout="packed")
    padded = pack_sequences(prompts, responses, layout="padded")
    assert packed.input_tokens < padded.input_tokens
    assert packed.tokens == padded.tokens == sum(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    assert packed.attention_mask is None and padded.attention_mask is not None
    assert int(packed.keep_mask.sum()) == int(padded.keep_mask.sum()) == 6
    # every packed sequence restarts its positions at 0
    assert int((packed.position_ids == 0).sum()) >= 4
    with pytest.raises(ValueError, match="layout"):
        pack_sequences(prompts, responses, layout="ragged")


def test_topk_scores():
    tok = build_tokenizer(TEXTS, kind="word")
    model = build_model(tok, "0.2m", seed=0)
    scores = response_logprobs(model, [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], topk=4)
    plain = response_logprobs(model, [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]])
    for s, p in zip(scores, plain, strict=True):
        assert isinstance(s, ResponseScores)
        assert s.topk_ids.shape == (len(p), 4) and s.topk_logprobs.shape == (len(p), 4)
        np.testing.assert_allclose(s.logprobs, p)
        assert np.all(np.diff(s.topk_logprobs, axis=1) <= 0)  # most likely first
        assert np.all(s.topk_logprobs[:, 0] >= s.logprobs - 1e-6)
        # a sampled token inside the top-k has the same log probability in both views
        with torch.no_grad():
            full = torch.log_softmax(model(torch.tensor([[5, 6, 7, 9]])).logits[0, 2], -1)
        np.testing.assert_allclose(scores[0].topk_logprobs[0], full[scores[0].topk_ids[0]].numpy(), atol=1e-5)
