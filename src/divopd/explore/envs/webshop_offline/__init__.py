"""An offline WebShop-style environment: a generated catalogue, BM25 search and a real loopback HTTP server.

WebShop (Yao et al., 2022) needs a 1.18 M-product dataset and a search index that cannot be fetched here, so divopd
generates a small shop with the same page structure, actions and reward structure, and serves it over HTTP with the
JSON protocol of AgentGym's WebShop server. ``WebShopEnv`` talks to it exactly as it talks
to a real one::

    from divopd.explore.envs.webshop_offline import CatalogConfig, WebShopServer
    from divopd.explore.envs.webshop import WebShopEnv

    with WebShopServer(CatalogConfig(seed=0)) as server:      # 127.0.0.1, a free port
        env = WebShopEnv(server.url)
        obs = env.reset(env.tasks("train")[0])
        obs, reward, done, info = env.step("search[cotton t-shirt]")
"""

from divopd.explore.envs.webshop_offline.catalog import (
    Catalog,
    CatalogConfig,
    Goal,
    Product,
    generate_catalog,
    purchase_reward,
)
from divopd.explore.envs.webshop_offline.engine import SearchIndex, Shop, ShopSession
from divopd.explore.envs.webshop_offline.limits import ServerLimits


def __getattr__(name: str) -> type:
    """``WebShopServer``, imported on first use, so that ``python -m divopd.explore.envs.webshop_offline.server`` runs
    the module once (no runpy warning about it being imported already)."""
    if name == "WebShopServer":
        from divopd.explore.envs.webshop_offline.server import WebShopServer

        return WebShopServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Catalog",
    "CatalogConfig",
    "Goal",
    "Product",
    "SearchIndex",
    "ServerLimits",
    "Shop",
    "ShopSession",
    "WebShopServer",
    "generate_catalog",
    "purchase_reward",
]
