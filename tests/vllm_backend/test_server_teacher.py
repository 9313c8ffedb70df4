"""``teacher.backend: server`` against a real ``vllm serve`` process (vLLM's OpenAI-compatible server, CPU build, on
127.0.0.1): scores equal the in-process HF teacher (a tiny Llama and SmolLM2-135M), generation, `divopd train` under
lockstep and threads, two runs against one server at once, and the faults: down at start, wrong model, slow (timeout
→ retry), killed mid-run (clean stop with a checkpoint, exit 3; ``--resume`` once it is back).

Server starts are the cost (30-60 s each on 2 cores): the tiny Llama's server starts once for the module (and once
more in the last test, which kills it), SmolLM2's once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("vllm")

from vllm_helpers import ROOT, SMOLLM2, Served, free_port, hf_logprobs, tiny_llama_pair  # noqa: E402

from divopd.cli import main  # noqa: E402
from divopd.experience.log import read_log  # noqa: E402
from divopd.explore.teacher import HFTeacher  # noqa: E402
from divopd.explore.teacher_server import ServerSettings, ServerTeacher, check_server  # noqa: E402
from divopd.models import load_model  # noqa: E402
from divopd.train import train  # noqa: E402
from test_train import assert_ledger_identity, read_metrics, tiny_config  # noqa: E402

ATOL = 2e-3
@pytest.fixture(scope="module")
def llama_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return tiny_llama_pair(tmp_path_factory.mktemp("server-models"))


@pytest.fixture(scope="module")
def server(llama_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = Served(llama_models["teacher"], tmp_path_factory.mktemp("serve") / "vllm-serve.log", 1100)
    served.start()
    yield served
    served.stop()


def server_config(models: dict[str, str], run_dir: Path, url: str, **over: object) -> Any:
    return tiny_config(models, run_dir, "divopd", **{
        "teacher.backend": "server", "teacher.server.url": url, "teacher.server.deadline_s": 20,
        "teacher.server.backoff_s": 0.5, "explorer.prompt.max_prompt_tokens": 1000, **over})


def turn_pairs(tok: Any) -> tuple[list[list[int]], list[list[int]]]:
    texts = [("You are an agent. Valid actions: move east", "take coin"), ("move west", "move east take coin"),
             ("take", "coin"), ("You are an agent. Valid actions: take coin move east west", "west")]
    return ([tok.encode(p, add_special_tokens=False) for p, _ in texts],
            [tok.encode(r, add_special_tokens=False) for _, r in texts])


def assert_scores_equal(server_out: list, hf_out: list, topk: int) -> None:
    assert len(server_out) == len(hf_out)
    for ours, ref in zip(server_out, hf_out, strict=True):
        assert ours.logprobs.dtype == np.float32 and ours.logprobs.shape == ref.logprobs.shape
        np.testing.assert_allclose(ours.logprobs, ref.logprobs, atol=ATOL)
        if topk:
            np.testing.assert_allclose(ours.topk_logprobs, ref.topk_logprobs, atol=ATOL)
            assert (ours.topk_ids[:, 0] == ref.topk_ids[:, 0]).all()  # the most likely token


def test_server_scores_equal_the_in_process_hf_teacher(server: Served, llama_models: dict[str, str]) -> None:
    model, tok = load_model(llama_models["teacher"])
    hf = HFTeacher(model, tok, max_tokens_per_batch=4096)
    teacher = ServerTeacher(ServerSettings(url=server.url, max_turns_per_request=3, max_concurrency=2), tok)
    assert teacher.model == "teacher" and teacher.max_model_len == 1100
    prompts, responses = turn_pairs(tok)
    for topk in (0, 5):
        assert_scores_equal(teacher.score_turns(prompts, responses, topk=topk),
                            hf.score_turns(prompts, responses, topk=topk), topk)
    gens = teacher.generate(prompts, greedy=False, temperature=1.0, max_new_tokens=6, seed=3)
    for p, g in zip(prompts, gens, strict=True):  # raw (T = 1) log probs of the sampled tokens
        assert 1 <= len(g.response_ids) <= 6 and g.logprobs.dtype == np.float32
        np.testing.assert_allclose(g.logprobs, hf_logprobs(model, p, g.response_ids), atol=ATOL)
        assert g.stopped == (g.response_ids[-1] in teacher.stop_ids)
    again = teacher.generate(prompts, greedy=False, temperature=1.0, max_new_tokens=6, seed=3)
    assert [g.response_ids for g in again] == [g.response_ids for g in gens]  # seeded per row
    teacher.close()


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="no SmolLM2-135M folder (make test-vllm builds it)")
def test_smollm2_server_scores_equal_hf(tmp_path: Path) -> None:
    served = Served(str(SMOLLM2), tmp_path / "smollm2-serve.log", 512)
    served.start()
    try:
        model, tok = load_model(str(SMOLLM2))
        assert "tokenizer matches" in check_server(ServerSettings(url=served.url), tok, str(SMOLLM2))
        hf = HFTeacher(model, tok, max_tokens_per_batch=4096)
        teacher = ServerTeacher(ServerSettings(url=served.url, max_turns_per_request=2), tok)
        prompts = [tok.encode(t) for t in ("The capital of France is", "You are in a kitchen. You see a", "2 + 2 =")]
        responses = [tok.encode(t, add_special_tokens=False) for t in (" Paris, a city", " fridge.", " 4")]
        assert_scores_equal(teacher.score_turns(prompts, responses, topk=5),
                            hf.score_turns(prompts, responses, topk=5), 5)
        teacher.close()
    finally:
        served.stop()


@pytest.mark.parametrize("kind", ["lockstep", "threads"])
def test_a_few_updates_with_the_server_teacher(server: Served, llama_models: dict[str, str], tmp_path: Path,
                                              kind: str) -> None:
    run_dir = tmp_path / kind
    cfg = server_config(llama_models, run_dir, server.url, **{"runtime.kind": kind, "updates": 4,
                                                              "runtime.lockstep.env_steps_per_update": 6})
    summary = train(cfg)
    assert summary["updates"] == 4 and not summary["interrupted"] and not summary.get("stalled")
    assert_ledger_identity(summary["ledger"])
    assert [r["update"] for r in read_metrics(run_dir) if r["kind"] == "update"] == [1, 2, 3, 4]
    turns = [t.turn for t in read_log(run_dir / "experience")]
    assert turns and all(t.teacher_logprobs is not None and np.isfinite(t.teacher_logprobs).all() for t in turns)


def write_config(cfg: Any, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def cli(*args: str) -> subprocess.Popen[str]:
    """``divopd train ...`` as a process of its own (this worktree's sources first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "divopd.cli", "train", *args, "--no-progress"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_runs_score_against_one_server_at_once(server: Served, llama_models: dict[str, str],
                                                   tmp_path: Path) -> None:
    procs = []
    for seed in (0, 1):
        cfg = server_config(llama_models, tmp_path / f"seed{seed}", server.url, **{
            "seed": seed, "runtime.kind": "lockstep", "updates": 3, "runtime.lockstep.env_steps_per_update": 6})
        procs.append(cli(str(write_config(cfg, tmp_path / f"seed{seed}.yaml"))))
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert "serves teacher (max_model_len 1100; tokenizer matches" in err  # the run states the server's model
        assert json.loads(out)["updates"] == 3
    for seed in (0, 1):
        turns = [t.turn for t in read_log(tmp_path / f"seed{seed}" / "experience")]
        assert turns and all(t.teacher_logprobs is not None for t in turns)


def one_line_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["train", *args, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="no SmolLM2-135M folder (make test-vllm builds it)")
def test_down_or_wrong_model_is_one_line_and_exit_2_before_the_run_directory(
        server: Served, llama_models: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    down = server_config(llama_models, run_dir, f"http://127.0.0.1:{free_port()}")
    assert "start the teacher server first" in one_line_exit_2([str(write_config(down, tmp_path / "d.yaml"))], capsys)
    other = {**llama_models, "teacher": str(SMOLLM2)}  # another model's folder: its tokenizer is not the served one
    wrong = server_config(other, run_dir, server.url)
    err = one_line_exit_2([str(write_config(wrong, tmp_path / "w.yaml"))], capsys)
    assert f"teacher.path: {SMOLLM2} does not tokenize like the model teacher served at" in err
    name = server_config(llama_models, run_dir, server.url, **{"teacher.server.model": "qwen"})
    err = one_line_exit_2([str(write_config(name, tmp_path / "n.yaml"))], capsys)
    assert "teacher.server.model: 'qwen' is not served by" in err
    assert not run_dir.exists()


class SlowProxy:
    """A proxy in front of the real server that holds the first ``hold`` completions requests past the client's
    timeout (then forwards them: the client has given up by then) and forwards everything else at once."""

    def __init__(self, target: str, hold: int, hold_s: float) -> None:
        self.completions = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else None
                if self.path.endswith("/completions"):
                    proxy.completions += 1
                    if proxy.completions <= hold:
                        time.sleep(hold_s)
                req = urllib.request.Request(target + self.path, data=body, method=self.command,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as resp:
                    data = resp.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # the held request's client is gone

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_slow_server_times_out_and_the_request_is_retried(server: Served, llama_models: dict[str, str]) -> None:
    _, tok = load_model(llama_models["teacher"])
    proxy = SlowProxy(server.url.removesuffix("/v1"), hold=1, hold_s=4.0)
    try:
        prompts, responses = turn_pairs(tok)
        direct = ServerTeacher(ServerSettings(url=server.url), tok).score_turns(prompts, responses)
        slow = ServerTeacher(ServerSettings(url=proxy.url, timeout_s=1.5, backoff_s=0.1), tok)
        out = slow.score_turns(prompts, responses)
        assert slow.client.retried == 1 and proxy.completions == 2
        for a, b in zip(out, direct, strict=True):
            np.testing.assert_array_equal(a.logprobs, b.logprobs)
    finally:
        proxy.close()


def wait_for_update(run_dir: Path, proc: subprocess.Popen[str], deadline_s: float = 600.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and '"kind":"update"' in metrics.read_text():
            return
        time.sleep(0.2)
    pytest.fail(f"no update within {deadline_s:.0f} s (exit {proc.poll()})")


def test_a_server_killed_mid_run_stops_it_cleanly_and_resume_continues(
        server: Served, llama_models: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Last in the module: it kills the module's server and starts it again."""
    run_dir = tmp_path / "killed"
    cfg = server_config(llama_models, run_dir, server.url, **{
        "runtime.kind": "lockstep", "updates": 40, "runtime.lockstep.env_steps_per_update": 6,
        "teacher.server.deadline_s": 3, "teacher.server.timeout_s": 5, "checkpoint.every": 1})
    proc = cli(str(write_config(cfg, tmp_path / "k.yaml")))
    wait_for_update(run_dir, proc)
    server.stop(signal.SIGKILL)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 3, err[-2000:]
    summary = json.loads(out)
    assert "stalled at teacher scoring" in summary["stalled"] and 1 <= summary["updates"] < 40
    assert "resume with `divopd train --resume" in err.strip().splitlines()[-1]
    down = one_line_exit_2(["--resume", str(run_dir)], capsys)  # still down: refused at start
    assert "start the teacher server first" in down
    server.start()
    proc = cli("--resume", str(run_dir))
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-2000:]
    resumed = json.loads(out)
    assert resumed["updates"] == 40 and resumed["resumed"] and not resumed.get("stalled")
    assert_ledger_identity(resumed["ledger"])
    updates = [r["update"] for r in read_metrics(run_dir) if r["kind"] == "update"]
    assert updates[-1] == 40
