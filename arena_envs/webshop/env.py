"""``ARL/WebShop-v0``: find and buy the product an instruction asks for (WebShop text mode).

Page flow and text follow WebShop's ``text`` observation mode, page elements joined by
`` [SEP] ``:

- search: ``WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search``
- results (10 per page, at most 50 hits): ``Instruction: [SEP] <instruction> [SEP] Back to Search
  [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B0… [SEP] <title> [SEP] $12.99 …``
- item: ``… Back to Search [SEP] < Prev [SEP] <option name> [SEP] <value> … [SEP] <title> [SEP]
  Price: $… [SEP] Rating: … [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now``
- description / features / reviews sub-pages (``< Prev`` returns to the item, options kept).

``obs_format="arlarena"`` instead returns what ARLArena's prompt shows: the elements after
the instruction, each in single quotes (``'Back to Search' [SEP] 'Page 1 (Total results: 50)' …``).

Actions are ``search[<query>]`` (only on the search page; any non-empty query up to 1000
characters) and ``click[<element>]`` with an element listed on the page (matched
case-insensitively, like WebShop, which lower-cases the argument). Selecting options
is not shown on the page (as in WebShop's simple text mode). Any other string is an
invalid action: nothing changes. ``click[Buy Now]`` ends the episode with WebShop's
purchase score (:mod:`arena_envs.webshop.reward`) in ``info["score"]``; the reward is
ARLArena's ``10 if score == 1 else 0`` (``reward_mode="arlarena"``, default) or the score
itself (``reward_mode="score"``). ``won`` iff the score is 1. The step limit (15) comes
from the registration (``gym.make``).

Catalogue: ``data_path=None`` uses ``$WEBSHOP_DATA`` if set, otherwise the seeded
synthetic catalogue (:mod:`arena_envs.webshop.synthetic`; ``data_path="synthetic"``
forces it). Goals are split as in ARLArena: the first 500 (at most half) are ``test``,
the rest ``train``; reset draws one uniformly with ``self.np_random`` or takes
``options={"goal_index": i}`` (an index into the whole goal list).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from arena_envs.base import TextEnv, int_option
from arena_envs.webshop.catalog import MAX_QUERY_CHARS, Catalog, Goal, Product
from arena_envs.webshop.original import ENV_VAR, load_original
from arena_envs.webshop.reward import best_options, purchase_score
from arena_envs.webshop.synthetic import DEFAULT_NUM_PRODUCTS, synthetic_catalog

SEP = " [SEP] "
PAGE_SIZE = 10
TEST_GOALS = 500
WIN_REWARD = 10.0
SUB_PAGES = ("description", "features", "reviews")
SEARCH_PATTERN = "search[<your query>]"
REWARD_MODES = ("arlarena", "score")
OBS_FORMATS = ("webshop", "arlarena")
SPLITS = ("train", "test", "all")

_ACTION = re.compile(r"\s*(search|click)\[(.*)\]\s*", re.IGNORECASE | re.DOTALL)

_INSTRUCTIONS = """WebShop: find and buy the product that matches the instruction.
Actions: search[<your query>] on the search page (free text), or click[<element>] with an element \
listed in the admissible actions: a product id on the results page, "next >" / "< prev" to page \
through results or go back, an option value (size, colour, ...) on the product page to select it, \
"description" / "features" / "reviews" to read more, "back to search" to start over, and \
"buy now" to purchase the product with the selected options (this ends the episode).
The purchase is scored on the product type, the requested attributes, the selected options and \
the price limit; select every requested option before buying."""


def resolve_catalog(data_path: str | os.PathLike | None = None, human_goals: bool = False,
                    num_products: int | None = None, catalog_seed: int = 0) -> Catalog:
    """The catalogue an env with these arguments uses (cached in-process)."""
    path = data_path if data_path is not None else os.environ.get(ENV_VAR) or None
    if path is None or str(path) == "synthetic":
        if human_goals:
            raise ValueError("human_goals=True needs the original WebShop files (data_path or $WEBSHOP_DATA)")
        return synthetic_catalog(DEFAULT_NUM_PRODUCTS if num_products is None else int(num_products),
                                 int(catalog_seed))
    return load_original(path, human_goals=human_goals, num_products=num_products, seed=catalog_seed)


def parse_action(action: str) -> tuple[str, str] | None:
    """``("search"|"click", lower-cased stripped argument)`` or ``None`` if not of that form."""
    m = _ACTION.fullmatch(action)
    return (m.group(1).lower(), m.group(2).strip().lower()) if m else None


class WebShopEnv(TextEnv):
    """WebShop in pure Python over a synthetic or original catalogue.

    Args:
        data_path: directory with WebShop's JSON files, ``"synthetic"``, or ``None``
            (``$WEBSHOP_DATA`` if set, else synthetic).
        human_goals: use ``items_human_ins.json`` instructions (original files only).
        num_products: synthetic catalogue size (default 5000), or the first N products of
            the original file (default all).
        catalog_seed: seed of the synthetic catalogue and of price/budget draws.
        split: ``"train"``, ``"test"`` (first 500 goals) or ``"all"``.
        reward_mode: ``"arlarena"`` (+10 on a perfect purchase, else 0) or ``"score"``.
        obs_format: ``"webshop"`` (the page text as WebShop returns it) or ``"arlarena"``
            (what ARLArena shows the model: the elements after the instruction, each in
            single quotes; the done page unchanged).
    """

    reset_options = ("goal_index",)

    def __init__(self, data_path: str | os.PathLike | None = None, human_goals: bool = False,
                 num_products: int | None = None, catalog_seed: int = 0, split: str = "train",
                 reward_mode: str = "arlarena", obs_format: str = "webshop", render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        if obs_format not in OBS_FORMATS:
            raise ValueError(f"obs_format must be one of {OBS_FORMATS}, got {obs_format!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.catalog = resolve_catalog(data_path, human_goals, num_products, catalog_seed)
        self.reward_mode = reward_mode
        self.obs_format = obs_format
        self.split = split
        n_test = min(TEST_GOALS, len(self.catalog.goals) // 2)
        self.goal_indices = {"test": range(n_test), "train": range(n_test, len(self.catalog.goals)),
                             "all": range(len(self.catalog.goals))}[split]
        if len(self.goal_indices) == 0:
            raise ValueError(f"split {split!r} of {self.catalog!r} has no goals")
        self.goal: Goal | None = None
        self.goal_index = -1
        self._page = "search"
        self._results: tuple[Product, ...] = ()
        self._result_page = 1
        self._product: Product | None = None
        self._options: dict[str, str] = {}
        self._score = 0.0
        self._queries: list[str] = []
        self._plans: dict[str, tuple[Product, dict[str, str], float] | None] = {}

    # --- TextEnv ----------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        idx = int_option(options, "goal_index", 0, len(self.catalog.goals))
        if idx is None:
            idx = self.goal_indices[int(self.np_random.integers(len(self.goal_indices)))]
        self.goal_index = idx
        self.goal = self.catalog.goals[self.goal_index]
        self._page, self._results, self._result_page = "search", (), 1
        self._product, self._options, self._score = None, {}, 0.0
        self._queries, self._plans = [], {}
        return self._render(), self._info(valid=True)

    def _step(self, action: str):
        parsed = parse_action(action)
        valid, reward, terminated = False, 0.0, False
        if parsed is not None:
            kind, arg = parsed
            if kind == "search" and self._page == "search" and arg and len(arg) <= MAX_QUERY_CHARS:
                self._search(arg)
                valid = True
            elif kind == "click" and arg in self._clickables():
                terminated = self._click(arg)
                valid = True
        info = self._info(valid)
        if terminated:
            breakdown = purchase_score(self._product, self.goal, self._options)
            self._score = breakdown.score
            info.update(score=self._score, won=self._won(), score_breakdown=dataclasses.asdict(breakdown),
                        page="done")
            reward = (WIN_REWARD if self._won() else 0.0) if self.reward_mode == "arlarena" else self._score
        return self._render(), reward, terminated, False, info

    def task_description(self) -> str:
        return self.goal.instruction_text if self.goal is not None else ""

    def admissible_actions(self) -> list[str]:
        if self._page == "search":
            return [SEARCH_PATTERN]
        return [f"click[{c}]" for c in self._clickables()]

    def anchor_key(self, obs: str) -> str:
        """The page without the instruction (what ARLArena keys GiGPO anchor states on)."""
        parts = obs.split(SEP)
        if parts[:2] == ["WebShop", "Instruction:"]:
            return SEP.join(parts[3:])
        if parts[:1] == ["Instruction:"]:
            return SEP.join(parts[2:])
        return obs.strip()

    def prompt_instructions(self) -> str:
        return _INSTRUCTIONS

    def expert_action(self) -> str:
        """Search the instruction, open the best product among the hits (the target when
        listed), select the options that match the goal, buy. If no hit can score 1, search
        once more with the product type, attributes and options."""
        goal = self.goal
        if self._page == "search":
            query = goal.instruction_text if not self._queries else " ".join(
                (goal.query, *goal.attributes, *goal.goal_options))
            return f"search[{query[:MAX_QUERY_CHARS]}]"
        if self._page == "results":
            plan = self._plan()
            if plan is None or (plan[2] < 1.0 and len(self._queries) < 2):
                return "click[back to search]"
            page = self._results.index(plan[0]) // PAGE_SIZE + 1
            if page != self._result_page:
                return "click[next >]" if page > self._result_page else "click[< prev]"
            return f"click[{plan[0].asin.lower()}]"
        if self._page == "item":
            plan = self._plan()
            if plan is None or plan[0] is not self._product:
                return "click[< prev]"
            for name, value in plan[1].items():
                if self._options.get(name) != value:
                    return f"click[{value}]"
            return "click[buy now]"
        if self._page in SUB_PAGES:
            return "click[< prev]"
        return ""

    # --- state transitions ----------------------------------------------------------
    def _search(self, query: str) -> None:
        self._queries.append(query)
        self._results = self.catalog.search(query)
        self._page, self._result_page, self._product, self._options = "results", 1, None, {}

    def _click(self, element: str) -> bool:
        """Apply a listed click; True when it was the purchase."""
        kind, payload = self._clickables()[element]
        if kind == "buy":
            self._page = "done"
            return True
        if kind == "back":
            self._page, self._results, self._product, self._options = "search", (), None, {}
        elif kind == "page":
            self._result_page += payload
        elif kind == "product":
            self._page, self._product, self._options = "item", payload, {}
        elif kind == "option":
            self._options[payload] = element
        elif kind == "sub":
            self._page = payload
        elif kind == "prev":  # item -> results (options dropped, as WebShop re-renders the results)
            if self._page == "item":
                self._page, self._product, self._options = "results", None, {}
            else:
                self._page = "item"
        return False

    def _clickables(self) -> dict[str, tuple[str, Any]]:
        """Lower-cased element text -> (kind, payload), in page order."""
        page = self._page
        if page in ("search", "done"):
            return {}
        out: dict[str, tuple[str, Any]] = {"back to search": ("back", None)}
        if page == "results":
            if self._result_page > 1:
                out["< prev"] = ("page", -1)
            if self._result_page * PAGE_SIZE < len(self._results):
                out["next >"] = ("page", 1)
            for p in self._page_results():
                out[p.asin.lower()] = ("product", p)
            return out
        out["< prev"] = ("prev", None)
        if page == "item":
            for name, values in self._product.options.items():
                for v in values:
                    out[v] = ("option", name)
            for sub in SUB_PAGES:
                out[sub] = ("sub", sub)
            out["buy now"] = ("buy", None)
        return out

    def _page_results(self) -> tuple[Product, ...]:
        start = (self._result_page - 1) * PAGE_SIZE
        return self._results[start:start + PAGE_SIZE]

    # --- rendering --------------------------------------------------------------------
    def _render(self) -> str:
        page, instruction = self._page, ["Instruction:", self.task_description()]
        if page == "search":
            parts = ["WebShop", *instruction, "Search"]
        elif page == "done":
            parts = ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{self._score:.4g}"]
        elif page == "results":
            parts = [*instruction, "Back to Search", f"Page {self._result_page} (Total results: {len(self._results)})"]
            if self._result_page > 1:
                parts.append("< Prev")
            if self._result_page * PAGE_SIZE < len(self._results):
                parts.append("Next >")
            for p in self._page_results():
                parts += [p.asin, p.title, p.price_tag]
        else:
            p = self._product
            parts = [*instruction, "Back to Search", "< Prev"]
            if page == "item":
                for name, values in p.options.items():
                    parts += [name, *values]
                parts += [p.title, f"Price: {p.price_tag}", f"Rating: {p.rating}", "Description", "Features",
                          "Reviews", "Buy Now"]
            elif page == "description":
                parts.append(p.description)
            elif page == "features":
                parts += list(p.bullet_points)
            else:
                for r in p.reviews:
                    parts += [r.title, str(r.score), r.body]
        parts = [x for x in parts if x]
        if self.obs_format == "arlarena" and page != "done":
            parts = [f"'{x}'" for x in parts[parts.index("Instruction:") + 2:]]
        return SEP.join(parts)

    def _info(self, valid: bool) -> dict[str, Any]:
        return {"action_is_valid": valid, "won": self._won(), "score": self._score, "page": self._page}

    def _won(self) -> bool:
        return self._page == "done" and self._score >= 1.0 - 1e-9

    # --- expert planning ----------------------------------------------------------------
    def _plan(self) -> tuple[Product, dict[str, str], float] | None:
        """Best result for the current query: (product, options to select, achievable score)."""
        key = self._queries[-1]
        if key not in self._plans:
            best = None
            for rank, p in enumerate(self._results):
                chosen = best_options(p, self.goal)
                score = purchase_score(p, self.goal, chosen).score
                rank_key = (score, p.asin == self.goal.asin, -rank)
                if best is None or rank_key > best[0]:
                    best = (rank_key, (p, chosen, score))
            self._plans[key] = None if best is None else best[1]
        return self._plans[key]
