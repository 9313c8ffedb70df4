"""An offline WebShop-style environment: a generated catalogue, BM25 search and a real loopback HTTP server.

WebShop (Yao et al., 2022) needs a 1.18 M-product dataset and a search index that cannot be fetched here, so divopd
generates a small shop with the same page structure, actions and reward structure, served with the JSON protocol of
AgentGym's WebShop server: ``WebShopEnv(WebShopServer(CatalogConfig(seed=0)).url)`` talks to it as to a real one.
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
