"""An offline WebShop-style environment: a generated catalogue with WebShop's pages, actions and reward structure,
BM25 search and a real loopback HTTP server speaking AgentGym's WebShop protocol."""

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

__all__ = ["Catalog", "CatalogConfig", "Goal", "Product", "SearchIndex", "ServerLimits", "Shop", "ShopSession",
           "WebShopServer", "generate_catalog", "purchase_reward"]
