"""The shop's page logic: BM25 search, result pages, item pages, option clicks and purchase, rendered in WebShop's
text mode. A malformed or unavailable action leaves the page as it is and returns it with an ``Error: …`` in front.
Pages::

    search   --search[q]-->  results (page 1) --click[next >] / click[< prev]--> results (page n)
    results  --click[<asin>]--> item --click[<option value>]--> item (option selected)
    item     --click[description] / click[features]--> detail --click[< prev]--> item
    item     --click[< prev]--> results;  any page --click[back to search]--> search
    item     --click[buy now]--> done (reward = purchase_reward, episode over)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import bm25s
import numpy as np

from divopd.explore.envs.webshop_offline.catalog import Catalog, Goal, Product, purchase_reward, tokenize

__all__ = ["SearchIndex", "Shop", "ShopSession"]

SEP = " [SEP] "
BACK = "back to search"
NEXT = "next >"
PREV = "< prev"
BUY = "buy now"
DETAILS = ("description", "features")
_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


class SearchIndex:
    """BM25 ranking (the ``bm25s`` package) over every product's :meth:`Product.search_text`."""

    def __init__(self, products: list[Product]) -> None:
        self._retriever = bm25s.BM25()
        self._retriever.index([tokenize(p.search_text()) for p in products], show_progress=False)
        self._n = len(products)

    def search(self, query: str, limit: int) -> list[int]:
        """Indices of the products matching ``query``, best BM25 score first (ties: catalogue order), at most
        ``limit``; products with score 0 (no query word) are left out."""
        words = tokenize(query)
        if not words:
            return []
        scores = np.asarray(self._retriever.get_scores(words), dtype=np.float64)  # (n_products,)
        order = np.lexsort((np.arange(self._n), -scores))  # score desc, then index asc
        return [int(i) for i in order[:limit] if scores[i] > 0]


@dataclass
class ShopSession:
    """State of one episode: the goal, the current page and what was selected."""

    goal: Goal
    page: str = "search"  # search | results | item | detail | done
    query: str = ""
    results: list[str] = field(default_factory=list)  # ASINs, best first
    page_no: int = 1
    asin: str | None = None
    detail: str | None = None
    selected: dict[str, str] = field(default_factory=dict)
    done: bool = False
    reward: float = 0.0
    steps: int = 0


class Shop:
    """The catalogue plus its search index; creates sessions and applies actions to them."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.index = SearchIndex(catalog.products)

    def new_session(self, goal_index: int) -> ShopSession:
        goals = self.catalog.goals
        if not 0 <= goal_index < len(goals):
            raise ValueError(f"goal index {goal_index} out of range 0..{len(goals) - 1}")
        return ShopSession(goal=goals[goal_index])

    def step(self, s: ShopSession, action: str) -> tuple[str, float, bool, dict]:
        """Apply ``action`` to ``s``; returns ``(observation, reward, done, info)``; ``info["error"]`` is set (and the
        page unchanged) when the action was malformed or not available on this page."""
        s.steps += 1
        error = self._apply(s, action)
        info: dict = {"page": s.page, "steps": s.steps}
        if error is not None:
            info["error"] = error
            return f"Error: {error}{SEP}{self.render(s)}", 0.0, s.done, info
        return self.render(s), (s.reward if s.done else 0.0), s.done, info

    def _apply(self, s: ShopSession, action: str) -> str | None:
        """Mutates ``s`` for a valid action; returns an error text otherwise."""
        if s.done:
            return "the episode is over (the item was bought); reset to start a new one"
        m = _ACTION_RE.match(action or "")
        if m is None:
            return f"invalid action {action!r}: use search[query] or click[button]"
        kind, arg = m.group(1).lower(), " ".join(m.group(2).split())
        if kind == "search":
            if s.page != "search":
                return f"there is no search bar on this page; click[{BACK}] first"
            if not tokenize(arg):
                return "the search query is empty"
            s.query = arg
            s.results = self._ranked(arg)
            s.page, s.page_no = "results", 1
            return None
        button = arg.lower()
        if s.page == "search":
            return f"there is nothing to click on the search page; use search[query] (got click[{arg}])"
        clickables = self.clickables(s)
        if button not in clickables:
            return f"{arg!r} is not a button on this page; buttons: {', '.join(clickables) or '(none)'}"
        self._click(s, button)
        return None

    def _click(self, s: ShopSession, button: str) -> None:
        if button == BACK:
            s.page, s.asin, s.detail, s.selected, s.results = "search", None, None, {}, []
        elif s.page == "results":
            if button == NEXT:
                s.page_no += 1
            elif button == PREV:
                s.page_no -= 1
            else:  # an ASIN
                s.page, s.asin, s.selected = "item", button, {}
        elif s.page == "item":
            product = self.catalog.by_asin[s.asin]
            if button == PREV:
                s.page, s.asin, s.selected = "results", None, {}
            elif button in DETAILS:
                s.page, s.detail = "detail", button
            elif button == BUY:
                s.reward = purchase_reward(s.goal, product, s.selected)
                s.page, s.done = "done", True
            else:  # an option value
                for name, values in product.options.items():
                    if button in values:
                        s.selected[name] = button
        elif s.page == "detail" and button == PREV:
            s.page, s.detail = "item", None

    def clickables(self, s: ShopSession) -> list[str]:
        """The buttons of the current page, lower case (WebShop's ``get_available_actions()["clickables"]``)."""
        if s.page in ("search", "done"):
            return []
        out = [BACK]
        if s.page == "results":
            first, last = self._page_bounds(s)
            if s.page_no > 1:
                out.append(PREV)
            if last < len(s.results):
                out.append(NEXT)
            out.extend(s.results[first:last])
        elif s.page == "item":
            product = self.catalog.by_asin[s.asin]
            out.append(PREV)
            out.extend(v for values in product.options.values() for v in values)
            out.extend([*DETAILS, BUY])
        elif s.page == "detail":
            out.append(PREV)
        return out

    def has_search_bar(self, s: ShopSession) -> bool:
        return s.page == "search" and not s.done

    def render(self, s: ShopSession) -> str:
        """The current page as WebShop-style text."""
        head = f"Instruction:{SEP}{s.goal.instruction}"
        if s.page == "search":
            return f"WebShop{SEP}{head}{SEP}[Search]"
        if s.page == "done":
            return f"Thank you for shopping with us!{SEP}{head}{SEP}Your score (min 0.0, max 1.0){SEP}{s.reward:.4f}"
        parts = [f"[{BACK.title()}]", head]
        if s.page == "results":
            first, last = self._page_bounds(s)
            parts.append(f"Page {s.page_no} (Total results: {len(s.results)})")
            if s.page_no > 1:
                parts.append("[< Prev]")
            if last < len(s.results):
                parts.append("[Next >]")
            if not s.results:
                parts.append(f"No results for {s.query!r}")
            for asin in s.results[first:last]:
                p = self.catalog.by_asin[asin]
                parts += [f"[{asin}]", p.title, f"${p.price:.2f}"]
        elif s.page == "item":
            p = self.catalog.by_asin[s.asin]
            parts.append("[< Prev]")
            for name, values in p.options.items():
                chosen = s.selected.get(name)
                parts.append(name)
                parts += [f"[{v}]" + (" (selected)" if v == chosen else "") for v in values]
            parts += [p.title, f"Price: ${p.price:.2f}", "Rating: N.A.", "[Description]", "[Features]", "[Buy Now]"]
        elif s.page == "detail":
            p = self.catalog.by_asin[s.asin]
            parts.append("[< Prev]")
            parts += [p.description] if s.detail == "description" else list(p.features)
        return SEP.join(parts)

    def _page_bounds(self, s: ShopSession) -> tuple[int, int]:
        size = self.catalog.config.page_size
        first = (s.page_no - 1) * size
        return first, min(first + size, len(s.results))

    def _ranked(self, query: str) -> list[str]:
        """The ASINs a search for ``query`` keeps, best first."""
        return [self.catalog.products[i].asin for i in self.index.search(query, self.catalog.config.max_results)]

    def gold_actions(self, goal_index: int) -> list[str]:
        """An expert action sequence for goal ``goal_index``: search the goal's keywords (or the target's title when
        the target is not among the kept results), page to the target, open it, pick the asked options, buy."""
        goal = self.catalog.goals[goal_index]
        query = goal.query
        ranked = self._ranked(query)
        if goal.target_asin not in ranked:
            query = self.catalog.by_asin[goal.target_asin].title
            ranked = self._ranked(query)
        position = ranked.index(goal.target_asin)  # the title query always ranks its product among the kept results
        pages = position // self.catalog.config.page_size
        return [f"search[{query}]", *[f"click[{NEXT}]"] * pages, f"click[{goal.target_asin}]",
                *(f"click[{value}]" for value in goal.options.values()), f"click[{BUY}]"]
