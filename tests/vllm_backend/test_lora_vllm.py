"""A LoRA student's adapter versions on vLLM's CPU build (in .venv-vllm; skipped where vllm or PEFT is absent): after
``update_adapter`` of version v the engine generates and scores with the version-v adapter — log probs equal an HF
forward of the merged model — both on an engine with ``enable_lora`` (a ``LoRARequest`` per version) and on one without
(the adapter merged into the base weights and reloaded in place)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from vllm_helpers import ENGINE, hf_logprobs, tiny_llama_folder  # noqa: E402

from divopd import VLLMGenerator  # noqa: E402
from divopd.explore.generation import HFGenerator  # noqa: E402
from divopd.explore.vllm_engine import VLLMEngineError, lora_engine_kwargs  # noqa: E402
from divopd.learn.lora import LoraSettings, adapter_settings, add_adapter, merged_model, published_weights  # noqa: E402
from divopd.models import load_model  # noqa: E402
from explorer_helpers import env_tokenizer  # noqa: E402

ATOL = 2e-3
RANK = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("vllm-lora") / "llama", env_tokenizer("tiny"), seed=0)


def _version(folder: str, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any]:
    """An adapter version (a nonzero update: random lora_B) as the learner publishes it, and the merged HF model."""
    model, _ = load_model(folder)
    add_adapter(model, LoraSettings(rank=RANK), base=folder, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    state, settings = published_weights(model), adapter_settings(model)
    return state, settings, merged_model(model)


def _prompts(tok) -> list[list[int]]:
    texts = ["You are in the kitchen. Valid actions: move east, take coin", "take coin", "move west"]
    return [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for t in texts]


@pytest.fixture(scope="module", params=["per-request", "merged"])
def gen(request: pytest.FixtureRequest, folder: str) -> Iterator[VLLMGenerator]:
    extra = lora_engine_kwargs(RANK) if request.param == "per-request" else {}
    g = VLLMGenerator(folder, seed=0, **ENGINE, **extra)
    yield g
    g.close()


def test_each_adapter_version_generates_and_scores_as_the_merged_hf_model(gen: VLLMGenerator, folder: str) -> None:
    _, tok = load_model(folder)
    prompts = _prompts(tok)
    for version, seed in ((1, 11), (2, 12)):
        state, settings, merged = _version(folder, seed)
        assert all(".lora_" in k for k in state)
        seconds = gen.update_adapter(state, settings, version=version)
        print(f"{'enable_lora' if gen._engine_kwargs.get('enable_lora') else 'merged'}: adapter v{version} in "
              f"{seconds:.3f} s")
        assert gen.weight_version == version
        out = gen.generate(prompts, greedy=True, max_new_tokens=6)
        ref = HFGenerator(merged, tok).generate(prompts, greedy=True, max_new_tokens=6)
        assert [o.response_ids for o in out] == [r.response_ids for r in ref]
        for o, p in zip(out, prompts, strict=True):
            np.testing.assert_allclose(o.logprobs, hf_logprobs(merged, p, o.response_ids), atol=ATOL)
        responses = [o.response_ids for o in out]
        if gen._engine_kwargs.get("enable_lora"):  # the CPU build's LoRA kernel fails on prompt log probs: refused
            with pytest.raises(VLLMEngineError, match="prompt log probs under a LoRA adapter"):
                gen.score(prompts, responses)
            continue
        for lp, o, p in zip(gen.score(prompts, responses), out, prompts, strict=True):
            np.testing.assert_allclose(lp, hf_logprobs(merged, p, o.response_ids), atol=ATOL)


def test_lora_engine_options() -> None:
    assert lora_engine_kwargs(0) == {}
    assert lora_engine_kwargs(4) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    assert lora_engine_kwargs(64)["max_lora_rank"] == 64


def test_the_adapter_folder_is_what_the_engine_reads(tmp_path: Path, folder: str) -> None:
    from divopd.learn.lora import read_adapter, write_adapter

    state, settings, _ = _version(folder, 3)
    write_adapter(tmp_path / "a", state, settings)
    again, got = read_adapter(tmp_path / "a")
    assert got["r"] == RANK and sorted(again) == sorted(state)
    assert all(torch.equal(again[k], state[k]) for k in state)


def test_a_lockstep_lora_run_with_a_vllm_student_loads_each_adapter_version(tmp_path: Path) -> None:
    """`divopd train` with student.lora.rank 8 and a vLLM student engine: every published adapter version reaches the
    engine (rollouts carry it) and the checkpoint is the adapter only."""
    from vllm_helpers import RUN_ENGINE, tiny_llama_pair

    from divopd.experience.log import read_log
    from divopd.train import train
    from test_train import assert_ledger_identity, tiny_config

    models = tiny_llama_pair(tmp_path / "models")
    run_dir = tmp_path / "run"
    cfg = tiny_config(models, run_dir, "divopd", **{
        "explorer.generation.backend": "vllm", "explorer.generation.vllm": RUN_ENGINE,
        "explorer.prompt.max_prompt_tokens": 1000, "runtime.kind": "lockstep", "updates": 4,
        "runtime.lockstep.env_steps_per_update": 6, "student.lora.rank": RANK, "checkpoint.every": 4})
    summary = train(cfg)
    assert summary["updates"] == 4 and not summary["interrupted"]
    assert_ledger_identity(summary["ledger"])
    turns = list(read_log(run_dir / "experience"))
    assert max(t.turn.policy_version for t in turns) >= 2
    ckpt = run_dir / "checkpoints" / "update-000004"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
