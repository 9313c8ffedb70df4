"""GPU check of the vLLM backend's weight paths (not run by the suite: the suite's machine has no GPU).

    pip install -e '.[vllm]'          # GPU vLLM (0.33 pins torch 2.14)
    python benchmarks/gpu/check_vllm_nccl.py [--model FOLDER] [--out result.json]

On one GPU it checks the in-place path (``weight_sync="reload"``, engine in this process); with two or more GPUs also
the NCCL path (``weight_sync="nccl"``: this process sends from ``cuda:1`` into the engine's worker on ``cuda:0``
through vLLM's NCCL weight-transfer engine). For each path: generation and scores equal an HF forward of the same
weights to 2e-3; after ``update_weights`` with perturbed weights, scores equal HF with the new weights; the
publication time (median of 3). Exit code 0 when every check passes, 1 otherwise; one JSON line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

ATOL = 2e-3


def tiny_folder(out: Path) -> str:
    """A random tiny Llama of size ``0.5m`` (head_dim 64) with a byte-level tokenizer, saved under ``out``."""
    from divopd.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer(["You are in the kitchen. Valid actions: move east, take coin\nnorth south"], kind="bpe",
                          vocab_size=512)
    build_model(tok, size="0.5m", seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def check(folder: str, weight_sync: str) -> dict:
    from divopd import VLLMGenerator
    from divopd.models import load_model
    from divopd.models.scoring import response_logprobs

    model, tok = load_model(folder)
    prompts = [list(tok("You are in the kitchen.")["input_ids"]), list(tok("take coin")["input_ids"])]
    gen = VLLMGenerator(folder, dtype="float32", max_model_len=1024, weight_sync=weight_sync,
                        gpu_memory_utilization=0.3)
    out = {"weight_sync": weight_sync, "ok": True}
    try:
        gens = gen.generate(prompts, greedy=False, max_new_tokens=8, seed=0)
        responses = [g.response_ids for g in gens]
        ref = response_logprobs(model, prompts, responses)
        out["generate_max_err"] = max(float(np.abs(g.logprobs - r).max()) for g, r in zip(gens, ref, strict=True))
        out["score_max_err"] = max(float(np.abs(s - r).max()) for s, r in
                                   zip(gen.score(prompts, responses), ref, strict=True))
        times = []
        for i in range(3):
            state = {k: v + 0.05 * (i + 1) * torch.randn_like(v) for k, v in model.state_dict().items()}
            t0 = time.perf_counter()
            gen.update_weights(state)
            times.append(time.perf_counter() - t0)
        model.load_state_dict(state)
        ref = response_logprobs(model, prompts, responses)
        out["after_update_max_err"] = max(float(np.abs(s - r).max()) for s, r in
                                          zip(gen.score(prompts, responses), ref, strict=True))
        out["publish_s_median"] = statistics.median(times)
        out["ok"] = all(out[k] <= ATOL for k in ("generate_max_err", "score_max_err", "after_update_max_err"))
    except Exception as exc:  # noqa: BLE001 (a check script reports every failure as a result)
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    finally:
        gen.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model folder (default: a tiny random Llama)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("check_vllm_nccl: no CUDA GPU here; this check runs on a GPU machine", file=sys.stderr)
        return 2
    paths = ["reload"] + (["nccl"] if torch.cuda.device_count() >= 2 else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or tiny_folder(Path(tmp) / "tiny")
        results = [check(folder, path) for path in paths]
    for r in results:
        print(json.dumps(r), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
