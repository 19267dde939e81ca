"""WebShop in pure Python: the original page flow, action syntax and purchase score over a
seeded synthetic catalogue (default) or the original WebShop files (``$WEBSHOP_DATA``)."""

from arena_envs.webshop.catalog import Catalog, Goal, Product, Review
from arena_envs.webshop.env import WebShopEnv, parse_action, resolve_catalog
from arena_envs.webshop.original import load_original, write_original_format
from arena_envs.webshop.reward import ScoreBreakdown, best_options, purchase_score
from arena_envs.webshop.synthetic import synthetic_catalog

__all__ = ["WebShopEnv", "Catalog", "Goal", "Product", "Review", "ScoreBreakdown", "best_options", "load_original",
           "parse_action", "purchase_score", "resolve_catalog", "synthetic_catalog", "write_original_format"]
