"""The offline shop in-process: catalogue generation, BM25 search, pages, reward, gold sequences."""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divopd.explore.envs.webshop_offline import (
    CatalogConfig,
    ServerLimits,
    Shop,
    WebShopServer,
    generate_catalog,
    purchase_reward,
)
from divopd.explore.envs.webshop_offline.limits import SessionClock

CATALOG = generate_catalog(CatalogConfig(seed=0))
SHOP = Shop(CATALOG)


def test_catalogue_is_seeded_and_sized():
    again = generate_catalog(CatalogConfig(seed=0))
    other = generate_catalog(CatalogConfig(seed=1))
    assert again.products == CATALOG.products and again.goals == CATALOG.goals
    assert other.products != CATALOG.products
    assert len(CATALOG.products) == 300 and len(CATALOG.goals) == 600
    assert len({p.asin for p in CATALOG.products}) == 300
    assert len({p.category for p in CATALOG.products}) >= 5
    splits = {name: CATALOG.split(name) for name in ("train", "dev", "test")}
    assert [len(splits[n]) for n in ("test", "dev", "train")] == [100, 100, 400]
    assert sorted(splits["test"] + splits["dev"] + splits["train"]) == list(range(600))


def test_every_goal_is_satisfied_by_its_target_and_mentions_its_requirements():
    for g in CATALOG.goals:
        target = CATALOG.by_asin[g.target_asin]
        assert purchase_reward(g, target, dict(g.options)) == 1.0
        assert target.price <= g.price_upper
        for word in [*g.attributes, g.product_type, *g.options.values(), f"{g.price_upper:.2f}"]:
            assert word in g.instruction


def test_every_gold_sequence_earns_reward_one():
    for g in CATALOG.goals:
        s = SHOP.new_session(g.index)
        for action in SHOP.gold_actions(g.index):
            _, reward, done, info = SHOP.step(s, action)
            assert "error" not in info, (g.index, action, info)
        assert done and reward == 1.0, g.index


def test_search_ranks_with_bm25_and_paginates():
    target = CATALOG.products[42]
    ranked = SHOP.index.search(target.title, limit=50)
    assert ranked[0] == 42
    assert SHOP.index.search("zzzz qqqq", limit=50) == []
    s = SHOP.new_session(0)
    SHOP.step(s, "search[machine washable cotton]")
    assert len(s.results) > CATALOG.config.page_size
    page1 = SHOP.clickables(s)
    assert "next >" in page1 and "< prev" not in page1
    obs, _, _, info = SHOP.step(s, "click[Next >]")  # buttons compare case-insensitively
    assert "error" not in info and "Page 2" in obs and "< prev" in SHOP.clickables(s)
    assert set(SHOP.clickables(s)).isdisjoint(page1[2:])  # another ten products
    while "next >" in SHOP.clickables(s):
        SHOP.step(s, "click[next >]")
    assert s.page_no == -(-len(s.results) // CATALOG.config.page_size)
    SHOP.step(s, "click[< prev]")
    assert s.page_no == -(-len(s.results) // CATALOG.config.page_size) - 1


def test_item_page_options_details_and_navigation():
    g = CATALOG.goals[5]
    s = SHOP.new_session(5)
    SHOP.step(s, f"search[{g.query}]")
    SHOP.step(s, f"click[{g.target_asin}]")
    product = CATALOG.by_asin[g.target_asin]
    name, values = next(iter(product.options.items()))
    obs, _, _, _ = SHOP.step(s, f"click[{values[0]}]")
    assert f"[{values[0]}] (selected)" in obs and s.selected == {name: values[0]}
    SHOP.step(s, f"click[{values[1]}]")
    assert s.selected == {name: values[1]}  # one value per option group
    obs, _, _, _ = SHOP.step(s, "click[description]")
    assert product.description in obs and SHOP.clickables(s) == ["back to search", "< prev"]
    SHOP.step(s, "click[< prev]")
    assert s.page == "item"
    SHOP.step(s, "click[< prev]")
    assert s.page == "results" and s.page_no == 1
    SHOP.step(s, "click[back to search]")
    assert s.page == "search" and SHOP.has_search_bar(s)


def test_reward_structure():
    g = CATALOG.goals[0]
    target = CATALOG.by_asin[g.target_asin]
    n = len(g.attributes) + len(g.options) + 1
    assert purchase_reward(g, target, {}) == pytest.approx((len(g.attributes) + 1) / n)
    same_cat = next(p for p in CATALOG.products if p.category == g.category and p.product_type != g.product_type)
    other = next(p for p in CATALOG.products if p.category != g.category)
    assert purchase_reward(g, same_cat, dict(g.options)) <= 0.5
    assert purchase_reward(g, other, dict(g.options)) == 0.0
    pricey = dataclasses.replace(target, price=g.price_upper + 0.01)
    assert purchase_reward(g, pricey, dict(g.options)) == pytest.approx((n - 1) / n)


@settings(max_examples=60, deadline=None)
@given(goal=st.integers(0, 599), product=st.integers(0, 299), picks=st.lists(st.integers(0, 10), max_size=4))
def test_reward_is_in_unit_interval_and_one_only_when_everything_matches(goal, product, picks):
    g, p = CATALOG.goals[goal], CATALOG.products[product]
    selected = {}
    for i, (name, values) in zip(picks, p.options.items(), strict=False):
        selected[name] = values[i % len(values)]
    r = purchase_reward(g, p, selected)
    assert 0.0 <= r <= 1.0
    full = (
        p.product_type == g.product_type
        and set(g.attributes) <= set(p.attributes)
        and all(selected.get(k) == v for k, v in g.options.items())
        and p.price <= g.price_upper
    )
    assert (r == 1.0) == full


_ACTIONS = st.one_of(
    st.sampled_from(["click[next >]", "click[< prev]", "click[back to search]", "click[buy now]", "click[features]",
                     "click[description]", "search[shirt]", "search[organic tea]", "noop", "click[]"]),
    st.integers(0, 20).map(lambda i: f"click[#{i}]"),  # the i-th clickable of the current page
    st.text(max_size=12),
)


@settings(max_examples=60, deadline=None)
@given(goal=st.integers(0, 599), actions=st.lists(_ACTIONS, max_size=25))
def test_random_action_sequences_never_raise(goal, actions):
    s = SHOP.new_session(goal)
    for a in actions:
        if a.startswith("click[#"):
            buttons = SHOP.clickables(s)
            a = f"click[{buttons[int(a[7:-1]) % len(buttons)]}]" if buttons else "click[x]"
        obs, reward, done, info = SHOP.step(s, a)
        assert isinstance(obs, str) and obs
        assert 0.0 <= reward <= 1.0
        assert ("error" in info) == obs.startswith("Error: ")
        if done:
            assert s.page == "done"


def test_bad_configs_are_named():
    with pytest.raises(ValueError, match="n_products"):
        CatalogConfig(n_products=0)
    with pytest.raises(ValueError, match="train split is not empty"):
        CatalogConfig(n_goals=10, n_test=5, n_dev=5)
    with pytest.raises(ValueError, match="out of range"):
        SHOP.new_session(600)
    with pytest.raises(ValueError, match="unknown split"):
        CATALOG.split("valid_seen")


# -------------------------------------------------------------- server bounds (deadlines, no unbounded reads or waits)
SMALL = CatalogConfig(seed=0, n_products=40, n_goals=30, n_test=5, n_dev=5)


def _serve(**limits: float) -> WebShopServer:
    return WebShopServer(SMALL, port=0, limits=ServerLimits(**limits)).start()


def _call(server: WebShopServer, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    """One request on a fresh connection (the client gives up after 10 s, so a hung server fails the test)."""
    conn = http.client.HTTPConnection(*server._httpd.server_address[:2], timeout=10)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def test_a_body_over_the_limit_gets_413_unread_and_the_server_goes_on():
    server = _serve(max_body_bytes=1024)
    try:
        with socket.create_connection(server._httpd.server_address[:2], timeout=10) as sock:
            # a client announcing a terabyte and sending nothing: the server must not wait for (or allocate) it
            sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
            reply = sock.makefile("rb").read()  # the server answers, then closes: read() ends
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413") and b"Connection: close" in head
        detail = json.loads(body)["detail"]
        assert detail == "request body of 1000000000000 bytes is over this server's limit of 1024 bytes"
        status, _ = _call(server, "POST", "/step", {"env_idx": 0, "action": "x" * 2000})
        assert status == 413
        assert _call(server, "POST", "/create") == (200, 0)  # within the limit: served as before
    finally:
        server.stop()


def test_a_bad_content_length_gets_400():
    server = _serve()
    try:
        with socket.create_connection(server._httpd.server_address[:2], timeout=10) as sock:
            sock.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
            head = sock.makefile("rb").read()
        assert head.startswith(b"HTTP/1.1 400") and b"Content-Length must be a byte count" in head
    finally:
        server.stop()


def _read_until_closed(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (the test fails if it has not within 10 s)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail("the server kept a silent connection open for 10 s")
    return data


def test_a_silent_connection_is_closed_by_the_server():
    server = _serve(timeout_s=0.2)
    try:
        address = server._httpd.server_address[:2]
        with socket.create_connection(address, timeout=10) as sock:  # connects, says nothing
            assert _read_until_closed(sock) == b""
        with socket.create_connection(address, timeout=10) as sock:  # sends 1 of 10 body bytes
            sock.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
            head, _, body = _read_until_closed(sock).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"not received within 0.2 s" in body
        assert _call(server, "GET", "/") == (200, "ok")
    finally:
        server.stop()


def test_idle_sessions_expire_and_used_ones_stay():
    server = _serve(session_ttl_s=0.3)
    try:
        idle = _call(server, "POST", "/create")[1]
        time.sleep(0.5)  # longer than the TTL: the next request drops the idle session
        busy = _call(server, "POST", "/create")[1]
        status, reply = _call(server, "GET", f"/observation?env_idx={idle}")
        assert status == 404 and "idle for over 0.3 s" in reply["detail"]
        assert _call(server, "GET", "/list_envs") == (200, [busy])
    finally:
        server.stop()


def test_the_session_clock_drops_only_sessions_idle_past_the_ttl():
    now = [0.0]
    used = SessionClock(ttl_s=10.0, clock=lambda: now[0])
    used.touch(0)
    now[0] = 6.0
    used.touch(1)
    now[0] = 12.0
    used.touch(1)  # a session in use is never idle
    assert used.expired() == [0]
    now[0] = 22.5
    assert used.expired() == [1] and used.last_used == {}


def test_the_number_of_sessions_is_bounded():
    server = _serve(max_sessions=2)
    try:
        assert [_call(server, "POST", "/create")[1] for _ in range(2)] == [0, 1]
        status, reply = _call(server, "POST", "/create")
        assert status == 503 and "2 sessions are open" in reply["detail"]
        assert _call(server, "POST", "/close", {"env_idx": 0}) == (200, {"closed": True})
        assert _call(server, "POST", "/create") == (200, 2)
    finally:
        server.stop()


def test_bad_limits_are_named():
    with pytest.raises(ValueError, match="max_sessions must be a positive number"):
        ServerLimits(max_sessions=0)
    with pytest.raises(ValueError, match="timeout_s"):
        ServerLimits(timeout_s=-1.0)
