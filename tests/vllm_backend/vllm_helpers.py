"""Shared pieces of the vLLM tests: a tiny Llama the CPU attention kernel accepts (head_dim 64), HF references, the
SmolLM2-135M folder when one has been built (``benchmarks/build_smollm2.py``), and a ``vllm serve`` process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

#: Where ``benchmarks/build_smollm2.py`` writes SmolLM2-135M-Instruct (override with DIVOPD_SMOLLM2).
SMOLLM2 = Path(os.environ.get("DIVOPD_SMOLLM2", ROOT / "cache" / "smollm2-135m"))

#: Engine options of the tests: eager (no compile), a small KV cache, prefix caching on (the default).
ENGINE = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "kv_cache_memory_bytes": 2**27}


def tiny_llama_folder(out: Path, tokenizer: Any, seed: int = 0) -> str:
    """A random-init tiny Llama of size ``0.5m`` (head_dim 64, which the CPU attention kernel accepts) saved with
    ``tokenizer`` under ``out``."""
    from divopd.models.tiny import build_model

    build_model(tokenizer, size="0.5m", seed=seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


#: Engine options of the `divopd train` runs (room for the env's longer prompts).
RUN_ENGINE = {"max_model_len": 1100, "enforce_eager": True, "kv_cache_memory_bytes": 2**27}


def tiny_llama_pair(out: Path) -> dict[str, str]:
    """The student (seed 0) and teacher (seed 1) tiny Llamas of the `divopd train` runs, on the tiny env's tokenizer,
    saved under ``out``: ``{"student": path, "teacher": path}``."""
    from explorer_helpers import env_tokenizer

    tok = env_tokenizer("tiny")
    return {name: tiny_llama_folder(out / name, tok, seed=seed) for name, seed in (("student", 0), ("teacher", 1))}


def hf_logprobs(model: Any, prompt: list[int], response: list[int]) -> np.ndarray:
    """log π(response_i | prompt, response_<i) from one HF forward (float32)."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return np.array([lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(response)], dtype=np.float32)


#: How long a server may take to answer /v1/models after its start (2 loaded cores: ~30-60 s).
START_DEADLINE_S = 420.0

#: Server options of the tests: eager, float32, a small KV cache, seeded.
SERVE_OPTIONS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(2**27), "--seed", "0"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """A ``vllm serve`` process for one model folder, in a process group of its own, ended by its PID. By default
    vLLM's OpenAI API server module serving ``folder`` as ``teacher``; ``argv``: the command to run instead (its
    ``--host``/``--port`` are added here)."""

    def __init__(self, folder: str, log: Path, max_model_len: int, argv: list[str] | None = None) -> None:
        self.folder, self.log_path, self.max_model_len = folder, log, max_model_len
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        where = ["--host", "127.0.0.1", "--port", str(self.port)]
        if self.argv is not None:
            return [*self.argv, *where]
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.folder,
                "--served-model-name", "teacher", *where, "--max-model-len", str(self.max_model_len), *SERVE_OPTIONS]

    def start(self) -> None:
        env = {**os.environ, "VLLM_CPU_CI_ENV": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine core as a child process
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"vllm serve exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as resp:
                    if json.loads(resp.read())["data"]:
                        return
            except OSError:
                time.sleep(1.0)
        self.stop()
        pytest.fail(f"vllm serve did not answer within {START_DEADLINE_S:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """End the server's process group (its engine core with it), by the server's PID; wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
