"""Products, goals and the BM25 product search shared by every WebShop catalogue.

A :class:`Catalog` holds products in the normalised form WebShop's engine builds from
its raw files (title, price tag, options, attributes, description, bullet points,
reviews) plus the goals (instructions with their target attributes, options and price
bound). Search ranks products by BM25 over a ``rank_bm25`` index (pyserini's k1/b defaults) and
returns at most 50 hits, like the original Lucene index.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from rank_bm25 import BM25Okapi

SEARCH_RETURN_N = 50  # hits per search, as in WebShop
#: Pyserini's (Anserini's) BM25 defaults; rank_bm25's own defaults are 1.5 / 0.75.
BM25_K1, BM25_B = 0.9, 0.4
#: Longer queries are rejected as invalid actions (Lucene caps boolean clauses too).
MAX_QUERY_CHARS = 1000

_TOKEN = re.compile(r"[a-z0-9]+")
# Lucene's English stop set (what the original pyserini index drops at analysis time).
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split())


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric tokens without stop words (query and document side)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


@dataclass(frozen=True)
class Review:
    title: str
    score: int
    body: str


@dataclass(frozen=True, eq=False)
class Product:
    """One product as WebShop's engine sees it after loading.

    ``price`` is the single price used for the reward (WebShop draws one inside a price
    range once at load time); ``price_tag`` is what the pages show. ``type_nouns`` are the
    nouns of the product type used by the type reward (WebShop parses the title with
    spaCy; see :func:`arena_envs.webshop.reward.title_nouns`).
    """

    asin: str
    title: str
    price: float
    price_tag: str
    category: str
    query: str
    product_category: str
    type_nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    description: str
    bullet_points: tuple[str, ...]
    reviews: tuple[Review, ...] = ()
    rating: str = "N.A."
    lower_title: str = field(init=False, repr=False)
    lower_bullets: str = field(init=False, repr=False)
    lower_description: str = field(init=False, repr=False)

    def __post_init__(self):
        # Cached for the reward's substring fallbacks, which run on every purchase.
        object.__setattr__(self, "lower_title", self.title.lower())
        object.__setattr__(self, "lower_bullets", " ".join(self.bullet_points).lower())
        object.__setattr__(self, "lower_description", self.description.lower())

    def mentions(self, phrase: str) -> bool:
        """WebShop's fallback match: ``phrase`` occurs in the title, features or description."""
        return phrase in self.lower_title or phrase in self.lower_bullets or phrase in self.lower_description

    def search_text(self) -> str:
        """The indexed document: title, description, first feature and option values."""
        opts = " ".join(f"{name} {' '.join(values)}" for name, values in self.options.items())
        first = self.bullet_points[0] if self.bullet_points else ""
        return f"{self.title} {self.description} {first} {opts}"


@dataclass(frozen=True)
class Goal:
    """An instruction and what the reward checks: attributes, option values, price bound, type."""

    asin: str
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: tuple[str, ...]
    price_upper: float
    query: str
    product_category: str
    type_nouns: tuple[str, ...]
    weight: float = 1.0


class Catalog:
    """Products + goals + a lazily built, cached BM25 index."""

    def __init__(self, products: Sequence[Product], goals: Sequence[Goal], name: str, synthetic: bool):
        if not products:
            raise ValueError("a catalogue needs at least one product")
        self.products = list(products)
        self.goals = list(goals)
        self.name = name
        self.synthetic = synthetic
        self.by_asin = {p.asin: p for p in self.products}
        if len(self.by_asin) != len(self.products):
            raise ValueError("duplicate ASINs in catalogue")
        self._bm25: BM25Okapi | None = None
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._cache: OrderedDict[str, tuple[Product, ...]] = OrderedDict()

    def __repr__(self) -> str:
        return f"Catalog({self.name!r}, products={len(self.products)}, goals={len(self.goals)})"

    @property
    def bm25(self) -> BM25Okapi:
        """The rank_bm25 index (term statistics, idf with its epsilon floor)."""
        if self._bm25 is None:
            self._bm25 = BM25Okapi([tokenize(p.search_text()) for p in self.products], k1=BM25_K1, b=BM25_B)
        return self._bm25

    def _term_postings(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """term -> (ids of documents containing it, their BM25 term weights), from the rank_bm25 index.

        ``BM25Okapi.get_scores`` walks every document in Python for every query term;
        scattering precomputed weights over the term's documents gives the same floats
        (same operations, same order) at a fraction of the cost.
        """
        if self._postings is None:
            bm25 = self.bm25
            norm = bm25.k1 * (1 - bm25.b + bm25.b * np.array(bm25.doc_len) / bm25.avgdl)
            docs: dict[str, list[int]] = {}
            freqs: dict[str, list[int]] = {}
            for i, doc in enumerate(bm25.doc_freqs):
                for term, tf in doc.items():
                    docs.setdefault(term, []).append(i)
                    freqs.setdefault(term, []).append(tf)
            self._postings = {}
            for term, ids in docs.items():
                ids_arr, tf = np.array(ids), np.array(freqs[term], dtype=float)
                weights = bm25.idf[term] * (tf * (bm25.k1 + 1) / (tf + norm[ids_arr]))
                self._postings[term] = (ids_arr, weights)
        return self._postings

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        """BM25 score of every product for query ``terms`` (equal to ``self.bm25.get_scores(terms)``)."""
        postings = self._term_postings()
        out = np.zeros(len(self.products))
        for term in terms:
            hit = postings.get(term)
            if hit is not None:
                out[hit[0]] += hit[1]
        return out

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> tuple[Product, ...]:
        """Top-``k`` products for ``query`` (only documents sharing a term; ties by catalogue order)."""
        key = f"{k}\x00{query}"
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        scores = self.scores(tokenize(query))
        order = np.argsort(-scores, kind="stable")[:k]
        result = tuple(self.products[i] for i in order if scores[i] > 0)
        self._cache[key] = result
        if len(self._cache) > 4096:
            self._cache.popitem(last=False)
        return result
