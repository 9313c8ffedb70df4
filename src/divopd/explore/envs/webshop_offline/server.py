"""A real HTTP server for the offline WebShop-style shop, on loopback by default, speaking the JSON protocol of
AgentGym's WebShop server (:data:`_ROUTES`) with extensions under ``/divopd/`` (a real server answers 404 there), within
:class:`~divopd.explore.envs.webshop_offline.limits.ServerLimits`. Run it::

    python -m divopd.explore.envs.webshop_offline.server --port 0 --seed 0 --products 300 --goals 600
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from divopd.explore.envs.webshop_offline.catalog import CatalogConfig, generate_catalog
from divopd.explore.envs.webshop_offline.engine import Shop, ShopSession
from divopd.explore.envs.webshop_offline.limits import ServerLimits, SessionClock

__all__ = ["ServerLimits", "WebShopServer", "acquire_shared_server", "main", "release_shared_server"]


class _HTTPError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class _ShopState:
    """The shop and its open sessions; one lock serialises session creation and every action."""

    def __init__(self, shop: Shop, limits: ServerLimits) -> None:
        self.shop, self.limits = shop, limits
        self.sessions: dict[int, ShopSession] = {}
        self.used = SessionClock(limits.session_ttl_s)
        self.next_idx = 0
        self.next_goal = 0  # goal of a reset without session_id: goals in turn
        self.lock = threading.Lock()

    def session(self, env_idx: Any) -> ShopSession:
        if not isinstance(env_idx, int) or isinstance(env_idx, bool):
            raise _HTTPError(422, f"env_idx must be an int, got {env_idx!r}")
        if env_idx not in self.sessions:
            raise _HTTPError(404, f"no environment with env_idx {env_idx} (closed, never created, or idle for "
                             f"over {self.limits.session_ttl_s:g} s); POST /create first")
        self.used.touch(env_idx)
        return self.sessions[env_idx]

    def drop_idle(self) -> None:
        for idx in self.used.expired():
            self.sessions.pop(idx, None)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.state.limits.timeout_s  # a silent connection is closed after this
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.verbose:
            super().log_message(format, *args)

    def _reply(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict:
        length = self._content_length()
        raw = self.rfile.read(length) if length else b"{}"
        try:
            data = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            raise _HTTPError(400, f"request body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise _HTTPError(400, "request body must be a JSON object")
        return data

    def _content_length(self) -> int:
        """The declared body size, at most ``max_body_bytes`` (else the body stays unread and the connection ends)."""
        text = self.headers.get("Content-Length") or "0"
        limit = self.server.state.limits.max_body_bytes
        length = int(text) if text.strip().isdigit() else -1
        if not 0 <= length <= limit:
            self.close_connection = True  # the body is never read: this connection cannot go on
            if length < 0:
                raise _HTTPError(400, f"Content-Length must be a byte count, got {text!r}")
            raise _HTTPError(413, f"request body of {length} bytes is over this server's limit of {limit} bytes")
        return length

    def _handle(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        route = _ROUTES.get((method, parts.path.rstrip("/") or "/"))
        try:
            body = self._body() if method == "POST" else {}
            if route is None:
                raise _HTTPError(404, f"no route {method} {parts.path}")
            with self.server.state.lock:
                self.server.state.drop_idle()
                payload = route(self.server.state, body, query)
            self._reply(200, payload)
        except TimeoutError:  # the client stopped sending mid-body
            self.close_connection = True
            self._reply(408, {"detail": f"request body not received within {self.server.state.limits.timeout_s:g} s"})
        except _HTTPError as e:
            self._reply(e.status, {"detail": e.detail})
        except Exception as e:  # a bug in the shop must not kill the server thread
            self._reply(500, {"detail": f"{type(e).__name__}: {e}"})

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self._handle("POST")


def _int_arg(source: dict, key: str, required: bool = True) -> int | None:
    value = source.get(key)
    if value is None:
        if required:
            raise _HTTPError(422, f"missing {key!r}")
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _HTTPError(422, f"{key} must be an int, got {value!r}") from None


def _create(st: _ShopState, body: dict, q: dict) -> int:
    if len(st.sessions) >= st.limits.max_sessions:
        raise _HTTPError(503, f"{len(st.sessions)} sessions are open, this server's limit; POST /close one "
                         f"(idle ones close after {st.limits.session_ttl_s:g} s)")
    idx = st.next_idx
    st.next_idx += 1
    st.sessions[idx] = st.shop.new_session(0)
    st.used.touch(idx)
    return idx


def _reset(st: _ShopState, body: dict, q: dict) -> list:
    idx = _int_arg(body, "env_idx")
    st.session(idx)
    goal = _int_arg(body, "session_id", required=False)
    if goal is None:
        goal = st.next_goal % len(st.shop.catalog.goals)
        st.next_goal += 1
    try:
        st.sessions[idx] = st.shop.new_session(goal)
    except ValueError as e:
        raise _HTTPError(422, str(e)) from None
    return [st.shop.render(st.sessions[idx]), None]


def _step(st: _ShopState, body: dict, q: dict) -> dict:
    s = st.session(_int_arg(body, "env_idx"))
    action = body.get("action")
    if not isinstance(action, str):
        raise _HTTPError(422, f"action must be a string, got {action!r}")
    state, reward, done, info = st.shop.step(s, action)
    return {"state": state, "reward": reward, "done": done, "info": info}


def _available(st: _ShopState, body: dict, q: dict) -> dict:
    s = st.session(_int_arg(q, "env_idx"))
    return {"has_search_bar": st.shop.has_search_bar(s), "clickables": st.shop.clickables(s)}


def _instruction(st: _ShopState, body: dict, q: dict) -> str:
    return f"Instruction: {st.session(_int_arg(q, 'env_idx')).goal.instruction}"


def _close(st: _ShopState, body: dict, q: dict) -> dict:
    idx = _int_arg(body, "env_idx")
    st.used.forget(idx)
    return {"closed": st.sessions.pop(idx, None) is not None}


def _info(st: _ShopState, body: dict, q: dict) -> dict:
    c = st.shop.catalog
    return {"name": "divopd-webshop-offline", "config": vars(c.config),
            "splits": {name: len(c.split(name)) for name in ("train", "dev", "test")}}


def _tasks(st: _ShopState, body: dict, q: dict) -> dict:
    split = q.get("split", "train")
    try:
        return {"split": split, "tasks": [str(i) for i in st.shop.catalog.split(split)]}
    except ValueError as e:
        raise _HTTPError(422, str(e)) from None


def _goal(st: _ShopState, body: dict, q: dict) -> dict:
    idx = _int_arg(q, "session_id")
    goals = st.shop.catalog.goals
    if not 0 <= idx < len(goals):
        raise _HTTPError(404, f"no goal {idx}; goals are 0..{len(goals) - 1}")
    return {**goals[idx].to_dict(), "gold_actions": st.shop.gold_actions(idx)}


_ROUTES = {
    ("GET", "/"): lambda st, b, q: "ok",
    ("GET", "/list_envs"): lambda st, b, q: sorted(st.sessions),
    ("POST", "/create"): _create,
    ("POST", "/reset"): _reset,
    ("POST", "/step"): _step,
    ("GET", "/observation"): lambda st, b, q: st.shop.render(st.session(_int_arg(q, "env_idx"))),
    ("GET", "/available_actions"): _available,
    ("GET", "/instruction_text"): _instruction,
    ("POST", "/close"): _close,
    ("GET", "/divopd/info"): _info,
    ("GET", "/divopd/tasks"): _tasks,
    ("GET", "/divopd/goal"): _goal,
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: _ShopState, verbose: bool) -> None:
        super().__init__(address, _Handler)
        self.state, self.verbose = state, verbose


class WebShopServer:
    """The shop served over HTTP, started and stopped from Python (``with WebShopServer(config) as server:`` serves
    at ``server.url`` in a daemon thread)."""

    def __init__(self, config: CatalogConfig | None = None, host: str = "127.0.0.1", port: int = 0,
                 verbose: bool = False, limits: ServerLimits | None = None) -> None:
        self.config = config or CatalogConfig()
        self.limits = limits or ServerLimits()
        state = _ShopState(Shop(generate_catalog(self.config)), self.limits)
        self._httpd = _Server((host, port), state, verbose)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> WebShopServer:
        """Serve in a daemon thread; returns ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, name="webshop-offline", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` (from another thread) or KeyboardInterrupt."""
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=30)  # serve_forever has returned once shutdown() does
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> WebShopServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# one in-process server per catalogue config, shared by every OfflineWebShopEnv of this process (reference counted)
_SHARED: dict[CatalogConfig, list] = {}  # config -> [server, users]
_SHARED_LOCK = threading.Lock()


def acquire_shared_server(config: CatalogConfig) -> WebShopServer:
    """The running loopback server of ``config`` in this process, started on first use; pair with
    :func:`release_shared_server`."""
    with _SHARED_LOCK:
        entry = _SHARED.get(config)
        if entry is None:
            entry = _SHARED[config] = [WebShopServer(config).start(), 0]
        entry[1] += 1
        return entry[0]


def release_shared_server(config: CatalogConfig) -> None:
    """Drop one use of the shared server of ``config``; the last user stops it and frees its port."""
    with _SHARED_LOCK:
        entry = _SHARED.get(config)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _SHARED[config]
            entry[0].stop()


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m divopd.explore.envs.webshop_offline.server --port 0``."""
    parser = argparse.ArgumentParser(
        prog="python -m divopd.explore.envs.webshop_offline.server",
        description="Serve the generated WebShop-style shop over HTTP (AgentGym WebShop protocol).")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (printed on start)")
    parser.add_argument("--seed", type=int, default=0, help="catalogue and goal seed")
    parser.add_argument("--products", type=int, default=CatalogConfig.n_products, help="number of products")
    parser.add_argument("--goals", type=int, default=CatalogConfig.n_goals, help="number of instruction goals")
    parser.add_argument("--test-goals", type=int, default=CatalogConfig.n_test, help="goals in the test split")
    parser.add_argument("--dev-goals", type=int, default=CatalogConfig.n_dev, help="goals in the dev split")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    d = ServerLimits()
    parser.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413)")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="close a connection silent this long (s)")
    parser.add_argument("--session-ttl", type=float, default=d.session_ttl_s, help="drop sessions idle this long (s)")
    parser.add_argument("--max-sessions", type=int, default=d.max_sessions, help="most open sessions (503 beyond)")
    args = parser.parse_args(argv)
    try:
        config = CatalogConfig(seed=args.seed, n_products=args.products, n_goals=args.goals, n_test=args.test_goals,
                               n_dev=args.dev_goals)
        limits = ServerLimits(max_body_bytes=args.max_body_bytes, timeout_s=args.timeout,
                              session_ttl_s=args.session_ttl, max_sessions=args.max_sessions)
    except ValueError as e:
        parser.error(str(e))
    server = WebShopServer(config, host=args.host, port=args.port, verbose=args.verbose, limits=limits)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    print(f"divopd webshop-offline serving on {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    print("divopd webshop-offline stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
