"""TextWorld's text as the model reads it: no title art on the first turn, no prompt and status line padded with
~120 spaces on every turn, the game's own lines unchanged; ``raw_text=True`` keeps TextWorld's text as printed.
Played on every TextWorld id (the first game of each, an expert episode to its end)."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

from arena_envs import ENV_IDS
from arena_envs.textworld_env import clean_text

pytest.importorskip("textworld", reason="needs the [textworld] extra")

TEXTWORLD_IDS = [env_id for env_id in ENV_IDS if env_id.startswith("ARL/TextWorld")]


def game_lines(raw: str) -> list[str]:
    """The non-blank lines of TextWorld's output without the leading art and the closing prompt/status line."""
    lines = raw.split("\n")
    while lines and not any(ch.isalnum() for ch in lines[0]):
        lines.pop(0)
    if lines and lines[-1].startswith(">"):
        lines.pop()
    return [line for line in lines if line.strip()]


def expert_episode(env) -> list[str]:
    texts = [env.reset(seed=0)[0]]
    for _ in range(gym.spec(env.spec.id).max_episode_steps):
        obs, _, terminated, truncated, _ = env.step(env.unwrapped.expert_action())
        texts.append(obs)
        if terminated or truncated:
            break
    return texts


@pytest.mark.parametrize("env_id", TEXTWORLD_IDS)
def test_the_model_reads_the_game_text_without_art_or_padding(env_id):
    env = gym.make(env_id, raw_text=True)
    raw = expert_episode(env)
    assert "$$$$" in raw[0] and " " * 100 in raw[0]  # what TextWorld prints: title art, the padded status line
    for text in raw:
        clean = clean_text(text)
        # no padding after text (the game's centred "*** The End ***" keeps its indent)
        assert "$$" not in clean and re.search(r"\S {10,}", clean) is None and "\n\n\n" not in clean, clean
        assert not clean.rstrip().endswith("=-") and "=-0/" not in clean
        assert [line for line in clean.split("\n") if line.strip()] == game_lines(text)  # the game's lines, as is
    env.unwrapped.raw_text = False  # the same episode as the model reads it
    assert expert_episode(env) == [clean_text(text) for text in raw]
    assert len(clean_text(raw[0])) < len(raw[0]) - 800
    env.close()


def test_clean_text_keeps_text_that_is_not_the_prompt_line():
    assert clean_text("") == ""
    assert clean_text("\n\n>   ") == ""
    assert clean_text("You see a > sign.\n\n\n\n>" + " " * 120 + "-= Shed Room =-3/14") == "You see a > sign."
    assert clean_text("  ___\n |   |\n\nHello.\n  indented line\n\n>") == "Hello.\n  indented line"
    assert clean_text("a\n\n\n\nb\n> c") == "a\n\nb\n> c"  # a last line with other text is the game's
