"""WebShop over HTTP (Yao et al., 2022): the adapter for a server speaking AgentGym's WebShop JSON protocol, which the
project's offline shop (:mod:`divopd.explore.envs.webshop_offline`) serves too. Only transport failures raise
:class:`EnvCrash`; a bad action is the server's business (its page with an error text, reward 0).

+R rules: an action is *invalid* when the server rejects it (``info["error"]``) or it is not available on its page
(``search[...]`` without a search bar, ``click[b]`` with ``b`` not a button of the page). The *allowed actions* are
:meth:`WebShopEnv.valid_actions`; the query is part of the action, so only the same search repeated is a repeat.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlencode, urlsplit

from divopd.explore.envs.base import Env, EnvCrash, StepResult

__all__ = ["WEBSHOP_SPLITS", "OfflineWebShopEnv", "WebShopEnv", "webshop_action_available", "webshop_progress"]

#: WebShop's goal-index split of its 12,087 human goals (its baseline code), for servers without ``/divopd/tasks``
WEBSHOP_SPLITS: dict[str, tuple[int, int]] = {"test": (0, 500), "dev": (500, 1500), "train": (1500, 12087)}


def webshop_progress(page: str, seen: set[str], reward: float, best_reward: float, rejected: bool) -> bool:
    """Whether a WebShop step made progress: the reward rose, or the step reached a page not seen before in this
    episode. A step the server rejected (error text, page unchanged) is never progress."""
    return not rejected and (reward > best_reward or page not in seen)


def webshop_action_available(action: str, available: dict) -> bool:
    """Whether ``action`` is available on a page whose ``/available_actions`` reply is ``available``:
    ``search[...]`` needs a search bar, ``click[b]`` needs ``b`` among its buttons (case and spacing ignored)."""
    m = re.fullmatch(r"\s*(search|click)\s*\[(.*)\]\s*", str(action), flags=re.IGNORECASE | re.DOTALL)
    if m is None:
        return False
    if m.group(1).lower() == "search":
        return bool(available.get("has_search_bar"))
    button = " ".join(m.group(2).lower().split())
    return button in {" ".join(str(c).lower().split()) for c in available.get("clickables", [])}


class WebShopEnv(Env):
    """One browser session on the WebShop server at ``url``; ``timeout``: seconds one HTTP reply may take before the
    call is an :class:`EnvCrash`; ``splits``: goal-index ranges (default :data:`WEBSHOP_SPLITS`). Tasks are goal
    indices; reward is the server's, ``info["success"]`` reward 1."""

    name = "webshop"

    def __init__(self, url: str, timeout: float = 30.0, splits: dict[str, tuple[int, int]] | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"WebShop url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        # a loopback server is never reached through an HTTP(S)_PROXY from the environment
        loopback = urlsplit(self.url).hostname in ("127.0.0.1", "localhost", "::1")
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({} if loopback else None))
        self.splits = dict(splits or WEBSHOP_SPLITS)
        self._env_idx: int | None = None
        self._seen: set[str] = set()
        self._best = 0.0
        self._available: dict | None = None  # /available_actions of the current page (fetched once per page)
        try:
            self._env_idx = int(self._call("POST", "/create"))
        except EnvCrash as e:
            raise ConnectionError(
                f"no WebShop server answers at {self.url} ({e}). Start the offline one with "
                "`python -m divopd.explore.envs.webshop_offline.server --port 0`, or a real WebShop with AgentGym's "
                "`webshop --port PORT`, and pass its URL."
            ) from None

    def tasks(self, split: str) -> list[str]:
        status, payload = self._call_status("GET", "/divopd/tasks", query={"split": split})
        if status == 200:
            return list(payload["tasks"])
        if status == 404:  # a real WebShop server: its fixed goal-index convention
            if split not in self.splits:
                raise ValueError(f"unknown split {split!r}; known: {', '.join(self.splits)}")
            lo, hi = self.splits[split]
            return [str(i) for i in range(lo, hi)]
        raise ValueError(f"server rejected split {split!r}: {payload}")

    def reset(self, task: str) -> str:
        goal = _goal_index(task)
        status, payload = self._call_status("POST", "/reset", {"env_idx": self._env_idx, "session_id": goal})
        if status == 422:  # the request was understood and the goal refused (e.g. out of range)
            raise ValueError(f"WebShop server rejected task {task!r}: {payload}")
        if status != 200:
            raise EnvCrash(f"WebShop POST /reset answered HTTP {status}: {payload}")
        obs = payload[0] if isinstance(payload, list) else payload
        if not isinstance(obs, str):
            raise EnvCrash(f"WebShop /reset returned {payload!r}, expected [observation, ...]")
        self._seen, self._best = {obs}, 0.0
        self._available = None
        self._available_actions()  # fetched here, where a failure is the explorer's EnvCrash (see Env.valid_actions)
        return obs

    def step(self, action: str) -> StepResult:
        available = self._available_actions()
        payload = self._call("POST", "/step", {"env_idx": self._env_idx, "action": str(action)})
        self._available = None
        self._available_actions()  # the new page's actions, fetched here where a failure is the explorer's EnvCrash
        try:
            obs, reward, done = str(payload["state"]), float(payload["reward"]), bool(payload["done"])
        except (KeyError, TypeError, ValueError):
            raise EnvCrash(f"WebShop /step returned {payload!r}, expected state/reward/done") from None
        server_info = payload.get("info") if isinstance(payload.get("info"), dict) else {}
        rejected = "error" in server_info
        progress = webshop_progress(obs, self._seen, reward, self._best, rejected)
        if not rejected:
            self._seen.add(obs)
        self._best = max(self._best, reward)
        info: dict[str, Any] = {
            **server_info,
            "success": bool(done and reward >= 1.0),
            "progress": progress,
            "score": self._best,
            "invalid": rejected or not webshop_action_available(action, available),
        }
        return obs, reward, done, info

    def gold_actions(self, task: str) -> list[str] | None:
        goal = self.goal(task)
        return list(goal.get("gold_actions") or []) or None if isinstance(goal, dict) else None

    def goal(self, task: str) -> dict | None:
        """The offline shop's goal metadata (instruction, asked attributes/options, price bound, target ASIN, gold
        actions); ``None`` from a real server."""
        status, payload = self._call_status("GET", "/divopd/goal", query={"session_id": _goal_index(task)})
        return payload if status == 200 else None

    def valid_actions(self) -> list[str]:
        """``search[<query>]`` (a template) when the page has a search bar, then ``click[b]`` for every button."""
        payload = self._available_actions()
        out = ["search[<query>]"] if payload.get("has_search_bar") else []
        return out + [f"click[{c}]" for c in payload.get("clickables", [])]

    def _available_actions(self) -> dict:
        """``/available_actions`` of the current page, asked once per page."""
        if self._available is None:
            payload = self._call("GET", "/available_actions", query={"env_idx": self._env_idx})
            self._available = payload if isinstance(payload, dict) else {}
        return self._available

    def close(self) -> None:
        if self._env_idx is not None:
            with contextlib.suppress(EnvCrash):  # the server is gone: nothing left to release
                self._call("POST", "/close", {"env_idx": self._env_idx})
            self._env_idx = None

    def _call(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> Any:
        status, payload = self._call_status(method, path, body, query)
        if status != 200:
            raise EnvCrash(f"WebShop {method} {path} answered HTTP {status}: {payload}")
        return payload

    def _call_status(self, method: str, path: str, body: dict | None = None,
                     query: dict | None = None) -> tuple[int, Any]:
        url = self.url + path + ("?" + urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with self._opener.open(request, timeout=self.timeout) as reply:
                status, raw = reply.status, reply.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timeout
            raise EnvCrash(f"WebShop {method} {url} failed: {e}") from e
        try:
            return status, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            if status != 200:
                return status, raw.decode(errors="replace")[:500]
            raise EnvCrash(f"WebShop {method} {url} returned non-JSON: {raw[:200]!r}") from None


class OfflineWebShopEnv(WebShopEnv):
    """:class:`WebShopEnv` on the project's generated shop, served on loopback inside this process; instances with the
    same :class:`~divopd.explore.envs.webshop_offline.CatalogConfig` fields share one server."""

    name = "webshop-offline"

    def __init__(self, seed: int = 0, n_products: int = 300, n_goals: int = 600, n_test: int = 100, n_dev: int = 100,
                 timeout: float = 30.0) -> None:
        from divopd.explore.envs.webshop_offline.catalog import CatalogConfig
        from divopd.explore.envs.webshop_offline.server import acquire_shared_server, release_shared_server

        self._config = CatalogConfig(seed=seed, n_products=n_products, n_goals=n_goals, n_test=n_test, n_dev=n_dev)
        self._release = release_shared_server
        server = acquire_shared_server(self._config)
        try:
            super().__init__(server.url, timeout=timeout)
        except BaseException:
            release_shared_server(self._config)
            raise
        self._held = True

    def close(self) -> None:
        super().close()
        if getattr(self, "_held", False):
            self._held = False
            self._release(self._config)


def _goal_index(task: str) -> int:
    try:
        return int(str(task).strip())
    except ValueError:
        raise ValueError(f"WebShop task ids are goal indices like '17', got {task!r}") from None
