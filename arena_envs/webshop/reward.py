"""WebShop's purchase score.

    score = r_type × (n_attr_matched + n_option_matched + [price ≤ price_upper])
                   / (n_goal_attrs + n_goal_options + 1)

with ``r_type`` ∈ {1, 0.5, 0.1, 0} from query / category / title-noun overlap. Attribute
and option matching follow the original: fuzzy ``token_set_ratio > 85`` (WebShop uses
thefuzz, i.e. rapidfuzz with thefuzz's default preprocessing and integer rounding),
exact matching for ``size``, colour normalisation, and a substring fallback on the
purchased product's title, features and description. As in the original, options are
counted over the *purchased* options, so buying without selecting options loses them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from arena_envs.webshop.catalog import STOPWORDS, Goal, Product

FUZZY_THRESHOLD = 85
EXACT_MATCH_OPTIONS = ("size",)

#: Colour names for normalisation; compound names come first so that "navy blue" is not
#: read as "blue". A value naming one of these colours (as whole words) is replaced by it.
COLOR_NAMES = (
    "navy blue", "light blue", "sky blue", "royal blue", "dark blue", "light grey", "dark grey", "hot pink",
    "light pink", "rose gold", "off white", "army green", "dark green", "light green", "wine red",
    "black", "white", "grey", "navy", "red", "blue", "green", "pink", "beige", "brown", "purple", "yellow",
    "orange", "teal", "burgundy", "olive", "ivory", "khaki", "charcoal", "silver", "gold", "cream", "coral",
)
_COLOR_ALIASES = {"gray": "grey", "light gray": "light grey", "dark gray": "dark grey"}
_COLOR_RES = tuple((re.compile(rf"\b{re.escape(c)}\b"), c) for c in COLOR_NAMES)


@lru_cache(maxsize=1 << 16)
def normalize_color(value: str) -> str:
    """Map a colour description to its canonical colour name, else return it unchanged."""
    value = _COLOR_ALIASES.get(value, value)
    for pattern, name in _COLOR_RES:
        if pattern.search(value):
            return name
    return value


def fuzzy_match(a: str, b: str) -> bool:
    """thefuzz's ``token_set_ratio(a, b) > 85`` (lower-cased, punctuation-stripped, rounded)."""
    return round(fuzz.token_set_ratio(a, b, processor=default_process)) > FUZZY_THRESHOLD


def title_nouns(title: str) -> tuple[str, ...]:
    """Stand-in for WebShop's spaCy noun extraction when a product has no explicit type nouns.

    Without a POS tagger we keep the alphabetic content words of the title (3+ letters,
    no stop words): a superset of its nouns, so title overlap scores come out lower
    than with spaCy. The synthetic catalogue stores explicit type nouns instead.
    """
    words = re.findall(r"[a-z][a-z'-]*[a-z]", title.lower())
    return tuple(dict.fromkeys(w for w in words if len(w) >= 3 and w not in STOPWORDS))


@dataclass(frozen=True)
class ScoreBreakdown:
    score: float
    r_type: float
    n_attr_matched: int
    n_option_matched: int
    price_ok: bool
    n_goal_attrs: int
    n_goal_options: int
    query_match: bool
    category_match: bool
    title_score: float


def _type_reward(product: Product, goal: Goal) -> tuple[float, bool, bool, float]:
    query_match = product.query == goal.query
    cats_p = {c.strip() for c in product.product_category.split("›")}
    cats_g = {c.strip() for c in goal.product_category.split("›")}
    category_match = len(cats_p & cats_g) >= 2
    desired = set(goal.type_nouns)
    title_score = 0.2 if not desired else len(desired & set(product.type_nouns)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(product: Product, goal_attrs: Sequence[str]) -> int:
    """Goal attributes found among the product's attributes (fuzzy) or in its text."""
    return sum(1 for g in goal_attrs
               if any(fuzzy_match(p, g) for p in product.attributes) or product.mentions(g))


def option_match(product: Product, name: str, value: str, goal_options: Sequence[str]) -> bool:
    """Does one purchased option ``name: value`` satisfy some goal option?"""
    value = normalize_color(value)
    goals = [normalize_color(o) for o in goal_options]
    if name.lower() in EXACT_MATCH_OPTIONS:
        matched = value in goals
    else:
        matched = any(fuzzy_match(g, value) for g in goals)
    return matched or product.mentions(value)


def option_matches(product: Product, goal_options: Sequence[str], chosen: Mapping[str, str]) -> int:
    return sum(option_match(product, name, value, goal_options) for name, value in chosen.items())


def purchase_score(product: Product, goal: Goal, chosen: Mapping[str, str], price: float | None = None
                   ) -> ScoreBreakdown:
    """Score of buying ``product`` with options ``chosen`` (name -> value) for ``goal``."""
    price = product.price if price is None else price
    r_type, query_match, category_match, title_score = _type_reward(product, goal)
    n_attr = attribute_matches(product, goal.attributes)
    n_opt = option_matches(product, goal.goal_options, chosen)
    price_ok = price <= goal.price_upper
    denom = len(goal.attributes) + len(goal.goal_options) + 1
    score = r_type * (n_attr + n_opt + int(price_ok)) / denom
    return ScoreBreakdown(score=score, r_type=r_type, n_attr_matched=n_attr, n_option_matched=n_opt,
                          price_ok=price_ok, n_goal_attrs=len(goal.attributes),
                          n_goal_options=len(goal.goal_options), query_match=query_match,
                          category_match=category_match, title_score=title_score)


def best_options(product: Product, goal: Goal) -> dict[str, str]:
    """Per option group, a value that matches the goal (exact goal value preferred), if any.

    Each purchased option is scored on its own, so choosing group by group maximises the
    option count; groups without a matching value are left unselected.
    """
    wanted = {normalize_color(o) for o in goal.goal_options}
    chosen: dict[str, str] = {}
    for name, values in product.options.items():
        matching = [v for v in values if option_match(product, name, v, goal.goal_options)]
        if matching:
            exact = [v for v in matching if normalize_color(v) in wanted]
            chosen[name] = (exact or matching)[0]
    return chosen
