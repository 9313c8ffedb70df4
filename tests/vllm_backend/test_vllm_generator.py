"""VLLMGenerator on vLLM's CPU build (in .venv-vllm; skipped where vllm is absent): generation and scoring equal an HF
forward of the same weights, live weight updates, stop tokens and cuts, bad input, an engine that dies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm_helpers import ENGINE, SMOLLM2, hf_logprobs, tiny_llama_folder  # noqa: E402

from divopd import VLLMGenerator  # noqa: E402
from divopd.explore.generation import HFGenerator  # noqa: E402
from divopd.explore.vllm_engine import PromptTooLongError, VLLMEngineError  # noqa: E402
from divopd.explore.vllm_weights import WeightMismatchError  # noqa: E402
from divopd.models import load_model  # noqa: E402
from divopd.models.scoring import response_logprobs  # noqa: E402
from explorer_helpers import env_tokenizer  # noqa: E402

ATOL = 2e-3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("vllm") / "llama", env_tokenizer("tiny"), seed=0)


@pytest.fixture(scope="module")
def gen(folder: str) -> Iterator[VLLMGenerator]:
    g = VLLMGenerator(folder, seed=0, **ENGINE)
    yield g
    g.close()


@pytest.fixture(scope="module")
def hf(folder: str) -> tuple[Any, Any]:
    return load_model(folder)


def _prompts(tok, n: int = 4) -> list[list[int]]:
    texts = ["You are in the kitchen. Valid actions: move east, take coin", "take coin", "move west",
             "There is no coin here. Valid actions: move east"]
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
            for t in texts[:n]]


def _ids(x) -> list[int]:
    return list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x)


def test_greedy_generation_equals_hf_generate_and_hf_forward(gen, hf) -> None:
    model, tok = hf
    prompts = [_ids(p) for p in _prompts(tok)]
    ours = gen.generate(prompts, greedy=True, max_new_tokens=8, seed=0)
    ref = HFGenerator(model, tok).generate(prompts, greedy=True, max_new_tokens=8)
    for o, r, p in zip(ours, ref, prompts, strict=True):
        assert o.response_ids == r.response_ids and o.stopped == r.stopped
        np.testing.assert_allclose(o.logprobs, r.logprobs, atol=ATOL)
        np.testing.assert_allclose(o.logprobs, hf_logprobs(model, p, o.response_ids), atol=ATOL)


def test_sampled_logprobs_are_the_raw_t1_logprobs_and_a_seed_reproduces(gen, hf) -> None:
    model, tok = hf
    prompts = [_ids(p) for p in _prompts(tok)]
    for temperature in (1.0, 0.4):
        ours = gen.generate(prompts, greedy=False, temperature=temperature, max_new_tokens=10, seed=7)
        for o, p in zip(ours, prompts, strict=True):  # at T = 0.4 too: the stored log prob is at temperature 1
            np.testing.assert_allclose(o.logprobs, hf_logprobs(model, p, o.response_ids), atol=ATOL)
    again = gen.generate(prompts, greedy=False, max_new_tokens=10, seed=7)
    first = gen.generate(prompts, greedy=False, max_new_tokens=10, seed=7)
    assert [g.response_ids for g in again] == [g.response_ids for g in first]


def test_stop_tokens_are_kept_and_max_new_tokens_cuts(gen, hf) -> None:
    _, tok = hf
    prompts = [_ids(p) for p in _prompts(tok)]
    stops = set(gen.stop_ids)
    assert tok.eos_token_id in stops
    outs = gen.generate(prompts * 4, greedy=False, max_new_tokens=3, seed=1)
    for o in outs:
        assert 1 <= len(o.response_ids) <= 3 and len(o.logprobs) == len(o.response_ids)
        if o.stopped:
            assert o.response_ids[-1] in stops and not stops & set(o.response_ids[:-1])
        else:
            assert len(o.response_ids) == 3 and not stops & set(o.response_ids)
    assert any(o.stopped for o in outs) and any(not o.stopped for o in outs)


def test_score_equals_hf_with_and_without_topk(gen, hf) -> None:
    model, tok = hf
    prompts = [_ids(p) for p in _prompts(tok)]
    responses = [[7, 8, 9], [10], [11, 12, 13, 14], [tok.eos_token_id]]
    ours = gen.score(prompts, responses)
    ref = response_logprobs(model, prompts, responses)
    for o, r in zip(ours, ref, strict=True):
        np.testing.assert_allclose(o, r, atol=ATOL)
    top = gen.score_turns(prompts, responses, topk=3)
    ref_top = response_logprobs(model, prompts, responses, topk=3)
    for o, r in zip(top, ref_top, strict=True):
        np.testing.assert_allclose(o.logprobs, r.logprobs, atol=ATOL)
        np.testing.assert_array_equal(o.topk_ids, r.topk_ids)
        np.testing.assert_allclose(o.topk_logprobs, r.topk_logprobs, atol=ATOL)


def test_update_weights_then_scores_and_generations_equal_hf_with_the_new_weights(gen, hf, folder) -> None:
    model, tok = hf
    prompts = [_ids(p) for p in _prompts(tok)]
    before = gen.generate(prompts, greedy=True, max_new_tokens=6)  # fills the prefix cache with the old weights
    changed, _ = load_model(folder)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.5 * torch.randn_like(p))
    seconds = gen.update_weights(changed.state_dict())
    assert seconds >= 0 and gen.weight_version == 1
    responses = [b.response_ids for b in before]
    for o, r in zip(gen.score(prompts, responses), response_logprobs(changed, prompts, responses), strict=True):
        np.testing.assert_allclose(o, r, atol=ATOL)
    after = gen.generate(prompts, greedy=True, max_new_tokens=6)
    ref = HFGenerator(changed, tok).generate(prompts, greedy=True, max_new_tokens=6)
    assert [a.response_ids for a in after] == [r.response_ids for r in ref]
    for a, r in zip(after, ref, strict=True):
        np.testing.assert_allclose(a.logprobs, r.logprobs, atol=ATOL)
    gen.update_weights(model.state_dict())  # back to the folder's weights for the other tests
    for o, r in zip(gen.score(prompts, responses), response_logprobs(model, prompts, responses), strict=True):
        np.testing.assert_allclose(o, r, atol=ATOL)


def test_a_bad_weight_update_is_refused_and_leaves_the_engine_unchanged(gen, hf) -> None:
    model, tok = hf
    prompts, responses = [_ids(_prompts(tok, 1)[0])], [[7, 8, 9]]
    ref = gen.score(prompts, responses)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    missing = {k: v for k, v in good.items() if "layers.1.mlp" not in k}
    with pytest.raises(WeightMismatchError, match="missing .*layers.1.mlp.*engine is unchanged"):
        gen.update_weights(missing)
    misshaped = dict(good, **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(WeightMismatchError, match=r"model.norm.weight has shape \(3,\)"):
        gen.update_weights(misshaped)
    with pytest.raises(WeightMismatchError, match="unexpected .*extra.weight"):
        gen.update_weights(dict(good, **{"extra.weight": torch.zeros(2)}))
    np.testing.assert_array_equal(gen.score(prompts, responses)[0], ref[0])


def test_empty_and_over_long_prompts_are_clear_errors(gen) -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        gen.generate([[5, 6], []], greedy=True, max_new_tokens=2)
    with pytest.raises(PromptTooLongError, match="512 tokens .*max_model_len 512"):
        gen.generate([[5] * 512], greedy=True, max_new_tokens=2)
    with pytest.raises(PromptTooLongError):
        gen.score([[5] * 500], [[6] * 20])
    assert gen.generate([], greedy=True) == [] and gen.score([], []) == []
    long = gen.generate([[5] * 508], greedy=True, max_new_tokens=16)[0]  # cut at the context length
    assert len(long.response_ids) <= 4


def test_a_folder_vllm_cannot_load_and_an_unsupported_head_dim_are_one_line_errors(tmp_path) -> None:
    from divopd.models.tiny import build_model

    with pytest.raises(VLLMEngineError, match="not a model folder"):
        VLLMGenerator(str(tmp_path / "nothing"))
    (tmp_path / "no-tokenizer").mkdir()
    (tmp_path / "no-tokenizer" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(VLLMEngineError, match="no-tokenizer: cannot load the tokenizer"):
        VLLMGenerator(str(tmp_path / "no-tokenizer"), **ENGINE)
    tok = env_tokenizer("tiny")
    broken = Path(tiny_llama_folder(tmp_path / "broken", tok))
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(VLLMEngineError, match="broken: vLLM cannot load this model: .*NoSuchForCausalLM"):
        VLLMGenerator(str(broken), **ENGINE)
    build_model(tok, size="0.2m").save_pretrained(tmp_path / "h16")
    tok.save_pretrained(tmp_path / "h16")
    with pytest.raises(VLLMEngineError, match="head_dim 16 is not supported by vLLM's CPU attention kernel"):
        VLLMGenerator(str(tmp_path / "h16"), **ENGINE)
    assert "\n" not in str(VLLMEngineError("x"))


def test_an_engine_that_dies_is_rebuilt_with_the_newest_weights(folder, hf) -> None:
    model, tok = hf
    prompts, responses = [_ids(_prompts(tok, 1)[0])], [[7, 8, 9]]
    changed = {k: v + 0.1 for k, v in model.state_dict().items()}
    with VLLMGenerator(folder, seed=0, max_restarts=1, **ENGINE) as g:
        g.update_weights(changed)
        want = g.score(prompts, responses)
        g._llm.llm_engine.engine_core.shutdown()  # the engine dies under the generator
        np.testing.assert_allclose(g.score(prompts, responses)[0], want[0], atol=ATOL)  # rebuilt, weights re-applied
        assert g.restarts == 1
        g._llm.llm_engine.engine_core.shutdown()
        with pytest.raises(VLLMEngineError, match="failed during generate after 1 restarts"):
            g.generate(prompts, greedy=True, max_new_tokens=2)
    with pytest.raises(VLLMEngineError, match="score after close"):  # a closed generator is not rebuilt behind it
        g.score(prompts, responses)


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(),
                    reason="no SmolLM2-135M folder (benchmarks/build_smollm2.py)")
def test_smollm2_generation_and_scores_equal_hf() -> None:
    model, tok = load_model(str(SMOLLM2))
    prompt = tok.apply_chat_template([{"role": "user", "content": "You are in a kitchen. Take the coin."}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = _ids(prompt)
    with VLLMGenerator(str(SMOLLM2), seed=0, **{**ENGINE, "max_model_len": 1024}) as g:
        for greedy in (True, False):
            (out,) = g.generate([prompt], greedy=greedy, max_new_tokens=12, seed=3)
            np.testing.assert_allclose(out.logprobs, hf_logprobs(model, prompt, out.response_ids), atol=ATOL)
        np.testing.assert_allclose(g.score([prompt], [out.response_ids])[0],
                                   hf_logprobs(model, prompt, out.response_ids), atol=ATOL)
