"""Teacher scoring tokens/s: in-process (HF forward, vLLM engine) vs an OpenAI-compatible teacher server (``vllm
serve``), side by side in one run, on the same model and the same turns.

The turns are multi-turn-like: ``--turns`` prompts that grow by one turn each (prompt t = a shared system part + the
first t history chunks, so consecutive prompts share their prefix, as an explorer's do), each with a ``--response``
token response; token ids drawn from the model's vocabulary with a fixed seed. Each backend scores all of them with
its ``score_turns`` (top-k 0) after one warm-up call; the median of ``--repeats`` timed calls is reported as scored
tokens/s (prompt + response tokens: what the teacher computes) and response tokens/s (what the learner receives).
The backends run one after another (never two at once on the machine); the server is started by the benchmark on
127.0.0.1 (``vllm.entrypoints.openai.api_server``, the module ``vllm serve`` runs) and stopped after, or given with
``--url``.

    .venv-vllm/bin/python benchmarks/teacher_server.py                      # SmolLM2-135M (cache/smollm2-135m)
    .venv-vllm/bin/python benchmarks/teacher_server.py --model PATH --json out.json

Needs vllm (``make setup-vllm``) for the vLLM rows; ``--backends hf,server --url URL`` needs only a running server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "cache" / "smollm2-135m"


def make_turns(vocab: int, n: int, system: int, chunk: int, response: int, seed: int = 0) -> tuple[list, list]:
    """``n`` (prompt, response) id lists: prompt t = ``system`` ids + ``t + 1`` history chunks of ``chunk`` ids."""
    import numpy as np

    rng = np.random.default_rng(seed)
    base = rng.integers(10, vocab, size=system).tolist()
    history = rng.integers(10, vocab, size=chunk * n).tolist()
    prompts = [base + history[: chunk * (t + 1)] for t in range(n)]
    responses = [rng.integers(10, vocab, size=response).tolist() for _ in range(n)]
    return prompts, responses


def timed(teacher: Any, prompts: list, responses: list, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``score_turns`` after one warm-up call."""
    teacher.score_turns(prompts, responses)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        teacher.score_turns(prompts, responses)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(model: str, max_model_len: int, log: Path, deadline_s: float = 600.0) -> tuple[Any, str]:
    """A ``vllm serve`` process for ``model`` on a free loopback port, once it answers ``/v1/models``."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name",
           "teacher", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
           "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes", str(2**29)]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url, end = f"http://127.0.0.1:{port}/v1", time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5):
                return proc, url
        except OSError:
            time.sleep(1.0)
    stop_server(proc)
    raise SystemExit(f"vllm serve did not answer within {deadline_s:.0f} s; see {log}")


def stop_server(proc: Any) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from divopd.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    prompts, responses = make_turns(len(tok), args.turns, args.system, args.chunk, args.response)
    n_resp = sum(len(r) for r in responses)
    n_all = n_resp + sum(len(p) for p in prompts)
    max_len = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True)) + 8
    rows = []

    def add(backend: str, seconds: float, note: str) -> None:
        rows.append({"backend": backend, "seconds": round(seconds, 3), "scored_tok_s": round(n_all / seconds),
                     "response_tok_s": round(n_resp / seconds), "note": note})
        print(f"  {backend}: {seconds:.2f} s", file=sys.stderr, flush=True)

    backends = args.backends.split(",")
    if "hf" in backends:
        from divopd.explore.teacher import HFTeacher

        teacher = HFTeacher(model.eval(), tok, max_tokens_per_batch=8192)
        add("hf (in-process)", timed(teacher, prompts, responses, args.repeats), "packed no-grad forward")
    del model
    if "vllm" in backends:
        from divopd.explore.vllm_engine import VLLMGenerator

        with VLLMGenerator(args.model, dtype="float32", max_model_len=max_len, enforce_eager=True,
                           kv_cache_memory_bytes=2**29) as gen:
            add("vllm (in-process)", timed(gen, prompts, responses, args.repeats), "engine in this process")
    if "server" in backends:
        from divopd.explore.teacher_server import ServerSettings, ServerTeacher

        proc, url = (None, args.url) if args.url else start_server(args.model, max_len, Path(args.server_log))
        try:
            teacher = ServerTeacher(ServerSettings(url=url, max_concurrency=args.concurrency,
                                                   max_turns_per_request=args.per_request), tok)
            add("server (vllm serve)", timed(teacher, prompts, responses, args.repeats),
                f"{args.per_request} turns/request, {args.concurrency} in flight")
            teacher.close()
        finally:
            if proc is not None:
                stop_server(proc)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(SMOLLM2), help="model folder (default: cache/smollm2-135m)")
    parser.add_argument("--backends", default="hf,vllm,server")
    parser.add_argument("--url", help="an already running server of the same model (else one is started)")
    parser.add_argument("--turns", type=int, default=32)
    parser.add_argument("--system", type=int, default=128, help="shared prompt ids")
    parser.add_argument("--chunk", type=int, default=24, help="ids each history turn adds")
    parser.add_argument("--response", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the HF backend")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--per-request", type=int, default=16)
    parser.add_argument("--server-log", default="/tmp/divopd-teacher-server.log")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if not Path(args.model, "config.json").is_file():
        raise SystemExit(f"--model {args.model}: not a model folder (make test-vllm builds cache/smollm2-135m)")
    rows = run(args)
    print(f"\nmodel {Path(args.model).name}, {args.turns} turns, prompts {args.system + args.chunk}.."
          f"{args.system + args.chunk * args.turns} + {args.response} response tokens, median of {args.repeats}\n")
    print("| backend | s per call | scored tok/s | response tok/s | note |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['seconds']} | {r['scored_tok_s']} | {r['response_tok_s']} | {r['note']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
