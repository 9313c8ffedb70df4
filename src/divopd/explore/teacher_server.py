"""The teacher as an OpenAI-compatible completions server (``teacher.backend: server``, e.g. ``vllm serve`` shared by
any number of runs): :class:`ServerTeacher`, its HTTP client and the start check. Token ids go in, never text."""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from divopd.errors import UsageError
from divopd.explore.scoring import ResponseScores, cut_prompt_logprobs

if TYPE_CHECKING:
    from divopd.explore.generation import Generation

__all__ = ["MAX_BACKOFF_S", "ServerClient", "ServerCheckError", "ServerSettings", "ServerTeacher", "ServerTeacherError",
           "check_server", "probe_text", "response_scores", "served_model"]

log = logging.getLogger(__name__)


class ServerSettings(BaseModel):
    """Where the teacher server is and how divopd talks to it (``teacher.backend: server``)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field("http://127.0.0.1:8000", description="Base URL of the OpenAI-compatible server (with or "
                     "without the trailing /v1), e.g. the one `vllm serve` prints.")
    model: str | None = Field(None, description="Served model name sent with every request; None = the first "
                              "(only) model the server's /v1/models lists.")
    api_key_env: str | None = Field(None, description="Name of the environment variable that holds the API key "
                                    "(sent as Authorization: Bearer); None = no key. The key itself never goes in "
                                    "the config.")
    max_concurrency: int = Field(4, ge=1, description="Requests in flight at once per teacher (a thread pool).")
    max_turns_per_request: int = Field(16, ge=1, description="Turns scored in one completions request (the "
                                       "prompt list of one request).")
    timeout_s: float = Field(120.0, gt=0, description="Socket timeout of one request (connect and each read).")
    retries: int | None = Field(None, ge=0, description="At most this many retries of a failed request (refused, "
                                "timed out, dropped mid-answer, HTTP 5xx or 429); None = as many as fit in "
                                "deadline_s. Either way no retry starts past deadline_s.")
    backoff_s: float = Field(1.0, ge=0, description="First backoff before a retry; doubled after each retry, at "
                             "most 30 s.")
    deadline_s: float = Field(300.0, gt=0, description="A failed request is retried until this many seconds have "
                              "passed since its scoring or generate call began; then the call gives up and its turns "
                              "are left unscored (the loop watchdog stops a run whose teacher cannot score: "
                              "runtime.stall_timeout_s).")


class ServerTeacherError(RuntimeError):
    """A request to the teacher server failed: refused, an error status, or no answer within the deadline."""


class ServerCheckError(UsageError):
    """The start check failed (server down, bad URL, model not served, another tokenizer): one line, exit 2."""


#: The longest wait between two attempts: a server restarting for minutes is asked at least this often.
MAX_BACKOFF_S = 30.0

#: HTTP statuses worth retrying (the server is busy or restarting); any other 4xx is the request's fault.
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class ServerClient:
    """JSON over HTTP to one server. A failed request (refused, timed out, dropped, HTTP 5xx / 429) is retried with
    exponential backoff (up to :data:`MAX_BACKOFF_S`) until ``deadline_s`` has passed since the call began. After a
    failed call the server counts as down: one attempt per request until one succeeds, so a dead server costs one
    ``deadline_s``, not one per turn. The API key (``api_key_env``) is never logged."""

    def __init__(self, settings: ServerSettings, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        base = settings.url.strip().rstrip("/")
        self.base = base[: -len("/v1")] if base.endswith("/v1") else base
        self._headers = {"Content-Type": "application/json"}
        if settings.api_key_env:
            key = os.environ.get(settings.api_key_env)
            if not key:
                raise ServerCheckError(f"teacher.server.api_key_env: the environment variable "
                                         f"{settings.api_key_env} is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self._sleep, self._clock = sleep, clock
        self._down = threading.Event()  # set after a call failed: one attempt per request until one succeeds
        self.retried = 0

    def _once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=self._headers)
        with urllib.request.urlopen(req, timeout=self.settings.timeout_s) as resp:  # noqa: S310 (a configured URL)
            return json.loads(resp.read().decode())

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, *, retry: bool = True) -> Any:
        """The decoded JSON answer of ``method path``; :class:`ServerTeacherError` once the deadline (or ``retries``)
        is spent, or at once on a status not worth retrying."""
        s = self.settings
        start = self._clock()
        attempt, wait = 0, s.backoff_s
        while True:
            try:
                answer = self._once(method, path, body)
                self._down.clear()
                return answer
            except urllib.error.HTTPError as exc:
                detail = _http_detail(exc)
                if exc.code not in _RETRY_STATUS:
                    raise ServerTeacherError(f"teacher server {self.base}{path}: HTTP {exc.code}: {detail}") from None
                problem = f"HTTP {exc.code}: {detail}"
            except (TimeoutError, urllib.error.URLError, http.client.HTTPException, OSError,
                    json.JSONDecodeError) as exc:  # HTTPException: IncompleteRead, a connection dropped mid-answer
                problem = _reason(exc)
            elapsed = self._clock() - start
            left = s.deadline_s - elapsed
            spent = s.retries is not None and attempt >= s.retries
            if not retry or self._down.is_set() or spent or left <= 0:
                self._down.set()
                raise ServerTeacherError(f"teacher server {self.base}{path}: {problem} (after {attempt + 1} "
                                         f"attempt{'s' if attempt else ''} in {elapsed:.1f} s)")
            attempt += 1
            self.retried += 1
            pause = min(wait, left)  # the last attempt is made at the deadline, not skipped
            log.warning("teacher server %s%s: %s; retry %d in %.1f s (%.0f s left of deadline_s)", self.base, path,
                        problem, attempt, pause, left)
            self._sleep(pause)
            wait = min(wait * 2, MAX_BACKOFF_S)

    def models(self, *, retry: bool = True) -> list[dict[str, Any]]:
        """The ``data`` list of ``/v1/models``."""
        answer = self.call("GET", "/v1/models", retry=retry)
        return list(answer.get("data", [])) if isinstance(answer, dict) else []


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
        return "timed out"
    text = str(reason if reason is not None else exc) or type(exc).__name__
    return " ".join(text.split())[:200]


def _http_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode(errors="replace")
        payload = json.loads(body)
        message = payload.get("error", payload) if isinstance(payload, dict) else payload
        if isinstance(message, dict):
            message = message.get("message", message)
        text = str(message)
    except Exception:  # noqa: BLE001 (any unreadable body: fall back to the reason)
        text = str(exc.reason)
    return " ".join(text.split())[:200]


def response_scores(prompt_logprobs: list[Any] | None, n_prompt: int, response: Sequence[int],
                    topk: int) -> ResponseScores:
    """Cut one choice's JSON ``prompt_logprobs`` (per position ``{token id: {"logprob", "rank", ...}}`` or null) to
    its response positions (:func:`~divopd.explore.scoring.cut_prompt_logprobs`)."""
    return cut_prompt_logprobs(prompt_logprobs, n_prompt, response, topk, lambda entry: {
        int(t): (float(v["logprob"]), None if v.get("rank") is None else int(v["rank"])) for t, v in entry.items()})


class ServerTeacher:
    """A :class:`~divopd.explore.teacher.Teacher` scoring (prompt+response ids with ``max_tokens: 1`` and vLLM's
    ``prompt_logprobs``) and acting through an OpenAI-compatible server; ``tokenizer`` (the served model's, local)
    gives the stop tokens. The model is ``settings.model`` or the first ``/v1/models`` lists."""

    def __init__(self, settings: ServerSettings, tokenizer: Any, *, stop_on_newline: bool = True,
                 client: ServerClient | None = None) -> None:
        from divopd.explore.generation import stop_token_ids  # torch: not for the config schema, which imports us

        self.settings = settings
        self.client = client or ServerClient(settings)
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, stop_on_newline)
        self.model, self.max_model_len = served_model(self.client, settings.model)
        self._pool = ThreadPoolExecutor(max_workers=settings.max_concurrency, thread_name_prefix="divopd-teacher")

    def close(self) -> None:
        """Stop the request threads (a later call raises)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """``fn`` over ``items`` on the pool, in order; the first failure raises (after every request ended)."""
        futures = [self._pool.submit(fn, item) for item in items]
        wait(futures)
        return [f.result() for f in futures]

    def score_turns(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                    topk: int = 0) -> list[ResponseScores]:
        """Per turn, the scores of the response tokens given their prompt (the server's prompt log probs)."""
        if len(prompts) != len(responses):
            raise ValueError(f"ServerTeacher.score_turns: {len(prompts)} prompts but {len(responses)} responses")
        turns = [(list(p), list(r)) for p, r in zip(prompts, responses, strict=True)]
        size = self.settings.max_turns_per_request
        groups = [turns[i:i + size] for i in range(0, len(turns), size)]
        return [s for group in self._map(lambda g: self._score_group(g, topk), groups) for s in group]

    def _score_group(self, group: list[tuple[list[int], list[int]]], topk: int) -> list[ResponseScores]:
        body = {"model": self.model, "prompt": [p + r for p, r in group], "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": int(topk)}
        answer = self.client.call("POST", "/v1/completions", body)
        choices = sorted(answer.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != len(group):
            raise ServerTeacherError(f"teacher server: {len(choices)} choices for {len(group)} prompts")
        if any(c.get("prompt_logprobs") is None for c in choices):
            raise ServerTeacherError("teacher server: no prompt_logprobs in the answer (the server must support "
                                     "vLLM's prompt_logprobs parameter of /v1/completions)")
        return [response_scores(c["prompt_logprobs"], len(p), r, topk) for c, (p, r) in zip(choices, group,
                                                                                            strict=True)]

    def generate(self, prompts: Sequence[Sequence[int]], *, greedy: bool, temperature: float, max_new_tokens: int,
                 seed: int | None = None) -> list[Generation]:
        """One response per prompt (+R), one request per row, seeded from ``(seed, row)``."""
        rows = []
        for i, p in enumerate(prompts):
            row_seed = None if seed is None else int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
            room = max_new_tokens if self.max_model_len is None else min(max_new_tokens, self.max_model_len - len(p))
            rows.append({"model": self.model, "prompt": list(p), "max_tokens": max(1, room),
                         "temperature": 0.0 if greedy else float(temperature), "top_p": 1.0, "top_k": -1,
                         "seed": row_seed, "logprobs": 0, "return_token_ids": True,
                         "stop_token_ids": list(self.stop_ids), "skip_special_tokens": False})
        return self._map(self._generate_one, rows)

    def _generate_one(self, body: dict[str, Any]) -> Generation:
        from divopd.explore.generation import Generation

        answer = self.client.call("POST", "/v1/completions", body)
        choice = answer["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if len(lps) != len(ids):
            raise ServerTeacherError("teacher server: the answer lacks token_ids or their log probs (the server must "
                                     "support return_token_ids and logprobs on /v1/completions)")
        return Generation(ids, np.array(lps, dtype=np.float32), choice.get("finish_reason") == "stop")


def served_model(client: ServerClient, wanted: str | None, *, retry: bool = True) -> tuple[str, int | None]:
    """``(model name, max_model_len or None)`` of the served model ``wanted`` (None: the first listed);
    :class:`ServerTeacherError` when the server lists none or not that one."""
    models = client.models(retry=retry)
    names = [str(m.get("id")) for m in models]
    if not names:
        raise ServerTeacherError(f"teacher server {client.base}: /v1/models lists no model")
    name = wanted or names[0]
    if name not in names:
        raise ServerTeacherError(f"teacher.server.model: {name!r} is not served by {client.base} "
                                 f"(it serves {', '.join(names)})")
    card = models[names.index(name)]
    limit = card.get("max_model_len")
    return name, (int(limit) if limit else None)


#: Text tokenized both here and by the server to compare the two tokenizers (plus a sample of the vocabulary).
PROBE_TEXT = "The teacher scores every token: look around, take coin, go east.\n12 + 30 = 42; ünïcode ✓"


def probe_text(tokenizer: Any, n: int = 256, *, skip_added: bool = False) -> str:
    """:data:`PROBE_TEXT` plus the text of ``n`` token ids spread over ``tokenizer``'s vocabulary, special tokens left
    out (with ``skip_added`` every added token too)."""
    skip = set(getattr(tokenizer, "all_special_ids", []) or [])
    if skip_added:
        skip |= set(getattr(tokenizer, "get_added_vocab", dict)().values())
    size = len(tokenizer)
    ids = sorted({int(i) for i in np.linspace(0, size - 1, num=min(n, size))})
    return PROBE_TEXT + " " + tokenizer.decode([i for i in ids if i not in skip])


def check_server(settings: ServerSettings, tokenizer: Any, path: str) -> str:
    """The start check of ``teacher.backend: server``: the server answers (one attempt), serves the model and
    tokenizes :func:`probe_text` as the local tokenizer of ``path`` does (where it has ``/tokenize``). Returns the line
    the run logs; :class:`ServerCheckError` otherwise."""
    client = ServerClient(settings)
    try:
        name, limit = served_model(client, settings.model, retry=False)
    except ServerTeacherError as exc:
        hint = "" if "teacher.server.model" in str(exc) else "; start the teacher server first (concepts/teacher.md)"
        raise ServerCheckError(f"teacher.server.url: {exc}{hint}") from None
    text = probe_text(tokenizer)
    local = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    try:
        answer = client.call("POST", "/tokenize", {"model": name, "prompt": text, "add_special_tokens": False},
                             retry=False)
    except ServerTeacherError as exc:
        if "HTTP 404" not in str(exc):
            raise ServerCheckError(f"teacher.server.url: {exc}") from None
        return f"teacher server {client.base} serves {name} (max_model_len {limit}; no /tokenize: tokenizer not probed)"
    remote = [int(t) for t in answer.get("tokens", [])]
    if remote != local:
        pairs = enumerate(zip(local, remote, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(local), len(remote)))
        raise ServerCheckError(f"teacher.path: {path} does not tokenize like the model {name} served at "
                                 f"{client.base} (a probe text: {len(local)} tokens here, {len(remote)} there, first "
                                 f"difference at token {first}); point teacher.path at the served model's folder")
    return f"teacher server {client.base} serves {name} (max_model_len {limit}; tokenizer matches {path})"
