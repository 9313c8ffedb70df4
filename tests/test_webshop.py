"""The WebShop HTTP adapter against the offline shop served on loopback (a real HTTP server, port 0)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest

from divopd.explore.envs.base import EnvCrash
from divopd.explore.envs.webshop import WEBSHOP_SPLITS, OfflineWebShopEnv, WebShopEnv, webshop_progress
from divopd.explore.envs.webshop_offline import CatalogConfig, WebShopServer

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never via an env proxy
SMALL = CatalogConfig(seed=7, n_products=120, n_goals=60, n_test=10, n_dev=10)


@pytest.fixture(scope="module")
def server():
    with WebShopServer(SMALL, port=0) as s:
        yield s


@pytest.fixture()
def env(server):
    e = WebShopEnv(server.url)
    yield e
    e.close()


def _play(env: WebShopEnv, task: str, actions: list[str]) -> tuple[float, bool, dict]:
    env.reset(task)
    reward, done, info = 0.0, False, {}
    for a in actions:
        _, reward, done, info = env.step(a)
        if done:
            break
    return reward, done, info


def _bad_policy(env: WebShopEnv, task: str) -> list[str]:
    """Searches the goal's words, opens the first result and buys it without choosing any option."""
    goal = env.goal(task)
    env.reset(task)
    env.step(f"search[{goal['query']}]")
    first = next(a for a in env.valid_actions() if re.fullmatch(r"click\[b0[0-9a-z]{8}\]", a))
    return [f"search[{goal['query']}]", first, "click[buy now]"]


def test_server_listens_on_loopback_with_a_free_port(server):
    assert server.url.startswith("http://127.0.0.1:")
    assert int(server.url.rsplit(":", 1)[1]) > 0
    with _DIRECT.open(server.url + "/") as r:
        assert json.loads(r.read()) == "ok"


def test_scripted_good_policy_succeeds_through_http(env):
    tasks = env.tasks("train")
    assert len(tasks) == SMALL.n_goals - SMALL.n_test - SMALL.n_dev
    for task in tasks[:15]:
        gold = env.gold_actions(task)
        assert gold and gold[0].startswith("search[") and gold[-1] == "click[buy now]"
        reward, done, info = _play(env, task, gold)
        assert done and reward == 1.0, (task, gold)
        assert info["success"] is True and info["score"] == 1.0


def test_scripted_bad_policy_fails_through_http(env):
    for task in env.tasks("test")[:10]:
        reward, done, info = _play(env, task, _bad_policy(env, task))
        assert done, task
        assert 0.0 <= reward < 1.0 and info["success"] is False


def test_malformed_actions_get_the_page_error_text_not_an_exception(env):
    task = env.tasks("dev")[0]
    first = env.reset(task)
    cases = ["buy the red one", "click[no such button]", "search[]", "", "click[buy now]", "search[x", "[search]"]
    for action in cases:
        obs, reward, done, info = env.step(action)
        assert obs.startswith("Error: "), action
        assert first in obs, "the current page follows the error text"
        assert reward == 0.0 and done is False
        assert info["progress"] is False and info["success"] is False and "error" in info
    # on the results page a search is an error too, and the page stays
    env.step("search[shirt]")
    obs, _, _, info = env.step("search[shoes]")
    assert "no search bar on this page" in obs and info["page"] == "results"
    # after the purchase every action is answered with the episode-over text
    _play(env, task, env.gold_actions(task))
    obs, reward, done, _ = env.step("click[back to search]")
    assert "episode is over" in obs and reward == 0.0 and done


def test_progress_means_a_new_page_or_a_higher_reward(env):
    task = env.tasks("train")[0]
    env.reset(task)
    gold = env.gold_actions(task)
    _, _, _, info = env.step(gold[0])
    assert info["progress"] is True  # results page: new
    _, _, _, info = env.step("click[back to search]")
    assert info["progress"] is False  # back to the (seen) search page
    assert webshop_progress("p", {"p"}, 1.0, 0.0, rejected=False) is True
    assert webshop_progress("p", set(), 1.0, 0.0, rejected=True) is False


def test_valid_actions_follow_the_page(env):
    task = env.tasks("train")[1]
    env.reset(task)
    assert env.valid_actions() == ["search[<query>]"]
    gold = env.gold_actions(task)
    env.step(gold[0])
    actions = env.valid_actions()
    assert "click[back to search]" in actions and gold[-len(env.goal(task)["options"]) - 2] in actions
    env.step(gold[-len(env.goal(task)["options"]) - 2])  # the item page
    assert {"click[buy now]", "click[description]", "click[< prev]"} <= set(env.valid_actions())


def test_sessions_are_independent(server):
    a, b = WebShopEnv(server.url), WebShopEnv(server.url)
    try:
        ta, tb = a.tasks("train")[0], a.tasks("train")[1]
        a.reset(ta)
        b.reset(tb)
        a.step("search[shirt]")
        assert b.valid_actions() == ["search[<query>]"]
    finally:
        a.close()
        b.close()


def test_transport_failures_raise_envcrash_and_bad_inputs_are_named(server):
    with pytest.raises(ConnectionError, match="webshop_offline.server"):
        WebShopEnv("http://127.0.0.1:9", timeout=2)
    with pytest.raises(ValueError, match="http://"):
        WebShopEnv("localhost:1234")
    env = WebShopEnv(server.url)
    with pytest.raises(ValueError, match="goal indices"):
        env.reset("not-a-number")
    with pytest.raises(ValueError, match="rejected task '100000'"):
        env.reset("100000")
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("valid")
    env.reset("0")
    # the server forgets the session (e.g. it was restarted): a transport-level failure, not a bad action
    request = urllib.request.Request(
        server.url + "/close", data=json.dumps({"env_idx": env._env_idx}).encode(), method="POST"
    )
    _DIRECT.open(request).close()
    with pytest.raises(EnvCrash, match="HTTP 404"):
        env.step("search[x]")
    env.close()  # closing a forgotten session does not raise


def test_server_without_divopd_extensions_uses_webshops_split(server, monkeypatch):
    env = WebShopEnv(server.url)
    real = env._call_status

    def no_extensions(method, path, body=None, query=None):
        if path.startswith("/divopd/"):
            return 404, {"detail": "Not Found"}
        return real(method, path, body, query)

    monkeypatch.setattr(env, "_call_status", no_extensions)
    assert env.tasks("test") == [str(i) for i in range(*WEBSHOP_SPLITS["test"])]
    assert len(env.tasks("train")) == WEBSHOP_SPLITS["train"][1] - WEBSHOP_SPLITS["train"][0]
    assert env.gold_actions("3") is None
    env.close()


def test_offline_env_shares_one_server_and_stops_it_with_the_last_user():
    a = OfflineWebShopEnv(seed=11, n_products=60, n_goals=30, n_test=5, n_dev=5)
    b = OfflineWebShopEnv(seed=11, n_products=60, n_goals=30, n_test=5, n_dev=5)
    assert a.url == b.url
    task = a.tasks("train")[0]
    reward, done, _ = _play(a, task, a.gold_actions(task))
    assert done and reward == 1.0
    a.close()
    assert b.valid_actions() is not None  # still served for b
    b.close()
    with pytest.raises(ConnectionError):
        WebShopEnv(a.url, timeout=2)


def test_server_cli_serves_on_a_free_port_and_stops_on_sigterm():
    cmd = [sys.executable, "-m", "divopd.explore.envs.webshop_offline.server", "--port", "0", "--seed", "3",
           "--products", "50", "--goals", "20", "--test-goals", "5", "--dev-goals", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        env = WebShopEnv(m.group(1))
        task = env.tasks("train")[0]
        reward, done, info = _play(env, task, env.gold_actions(task))
        assert done and reward == 1.0 and info["success"]
        env.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=300) == 0


def test_server_cli_rejects_bad_split_sizes():
    cmd = [sys.executable, "-m", "divopd.explore.envs.webshop_offline.server", "--goals", "10", "--test-goals", "10"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "n_test + n_dev" in out.stderr


def test_registry_builds_both_webshop_envs(server):
    from divopd.explore.envs import make_env

    offline = make_env("webshop-offline", seed=5, n_products=40, n_goals=12, n_test=2, n_dev=2)
    remote = make_env("webshop", url=server.url)
    try:
        assert offline.name == "webshop-offline" and remote.name == "webshop"
        for env in (offline, remote):
            task = env.tasks("train")[0]
            reward, done, info = _play(env, task, env.gold_actions(task))
            assert done and reward == 1.0 and info["success"]
    finally:
        offline.close()
        remote.close()
