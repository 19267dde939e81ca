"""Reader (and writer) for the original WebShop data files.

Users who have princeton-nlp/WebShop's files can point the env at their directory
(``data_path=`` or ``$WEBSHOP_DATA``) to reproduce published numbers:

- ``items_shuffle_1000.json`` / ``items_shuffle.json``: a list of scraped products
  (``asin``, ``name``, ``full_description``, ``small_description``, ``pricing`` such as
  ``"$12.99"`` or ``"$10.99 - $15.99"``, ``product_category``, ``query``, ``category``,
  ``customization_options`` {name: [{"value", "image"}]}, ``images``);
- ``items_ins_v2_1000.json`` / ``items_ins_v2.json``: {asin: {"attributes",
  "instruction", "instruction_attributes"}} — product attributes and the synthetic
  instruction of each product;
- ``items_human_ins.json``: {asin: [{"instruction", "instruction_attributes",
  "instruction_options"}, ...]} — human-written instructions (``human_goals=True``).

Loading follows WebShop's engine: ASINs longer than 10 characters or duplicated are
skipped, option values are lower-cased with "/" written as " | ", products without
attributes get ``DUMMY_ATTR``, a synthetic goal is made for every option combination,
budgets are the larger of two of the four next multiples of ten above the price, and the
goal list is shuffled with seed 233. Differences: prices inside a range and budgets
are drawn from a seeded RNG (WebShop's are unseeded), and the type reward's title nouns
come from :func:`~arena_envs.webshop.reward.title_nouns` (WebShop uses spaCy).
:func:`write_original_format` writes any catalogue in this format.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path
from typing import Any

from arena_envs.webshop.catalog import Catalog, Goal, Product
from arena_envs.webshop.reward import title_nouns
from arena_envs.webshop.synthetic import NO_PRICE_BOUND, instruction_suffix, price_upper_for

ENV_VAR = "WEBSHOP_DATA"
ITEM_FILES = ("items_shuffle_1000.json", "items_shuffle.json")
ATTR_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
HUMAN_FILE = "items_human_ins.json"
GOAL_SHUFFLE_SEED = 233  # WebShop shuffles its goal list with this seed


def _pick(directory: Path, names: tuple[str, ...], pattern: str) -> Path:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    found = sorted(directory.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no {names[0]} (or {pattern}) in {directory}")
    return found[0]


def _parse_pricing(pricing: Any) -> list[float]:
    if not pricing or not isinstance(pricing, str):
        return [100.0]  # WebShop's default for products without a price
    values = []
    for part in pricing.split("$")[1:]:
        try:
            values.append(float(Decimal(re.sub(r"[^\d.]", "", part))))
        except InvalidOperation:
            continue
    return values[:2] or [100.0]


def _product(raw: dict, attributes: dict, rng: random.Random) -> Product:
    pricing = _parse_pricing(raw.get("pricing"))
    if len(pricing) == 1:
        price, tag = pricing[0], f"${pricing[0]}"
    else:
        price, tag = round(rng.uniform(*pricing), 2), f"${pricing[0]} to ${pricing[1]}"
    options: dict[str, tuple[str, ...]] = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents:
            options[name.lower()] = tuple(c["value"].strip().replace("/", " | ").lower() for c in contents)
    bullets = raw.get("small_description") or []
    bullets = bullets if isinstance(bullets, list) else [bullets]
    attrs = (attributes.get(raw["asin"]) or {}).get("attributes") or ["DUMMY_ATTR"]
    title = raw.get("name") or ""
    return Product(asin=raw["asin"], title=title, price=price, price_tag=tag, category=raw.get("category") or "",
                   query=(raw.get("query") or "").lower().strip(), product_category=raw.get("product_category") or "",
                   type_nouns=title_nouns(title), attributes=tuple(attrs), options=options,
                   description=raw.get("full_description") or "", bullet_points=tuple(str(b) for b in bullets))


def _goal(product: Product, text: str, attrs, options, price_upper: float) -> Goal:
    return Goal(asin=product.asin, instruction_text=text, attributes=tuple(attrs), goal_options=tuple(options),
                price_upper=price_upper, query=product.query, product_category=product.product_category,
                type_nouns=product.type_nouns)


def _price_text(price_upper: float) -> str:
    return f", and price lower than {price_upper:.2f} dollars" if price_upper < NO_PRICE_BOUND else ""


def _synthetic_goals(products: list[Product], attributes: dict, rng: random.Random) -> list[Goal]:
    goals = []
    for p in products:
        info = attributes.get(p.asin) or {}
        text, attrs = info.get("instruction"), info.get("instruction_attributes")
        if not text or not attrs:
            continue
        price_upper = price_upper_for(p.price, rng)
        names = sorted(p.options)
        for combo in itertools.product(*(p.options[n] for n in names)):
            chosen = dict(zip(names, combo))
            goals.append(_goal(p, text + instruction_suffix(chosen, price_upper), attrs, combo, price_upper))
    return goals


def _human_goals(products: list[Product], human: dict, rng: random.Random) -> list[Goal]:
    goals = []
    for p in products:
        for ins in human.get(p.asin) or []:
            attrs = ins.get("instruction_attributes") or []
            if not attrs:
                continue
            options = ins.get("instruction_options") or []
            options = list(options.values()) if isinstance(options, dict) else list(options)
            price_upper = price_upper_for(p.price, rng)
            text = ins["instruction"].strip().strip(".") + _price_text(price_upper)
            goals.append(_goal(p, text, attrs, options, price_upper))
    return goals


def load_original(data_dir: str | os.PathLike, human_goals: bool = False, num_products: int | None = None,
                  seed: int = 0) -> Catalog:
    """Catalogue from WebShop's files in ``data_dir`` (cached per arguments in this process)."""
    return _load(str(Path(data_dir).expanduser().resolve()), bool(human_goals), num_products, int(seed))


@lru_cache(maxsize=4)
def _load(data_dir: str, human_goals: bool, num_products: int | None, seed: int) -> Catalog:
    directory = Path(data_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"WebShop data directory not found: {directory}")
    items_path = _pick(directory, ITEM_FILES, "items_shuffle*.json")
    attrs_path = _pick(directory, ATTR_FILES, "items_ins_v2*.json")
    raw_items = json.loads(items_path.read_text())
    attributes = json.loads(attrs_path.read_text())
    if num_products is not None:
        raw_items = raw_items[:num_products]  # the files are pre-shuffled, as WebShop assumes
    rng = random.Random(seed)
    products, seen = [], set()
    for raw in raw_items:
        asin = raw.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        products.append(_product(raw, attributes, rng))
    if human_goals:
        human_path = directory / HUMAN_FILE
        if not human_path.is_file():
            raise FileNotFoundError(f"human_goals=True needs {human_path}")
        goals = _human_goals(products, json.loads(human_path.read_text()), rng)
    else:
        goals = _synthetic_goals(products, attributes, rng)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    if not goals:
        raise ValueError(f"no usable goals in {directory} (human_goals={human_goals})")
    kind = "human" if human_goals else "synthetic"
    return Catalog(products, goals, name=f"webshop:{items_path.name}:{kind}-goals", synthetic=False)


def write_original_format(catalog: Catalog, directory: str | os.PathLike, suffix: str = "_1000") -> Path:
    """Write ``catalog`` as ``items_shuffle{suffix}.json``, ``items_ins_v2{suffix}.json`` and
    ``items_human_ins.json`` (one goal per product: its instruction without options or price
    becomes the synthetic instruction; without the price it becomes the human one)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    goal_of = {}
    for g in catalog.goals:
        goal_of.setdefault(g.asin, g)
    items, ins, human = [], {}, {}
    for p in catalog.products:
        low, _, high = p.price_tag.partition(" to ")
        items.append({
            "asin": p.asin, "name": p.title, "full_description": p.description,
            "small_description": list(p.bullet_points), "pricing": f"{low} - {high}" if high else low,
            "images": [""], "product_category": p.product_category, "query": p.query, "category": p.category,
            "customization_options": {n: [{"value": v, "image": None} for v in vals] for n, vals in p.options.items()},
        })
        ins[p.asin] = {"attributes": list(p.attributes)}
        g = goal_of.get(p.asin)
        if g is None:
            continue
        chosen = {n: v for n, vals in sorted(p.options.items()) for v in g.goal_options if v in vals}
        tail = instruction_suffix(chosen, g.price_upper)
        if not g.instruction_text.endswith(tail):
            continue  # not a synthetic-format instruction; keep the product without one
        base = g.instruction_text[: len(g.instruction_text) - len(tail)]
        ins[p.asin].update(instruction=base, instruction_attributes=list(g.attributes))
        human[p.asin] = [{"asin": p.asin, "instruction": base + instruction_suffix(chosen, NO_PRICE_BOUND),
                          "instruction_attributes": list(g.attributes), "instruction_options": list(g.goal_options)}]
    (out / f"items_shuffle{suffix}.json").write_text(json.dumps(items))
    (out / f"items_ins_v2{suffix}.json").write_text(json.dumps(ins))
    (out / HUMAN_FILE).write_text(json.dumps(human))
    return out
