"""TRL adapter: parity with the in-process stack, TRL's own tool parsing, and two GRPOTrainer steps on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="needs the [trl] extra (trl)")
pytest.importorskip("datasets", reason="needs the [trl] extra (datasets)")

import wrappers  # noqa: E402
from arena_envs.sokoban import STEP_REWARD  # noqa: E402
from integrations.trl_env import EPISODE_OVER, TRLEnvironment, environment_factory, trl_dataset  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trl_sokoban.py"
ENV_ID = "ARL/Sokoban-Mini-v0"
TINY_KWARGS = dict(prompt_style="compact", history_length=0)


def expert_episode(env_id: str, seed: int, **kwargs) -> tuple[str, list[str], float]:
    """(first user prompt, responses, training return) of one in-process episode: a malformed response, then
    the expert's moves to the end."""
    env = wrappers.make_env(env_id, **kwargs)
    _, info = env.reset(seed=seed)
    first, responses, total, done = info["messages"][-1]["content"], [], 0.0, False
    while not done:
        response = "no tags at all" if not responses else wrappers.format_response(env.unwrapped.expert_action())
        _, reward, terminated, truncated, _ = env.step(response)
        responses.append(response)
        total, done = total + reward, terminated or truncated
    env.close()
    return first, responses, total


@pytest.mark.parametrize("env_id", ["ARL/Sokoban-Mini-v0", "ARL/WebShop-v0", "ARL/TIRMath-v0"])
@pytest.mark.parametrize("seed", [0, 7])
def test_same_first_prompt_and_return_as_the_stack(env_id, seed):
    first, responses, total = expert_episode(env_id, seed)
    env = environment_factory(env_id)()
    assert env.reset(seed=seed, prompt=[{"role": "user", "content": ""}]) == first  # dataset columns are ignored
    for response in responses:
        env.act(response)
    assert env.get_reward() == pytest.approx(total, abs=1e-12)
    with pytest.raises(ValueError, match="episode is over"):
        env.act(responses[-1])
    assert env.get_reward() == pytest.approx(total, abs=1e-12)  # scoring twice changes nothing


def test_unfinished_episode_plays_one_empty_turn():
    env, stack = TRLEnvironment(ENV_ID), wrappers.make_env(ENV_ID)
    env.reset(seed=3)
    stack.reset(seed=3)
    move = wrappers.format_response(stack.unwrapped.expert_action())
    env.act(move)
    first = stack.step(move)[1]
    assert env.get_reward() == pytest.approx(first + stack.step("")[1])
    assert env.get_reward() == pytest.approx(first + STEP_REWARD - 0.1)  # an invalid move, and the format penalty


def test_act_before_reset_and_bad_ids():
    env = TRLEnvironment(ENV_ID)
    with pytest.raises(ValueError, match=EPISODE_OVER[:20]):
        env.act("<think></think><action>up</action>")
    with pytest.raises(Exception, match="NoSuchEnv"):
        environment_factory("ARL/NoSuchEnv-v0")
    with pytest.raises(ValueError, match="prompt_style"):
        environment_factory(ENV_ID, prompt_style="nope")


def test_dataset_rows():
    data = trl_dataset(ENV_ID, [4, 9])
    assert data["seed"] == [4, 9]
    env = wrappers.make_env(ENV_ID)
    system = env.reset(seed=4)[1]["messages"][0]
    assert data[0]["prompt"] == [system, {"role": "user", "content": ""}]
    assert trl_dataset(ENV_ID, [1], prompt_style="arlarena")[0]["prompt"] == [{"role": "user", "content": ""}]
    with pytest.raises(ValueError, match="at least one seed"):
        trl_dataset(ENV_ID, [])


def tool_call(response: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "act", "arguments": {"response": response}}) + "\n</tool_call>"


def test_trl_parses_a_tool_call_into_an_act_call(tmp_path):
    """TRL's own tool schema (from act's docstring) and response parser carry our response to act unchanged."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, parse_response, qwen3_chat_template

    from arena_models import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path))
    tokenizer.chat_template = qwen3_chat_template
    add_response_schema(tokenizer)
    env, stack = TRLEnvironment(ENV_ID), wrappers.make_env(ENV_ID)
    first = env.reset(seed=2)
    stack.reset(seed=2)
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": first}], tools=[env.act],
                                          add_generation_prompt=True, tokenize=True)["input_ids"]
    assert '"name": "act"' in tokenizer.decode(prefix)  # the schema built from act's docstring is in the prompt
    response = wrappers.format_response(stack.unwrapped.expert_action(), think="box left of target")
    ids = tokenizer(tool_call(response) + "<|im_end|>", add_special_tokens=False)["input_ids"]
    parsed = parse_response(tokenizer, ids, prefix=prefix, tools=[env.act])
    (call,) = parsed["tool_calls"]
    assert call["function"] == {"name": "act", "arguments": {"response": response}}
    assert env.act(**call["function"]["arguments"]) == stack.step(response)[4]["messages"][-1]["content"]


@pytest.mark.slow
def test_example_plays_the_env_through_the_tool_and_says_what_it_showed(tmp_path):
    """The example's own run: a behaviour-cloned tiny model calls act, the rewards of a group differ (a non-zero
    gradient), and the last line calls it a plumbing check (a random model never calls the tool)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(EXAMPLE), "--output-dir", str(tmp_path / "run")]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{\"")]
    steps = [entry for entry in logs if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2, 3, 4]
    assert all("rewards/TRLEnvironment/mean" in entry for entry in steps)
    assert min(entry["tools/call_frequency"] for entry in steps) > 0  # every step played the env through act
    assert max(entry["grad_norm"] for entry in steps) > 0  # a group's rewards differed: GRPO had a signal
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("summary: 4 GRPO steps") and last.endswith("a plumbing check (the env is played "
                                                                      "through TRL and scored), not a learning result")


def test_a_mixture_is_trls_dict_of_environments():
    from arena_train.mixture import Mixture
    from integrations.trl_env import environment_factories, trl_mixture_dataset

    mixture = Mixture.parse([ENV_ID, "ARL/WebShop-v0"], [1, 3])
    factories = environment_factories(mixture, **TINY_KWARGS)
    envs = {name: factory() for name, factory in factories.items()}
    assert list(envs) == ["Sokoban-Mini", "WebShop"]
    # one class per env: TRL's reward column of a class scores only that env's rollouts, logged apart
    assert [type(e).__name__ for e in envs.values()] == ["TRLEnvironment[Sokoban-Mini]", "TRLEnvironment[WebShop]"]
    assert all(isinstance(e, TRLEnvironment) for e in envs.values())
    dataset = trl_mixture_dataset(mixture, 8, **TINY_KWARGS)
    assert dataset["environment"] == ["Sokoban-Mini"] * 2 + ["WebShop"] * 6 and dataset["seed"][:3] == [0, 1, 0]
    for row in dataset.select([0, 7]):
        alone = TRLEnvironment(dict(zip(mixture.names, mixture.env_ids))[row["environment"]], **TINY_KWARGS)
        assert envs[row["environment"]].reset(seed=row["seed"]) == alone.reset(seed=row["seed"])
        assert row["prompt"] == trl_dataset(alone._env.spec.id, [row["seed"]], **TINY_KWARGS)["prompt"][0]
