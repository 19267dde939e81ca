"""eval.compare's numbers: per-seed and room-paired differences against the baseline, hand-computed."""

from __future__ import annotations

import pytest

from eval.compare import MethodRow, against, table


def row(method: str, wins: dict[int, list[int]], collapses: list[str] | None = None) -> MethodRow:
    seeds = sorted(wins)
    return MethodRow(method, "IS", seeds, [100 * sum(wins[s]) / len(wins[s]) for s in seeds], [1.0] * len(seeds),
                     wins, collapses or [])


def test_differences_are_paired_by_seed_and_room():
    base = row("GRPO", {1: [1, 0, 0, 1], 2: [0, 0, 1, 1]})
    other = row("SAMPO", {1: [1, 1, 0, 1], 2: [0, 0, 1, 1], 3: [1, 1, 1, 1]})  # seed 3 has no baseline: left out
    per_seed, pooled = against(other, base)
    assert per_seed.n == 2 and per_seed.mean == pytest.approx(12.5)  # +25 and 0 points
    assert pooled.n == 8 and pooled.mean == pytest.approx(12.5)
    assert pooled.low < 0 < pooled.high  # one room in eight better: not resolved


def test_table_has_a_row_per_method_and_the_collapses():
    base = row("GRPO", {1: [1, 0], 2: [1, 1]})
    sapo = row("SAPO", {1: [0, 0], 2: [1, 0]}, ["s2@34 (success_drop)"])
    text = table([base, sapo], "GRPO").splitlines()
    assert len(text) == 4 and text[2].startswith("| IS | GRPO | 2 | 75.0 [")
    assert "s2@34 (success_drop)" in text[3] and "-50.0" in text[3] and "0.0 / 50.0" in text[3]
