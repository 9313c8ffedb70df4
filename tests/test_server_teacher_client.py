"""The teacher server client's own rules (:mod:`divopd.explore.teacher_server`) against a small in-test HTTP stand-in:
retry with backoff, the deadline, the down state, no retry of a bad request, the API key header, batching and
concurrency, the parsing of prompt log probs and generations, and the start check. The real server (``vllm serve``)
runs in ``tests/vllm_backend/test_server_teacher.py`` (``make test-vllm``)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from divopd.errors import UsageError
from divopd.explore.generation import stop_token_ids
from divopd.explore.teacher_server import (
    ServerCheckError,
    ServerClient,
    ServerSettings,
    ServerTeacher,
    ServerTeacherError,
    check_server,
    response_scores,
)
from divopd.models.tiny import build_tokenizer

Reply = tuple[int, Any]
DROP, CLOSE = -1, -2  # stand-in statuses: answer half the body then close (IncompleteRead); close at once


class StandIn:
    """An HTTP server on 127.0.0.1 whose answers come from ``self.reply(method, path, body, headers)``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any, dict[str, str]]] = []
        self.reply: Callable[[str, str, Any, dict[str, str]], Reply] = lambda *a: (200, {})
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size)) if size else None
                headers = {k.lower(): v for k, v in self.headers.items()}
                stand_in.seen.append((self.command, self.path, body, headers))
                status, payload = stand_in.reply(self.command, self.path, body, headers)
                if status == CLOSE:  # the connection closed before any answer (RemoteDisconnected)
                    self.close_connection = True
                    return
                data = json.dumps(payload).encode()
                self.send_response(200 if status == DROP else status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if status == DROP else data)  # DROP: cut mid-body
                if status == DROP:
                    self.wfile.flush()
                    self.close_connection = True

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that gave up on a hung request (the timeout test): nothing to report

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.close()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(["look around take coin go east west", "the agent moves\nnorth"], kind="word")


def fake_time() -> tuple[list[float], Callable[[float], None], Callable[[], float]]:
    """A recorded sleep that advances a fake clock (no real waiting, no timed assertion)."""
    slept: list[float] = []
    now = [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    return slept, sleep, lambda: now[0]


def models(name: str = "teacher") -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "max_model_len": 64}]}


def test_a_failed_request_is_retried_with_doubling_backoff(stand_in: StandIn) -> None:
    answers = iter([(503, {"error": {"message": "busy"}}), (502, {}), (200, {"ok": 1})])
    stand_in.reply = lambda *a: next(answers)
    slept, sleep, clock = fake_time()
    client = ServerClient(ServerSettings(url=stand_in.url, backoff_s=0.5, retries=5), sleep=sleep, clock=clock)
    assert client.call("GET", "/v1/models") == {"ok": 1}
    assert slept == [0.5, 1.0] and client.retried == 2 and len(stand_in.seen) == 3


def test_retries_stop_at_the_deadline_and_the_server_counts_as_down(stand_in: StandIn) -> None:
    stand_in.reply = lambda *a: (503, {"error": {"message": "engine restarting"}})
    slept, sleep, clock = fake_time()
    client = ServerClient(ServerSettings(url=stand_in.url, backoff_s=1.0, deadline_s=6.0), sleep=sleep, clock=clock)
    with pytest.raises(ServerTeacherError, match=r"HTTP 503: engine restarting \(after 4 attempts in 6.0 s\)"):
        client.call("GET", "/v1/models")
    assert slept == [1.0, 2.0, 3.0]  # the third wait (4 s) is cut to end at the 6 s deadline: one last attempt there
    stand_in.seen.clear()
    with pytest.raises(ServerTeacherError, match="after 1 attempt "):  # down: one attempt, no backoff
        client.call("GET", "/v1/models")
    assert len(stand_in.seen) == 1 and slept == [1.0, 2.0, 3.0]
    stand_in.reply = lambda *a: (200, models())
    assert client.models()[0]["id"] == "teacher"  # a success clears the down state
    stand_in.reply = lambda *a: (503, {})
    with pytest.raises(ServerTeacherError, match="after 4 attempts"):
        client.call("GET", "/v1/models")


def test_by_default_a_request_is_retried_until_the_deadline(stand_in: StandIn) -> None:
    """``retries`` unset: a server restarting for minutes is retried for the whole ``deadline_s`` (default 300 s),
    waits doubling up to MAX_BACKOFF_S, the last one cut to end at the deadline."""
    from divopd.explore.teacher_server import MAX_BACKOFF_S

    stand_in.reply = lambda *a: (503, {})
    slept, sleep, clock = fake_time()
    settings = ServerSettings(url=stand_in.url)
    assert settings.retries is None and settings.deadline_s == 300.0
    client = ServerClient(settings, sleep=sleep, clock=clock)
    with pytest.raises(ServerTeacherError, match=r"after \d+ attempts in 300.0 s"):
        client.call("GET", "/v1/models")
    assert slept[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_BACKOFF_S] and max(slept) == MAX_BACKOFF_S
    assert sum(slept) == pytest.approx(300.0) and len(stand_in.seen) == len(slept) + 1


def test_the_retry_count_bounds_the_attempts(stand_in: StandIn) -> None:
    stand_in.reply = lambda *a: (500, {})
    slept, sleep, clock = fake_time()
    client = ServerClient(ServerSettings(url=stand_in.url, retries=2, deadline_s=1e6), sleep=sleep, clock=clock)
    with pytest.raises(ServerTeacherError, match="after 3 attempts"):
        client.call("GET", "/v1/models")
    assert len(stand_in.seen) == 3


def test_a_bad_request_is_not_retried_and_its_message_is_kept(stand_in: StandIn) -> None:
    stand_in.reply = lambda *a: (400, {"error": {"message": "This model's maximum context length is 64 tokens"}})
    slept, sleep, clock = fake_time()
    client = ServerClient(ServerSettings(url=stand_in.url), sleep=sleep, clock=clock)
    with pytest.raises(ServerTeacherError, match="HTTP 400: This model's maximum context length is 64 tokens"):
        client.call("POST", "/v1/completions", {"prompt": [1]})
    assert len(stand_in.seen) == 1 and slept == []


def test_a_request_past_its_timeout_is_retried(stand_in: StandIn) -> None:
    release = threading.Event()
    calls = []

    def reply(*a: object) -> Reply:
        calls.append(1)
        if len(calls) == 1:
            release.wait(10)  # the first request hangs past the client's timeout
        return 200, models()

    stand_in.reply = reply
    slept, sleep, clock = fake_time()
    client = ServerClient(ServerSettings(url=stand_in.url, timeout_s=0.3), sleep=sleep, clock=clock)
    try:
        assert client.models()[0]["id"] == "teacher"
    finally:
        release.set()
    assert client.retried == 1 and len(calls) == 2


def test_the_api_key_comes_from_the_named_environment_variable(stand_in: StandIn,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in.reply = lambda *a: (200, models())
    settings = ServerSettings(url=stand_in.url, api_key_env="DIVOPD_TEST_TEACHER_KEY")
    monkeypatch.delenv("DIVOPD_TEST_TEACHER_KEY", raising=False)
    with pytest.raises(ServerCheckError, match="DIVOPD_TEST_TEACHER_KEY is not set"):
        ServerClient(settings)
    monkeypatch.setenv("DIVOPD_TEST_TEACHER_KEY", "sk-secret")
    ServerClient(settings).models()
    assert stand_in.seen[-1][3]["authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in json.dumps(settings.model_dump())
    ServerClient(ServerSettings(url=stand_in.url)).models()
    assert "authorization" not in stand_in.seen[-1][3]


def entry(token: int, lp: float, rank: int) -> dict[str, Any]:
    return {str(token): {"logprob": lp, "rank": rank, "decoded_token": "x"}}


def test_prompt_logprobs_are_cut_to_the_response_with_its_top_k() -> None:
    prompt_logprobs = [None, entry(5, -1.0, 2), {**entry(7, -0.5, 1), **entry(9, -2.5, 3), **entry(4, -1.5, 2)},
                       {**entry(3, -0.25, 1), **entry(8, -3.0, 2)}]
    scores = response_scores(prompt_logprobs, 2, [7, 3], topk=2)
    lps, ids, tlp = scores.logprobs, scores.topk_ids, scores.topk_logprobs
    assert lps.dtype == np.float32 and lps.tolist() == [-0.5, -0.25]
    assert ids.tolist() == [[7, 4], [3, 8]] and tlp.tolist() == [[-0.5, -1.5], [-0.25, -3.0]]
    scores = response_scores(prompt_logprobs, 0, [1, 5], topk=0)
    lps = scores.logprobs
    assert scores.topk_ids is None and scores.topk_logprobs is None
    assert np.isnan(lps[0]) and lps[1] == -1.0  # position 0 has no context
    with pytest.raises(ValueError, match="no log prob for response token 6"):
        response_scores(prompt_logprobs, 1, [6], topk=0)


def completions_reply(concurrent: list[int], barrier: threading.Barrier | None = None) -> Callable[..., Reply]:
    """Answers /v1/models and a scoring /v1/completions whose log prob of token t at any position is -t/100."""
    lock, inflight = threading.Lock(), [0]

    def reply(method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if path == "/v1/models":
            return 200, models()
        with lock:
            inflight[0] += 1
            concurrent.append(inflight[0])
            wait = barrier is not None and len(concurrent) <= barrier.parties  # the first requests meet there
        if wait:
            barrier.wait()
        choices = [{"index": i, "text": "", "prompt_logprobs": [None] + [entry(t, -t / 100, 1) for t in seq[1:]]}
                   for i, seq in enumerate(body["prompt"])]
        with lock:
            inflight[0] -= 1
        return 200, {"choices": list(reversed(choices))}  # any order: the client sorts by index

    return reply


def test_turns_are_batched_per_request_and_sent_concurrently(stand_in: StandIn, tokenizer: Any) -> None:
    concurrent: list[int] = []
    stand_in.reply = completions_reply(concurrent, threading.Barrier(2, timeout=30))
    teacher = ServerTeacher(ServerSettings(url=stand_in.url, max_turns_per_request=2, max_concurrency=2, retries=0),
                            tokenizer)
    prompts = [[1, 2], [3], [4, 5, 6], [7], [8, 9]]
    responses = [[10, 11], [12], [13, 14, 15], [16], []]
    out = teacher.score_turns(prompts, responses)
    teacher.close()
    posts = [s for s in stand_in.seen if s[1] == "/v1/completions"]
    assert sorted(len(b["prompt"]) for _, _, b, _ in posts) == [1, 2, 2]  # 5 turns, 2 per request
    assert all(b["model"] == "teacher" and b["max_tokens"] == 1 and b["prompt_logprobs"] == 0 for _, _, b, _ in posts)
    for scores, r in zip(out, responses, strict=True):
        assert scores.topk_ids is None and scores.logprobs.dtype == np.float32
        np.testing.assert_array_equal(scores.logprobs, np.array([-t / 100 for t in r], dtype=np.float32))
    assert max(concurrent) == 2  # the barrier lets the first request through only with a second one in flight


def test_a_failed_group_fails_the_call(stand_in: StandIn, tokenizer: Any) -> None:
    stand_in.reply = lambda m, p, *a: (200, models()) if p == "/v1/models" else (400, {"message": "bad"})
    teacher = ServerTeacher(ServerSettings(url=stand_in.url), tokenizer)
    with pytest.raises(ServerTeacherError, match="HTTP 400: bad"):
        teacher.score_turns([[1]], [[2]])
    stand_in.reply = lambda m, p, *a: (200, models()) if p == "/v1/models" else (200, {"choices": [{"index": 0}]})
    with pytest.raises(ServerTeacherError, match="no prompt_logprobs"):
        teacher.score_turns([[1]], [[2]])


def test_generate_sends_one_seeded_request_per_row_with_the_stop_tokens(stand_in: StandIn, tokenizer: Any) -> None:
    def reply(method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if path == "/v1/models":
            return 200, models()
        n = body["prompt"][-1]
        return 200, {"choices": [{"index": 0, "text": "x", "token_ids": [n, n + 1], "finish_reason": "stop",
                                  "logprobs": {"token_logprobs": [-0.5, -0.75], "tokens": ["a", "b"]}}]}

    stand_in.reply = reply
    teacher = ServerTeacher(ServerSettings(url=stand_in.url), tokenizer)
    gens = teacher.generate([[1, 2], [3, 4], [1, 2]], greedy=False, temperature=0.7, max_new_tokens=8, seed=5)
    assert [g.response_ids for g in gens] == [[2, 3], [4, 5], [2, 3]] and all(g.stopped for g in gens)
    assert gens[0].logprobs.dtype == np.float32 and gens[0].logprobs.tolist() == [-0.5, -0.75]
    bodies = [b for _, p, b, _ in stand_in.seen if p == "/v1/completions"]
    assert len(bodies) == 3 and len({b["seed"] for b in bodies}) == 3  # one seed per row, also for equal prompts
    assert all(b["stop_token_ids"] == stop_token_ids(tokenizer, True) and b["return_token_ids"]
               and b["logprobs"] == 0 and b["temperature"] == 0.7 for b in bodies)
    assert len(bodies[0]["stop_token_ids"]) > 1  # eos and the newline tokens
    again = teacher.generate([[1, 2]], greedy=True, temperature=1.0, max_new_tokens=100, seed=5)
    body = [b for _, p, b, _ in stand_in.seen if p == "/v1/completions"][-1]
    assert again[0].response_ids == [2, 3] and body["temperature"] == 0.0 and body["max_tokens"] == 62  # 64 - 2


def test_the_start_check(stand_in: StandIn, tokenizer: Any) -> None:
    text_ids: dict[str, list[int]] = {}

    def reply(method: str, path: str, body: Any, headers: dict[str, str]) -> Reply:
        if path == "/v1/models":
            return 200, models("served")
        if path == "/tokenize":
            text_ids["sent"] = tokenizer.encode(body["prompt"], add_special_tokens=False)
            return 200, {"tokens": text_ids.get("answer", text_ids["sent"])}
        return 404, {"detail": "Not Found"}

    stand_in.reply = reply
    line = check_server(ServerSettings(url=stand_in.url), tokenizer, "folder")
    assert line.endswith("serves served (max_model_len 64; tokenizer matches folder)")
    text_ids["answer"] = [0, 1, 2]
    with pytest.raises(ServerCheckError, match="teacher.path: folder does not tokenize like the model served"):
        check_server(ServerSettings(url=stand_in.url), tokenizer, "folder")
    with pytest.raises(ServerCheckError, match="'other' is not served by .* \\(it serves served\\)$"):
        check_server(ServerSettings(url=stand_in.url, model="other"), tokenizer, "folder")
    stand_in.reply = lambda m, p, *a: (200, models("served")) if p == "/v1/models" else (404, {"detail": "x"})
    assert "no /tokenize: tokenizer not probed" in check_server(ServerSettings(url=stand_in.url), tokenizer, "f")

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(ServerCheckError, match="start the teacher server first") as down:
        check_server(ServerSettings(url=url, retries=3), tokenizer, "folder")
    assert isinstance(down.value, UsageError) and "\n" not in str(down.value) and "after 1 attempt " in str(down.value)
    with pytest.raises(ServerCheckError, match="teacher.server.url: teacher server http://no-such-host.invalid"):
        check_server(ServerSettings(url="http://no-such-host.invalid:8000", timeout_s=5), tokenizer, "folder")


@pytest.mark.parametrize("fault", [DROP, CLOSE], ids=["dropped-mid-body", "closed-before-answering"])
def test_a_connection_dropped_mid_answer_is_retried(stand_in: StandIn, fault: int) -> None:
    """``http.client.IncompleteRead`` (the body cut short) and ``RemoteDisconnected`` (closed before the status line)
    are transient like a refused connection: retried, and the call gets the answer."""
    answers = iter([(fault, models()), (200, models())])
    stand_in.reply = lambda *a: next(answers)
    slept, sleep, clock = fake_time()
    client = ServerClient(ServerSettings(url=stand_in.url, backoff_s=0.5), sleep=sleep, clock=clock)
    assert client.models()[0]["id"] == "teacher"
    assert client.retried == 1 and slept == [0.5] and len(stand_in.seen) == 2
