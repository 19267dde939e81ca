"""eval.compare's numbers: per-seed and room-paired differences against the baseline, hand-computed; success
intervals inside [0, 100]."""

from __future__ import annotations

import pytest

from eval.compare import MethodRow, against, success_ci, table


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


def test_success_interval_stays_inside_0_100_with_two_seeds():
    """Seeds at 0 % and 25 %: a t-interval over the two seed means is 12.5 ± 12.71 × 12.5, i.e. [-146, 171]; the
    Wilson interval stays a rate, and the table cell is the same interval."""
    sapo = row("SAPO", {1: [0, 0, 0, 0], 2: [1, 0, 0, 0]})
    e = success_ci(sapo)
    assert e.n == 2 and e.mean == pytest.approx(12.5)
    assert 0.0 <= e.low < 12.5 < e.high <= 100.0
    cell = table([sapo], "GRPO").splitlines()[2].split(" | ")[3]
    assert cell == f"12.5 [{e.low:.1f}, {e.high:.1f}]"


def test_success_interval_at_0_and_100_percent():
    """Every episode lost (or won): the interval touches the bound it sits on and keeps some width on the other
    side, where a t-interval collapses to a point."""
    lost, won = success_ci(row("CISPO", {1: [0] * 10, 2: [0] * 10})), success_ci(row("SAMPO", {1: [1] * 10}))
    assert lost.low == 0.0 and 0.0 < lost.high < 100.0
    assert won.high == 100.0 and 0.0 < won.low < 100.0


def test_t_intervals_say_over_how_many_seeds_or_pairs():
    base = row("GRPO", {1: [1, 0, 0, 1], 2: [0, 0, 1, 1]})
    other = row("SAMPO", {1: [1, 1, 0, 1], 2: [0, 0, 1, 1]})
    cells = table([base, other], "GRPO").splitlines()[3].split(" | ")
    assert cells[4].endswith("(t, 2 seeds)")  # score
    assert cells[5].startswith("12.5 [") and cells[5].endswith("(t, 2 seeds)")
    assert cells[6].startswith("12.5 [") and cells[6].endswith("(t, 8 pairs)")
    one_seed = table([row("GRPO", {1: [1, 0]}), row("SAPO", {1: [0, 0]})], "GRPO").splitlines()[3].split(" | ")
    assert cells and one_seed[4] == "1.00 (1 seed)" and one_seed[5] == "-50.0 (1 seed)"
