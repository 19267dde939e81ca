"""WebShop purchase score: the original formula on hand-computed cases, and its interplay
with the synthetic catalogue (a wrong option costs exactly one term)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena_envs.webshop.catalog import Goal, Product
from arena_envs.webshop.reward import (best_options, fuzzy_match, normalize_color, option_match, purchase_score,
                                       title_nouns)
from arena_envs.webshop.synthetic import synthetic_catalog


def make_product(**kw) -> Product:
    base = dict(asin="B000000001", title="Acme Classic Shampoo", price=12.5, price_tag="$12.50",
                category="beauty", query="shampoo",
                product_category="Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
                type_nouns=("shampoo",), attributes=("sulfate free", "dry hair", "cruelty free"),
                options={"size": ("8 fl oz", "16 fl oz"), "scent": ("lavender", "citrus")},
                description="Acme shampoo.", bullet_points=("Gentle.",))
    base.update(kw)
    return Product(**base)


def make_goal(**kw) -> Goal:
    base = dict(asin="B000000001", instruction_text="i need sulfate free and dry hair shampoo",
                attributes=("sulfate free", "dry hair"), goal_options=("16 fl oz", "lavender"), price_upper=20.0,
                query="shampoo",
                product_category="Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
                type_nouns=("shampoo",))
    base.update(kw)
    return Goal(**base)


RIGHT = {"size": "16 fl oz", "scent": "lavender"}


def test_perfect_purchase_scores_one():
    b = purchase_score(make_product(), make_goal(), RIGHT)
    assert b.score == 1.0 and b.r_type == 1.0
    assert (b.n_attr_matched, b.n_option_matched, b.price_ok) == (2, 2, True)


@pytest.mark.parametrize("product_kw, chosen, expected", [
    ({"attributes": ("sulfate free", "cruelty free")}, RIGHT, (1 + 2 + 1) / 5),        # one attribute missing
    ({"attributes": ("cruelty free",)}, RIGHT, (0 + 2 + 1) / 5),                        # both missing
    ({}, {"size": "16 fl oz", "scent": "citrus"}, (2 + 1 + 1) / 5),                     # wrong scent
    ({}, {"size": "8 fl oz", "scent": "citrus"}, (2 + 0 + 1) / 5),                      # both options wrong
    ({}, {"size": "16 fl oz"}, (2 + 1 + 1) / 5),                                        # scent never selected
    ({}, {}, (2 + 0 + 1) / 5),                                                          # nothing selected
    ({"price": 20.01}, RIGHT, (2 + 2 + 0) / 5),                                         # over budget
    ({"price": 20.0}, RIGHT, 1.0),                                                      # budget is inclusive
    ({"price": 25.0, "attributes": ("dry hair",)}, {"scent": "citrus"}, (1 + 0 + 0) / 5),
])
def test_partial_scores_follow_the_formula(product_kw, chosen, expected):
    assert purchase_score(make_product(**product_kw), make_goal(), chosen).score == pytest.approx(expected)


def test_type_reward_levels():
    other_cat = "Electronics › Cables › HDMI"
    # No query / category match: r_type depends on the goal's type nouns found in the product.
    g = make_goal(type_nouns=tuple(f"n{i}" for i in range(10)))
    p = dict(query="cable", product_category=other_cat)
    assert purchase_score(make_product(**p, type_nouns=("n0", "n1", "n2")), g, RIGHT).r_type == 1.0  # 0.3 > 0.2
    assert purchase_score(make_product(**p, type_nouns=("n0", "n1")), g, RIGHT).r_type == 0.5       # 0.2
    assert purchase_score(make_product(**p, type_nouns=("n0",)), g, RIGHT).r_type == 0.5            # 0.1
    g11 = make_goal(type_nouns=tuple(f"n{i}" for i in range(11)))
    assert purchase_score(make_product(**p, type_nouns=("n0",)), g11, RIGHT).r_type == 0.1          # 1/11 < 0.1
    # A type-noun miss zeroes the score even when the query matches (WebShop's title_score == 0 rule).
    b = purchase_score(make_product(type_nouns=("conditioner",)), make_goal(), RIGHT)
    assert b.query_match and b.r_type == 0.0 and b.score == 0.0
    # Category overlap of >= 2 levels keeps r_type at 1 with a weak title match.
    cat_goal = make_goal(type_nouns=("a", "b", "c", "d", "e", "f", "g", "h", "i", "j"))
    b = purchase_score(make_product(query="other", type_nouns=("a", "b")), cat_goal, RIGHT)
    assert b.category_match and b.r_type == 1.0
    # Half credit scales the whole score.
    b = purchase_score(make_product(query="x", product_category=other_cat, type_nouns=("n0", "n1")), g,
                       {"size": "8 fl oz"})
    assert b.score == pytest.approx(0.5 * (2 + 0 + 1) / 5)


def test_attribute_matching_is_fuzzy_with_a_text_fallback():
    g = make_goal(attributes=("long-lasting", "machine wash", "tea tree"), goal_options=())
    p = make_product(attributes=("Long Lasting", "hand wash"), description="Acme shampoo with tea tree extract.")
    b = purchase_score(p, g, {})
    assert b.n_attr_matched == 2  # punctuation/case-insensitive fuzzy match + substring in the description
    assert b.score == pytest.approx((2 + 0 + 1) / 4)
    assert fuzzy_match("sulfate free shampoo", "sulfate free")  # token-set: a subset scores 100
    assert not fuzzy_match("machine wash", "hand wash")


def test_option_matching_size_exact_colour_normalised():
    p = make_product(options={"size": ("large", "x-large"), "color": ("black | 2 pack", "navy blue")})
    g = make_goal(goal_options=("large", "black"))
    assert option_match(p, "size", "large", g.goal_options)
    assert not option_match(p, "size", "x-large", g.goal_options)  # size is exact: no fuzzy credit
    assert option_match(p, "color", "black | 2 pack", g.goal_options)  # normalised to "black"
    assert not option_match(p, "color", "navy blue", g.goal_options)
    assert normalize_color("Gray") == "Gray" and normalize_color("gray") == "grey"
    assert normalize_color("navy blue") == "navy blue" and normalize_color("light grey heather") == "light grey"
    # An option value written in the product's own text always counts (WebShop's fallback).
    q = make_product(options={"size": ("x-large",)}, title="Acme X-Large Shampoo")
    assert option_match(q, "size", "x-large", ("small",))


def test_best_options_picks_matching_values_only():
    p = make_product(options={"size": ("8 fl oz", "16 fl oz"), "scent": ("citrus", "mint")})
    assert best_options(p, make_goal()) == {"size": "16 fl oz"}  # no lavender on offer: leave scent unselected


def test_title_nouns_fallback():
    assert title_nouns("The Acme 2-Pack Sulfate-Free Shampoo for Dry Hair, 16 oz") == (
        "acme", "pack", "sulfate-free", "shampoo", "dry", "hair")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4999), st.data())
def test_synthetic_goals_lose_exactly_one_term_per_wrong_option(goal_index, data):
    catalog = synthetic_catalog()
    goal = catalog.goals[goal_index]
    product = catalog.by_asin[goal.asin]
    right = best_options(product, goal)
    assert purchase_score(product, goal, right).score == 1.0
    denom = len(goal.attributes) + len(goal.goal_options) + 1
    groups = [n for n, vals in product.options.items() if len(vals) > 1]
    if groups:
        name = data.draw(st.sampled_from(groups))
        wrong = data.draw(st.sampled_from([v for v in product.options[name] if v != right[name]]))
        score = purchase_score(product, goal, {**right, name: wrong}).score
        assert score == pytest.approx(1.0 - 1.0 / denom)
    dropped = data.draw(st.sampled_from(goal.attributes))
    # Without one goal attribute anywhere (attributes or text) the score drops by one term.
    fewer = dataclasses.replace(product, title=product.query, description="", bullet_points=(),
                                attributes=tuple(a for a in product.attributes if a != dropped))
    assert purchase_score(fewer, goal, right).score == pytest.approx(1.0 - 1.0 / denom)
