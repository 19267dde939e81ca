"""arena_train.resume: ``--resume`` takes every value from the run's args.json; a flag given again with another
value is refused (one message listing each difference) unless it may change mid-run or is named in
``--resume-override``; accepted changes are appended to the record, never written over it; no run, or a finished
one, is a one-line error that says what to do. In-process: parse_args on a recorded run folder, no training."""

from __future__ import annotations

import json

import pytest
from conftest import load_script

from arena_train.cli import ALIASES, flat_args, parse_args, replace_flat
from arena_train.resume import (
    CONTROL,
    MID_RUN,
    given_fields,
    recorded,
    run_folders,
    updated_record,
)

grpo = load_script("grpo")


def record_run(output_dir, name="r", finished=False, **values):
    """A run folder as algos/grpo.py leaves it: args.json of the run's values, a checkpoint, metrics."""
    run_dir = output_dir / name
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"iteration": 1}\n')
    args = replace_flat(grpo.Args(), output_dir=str(output_dir), run_name=name, **values)
    (run_dir / "args.json").write_text(json.dumps({**flat_args(args), "world_size": 1}, indent=1))
    if finished:
        (run_dir / "summary.json").write_text("{}")
    return run_dir


def resume(output_dir, *argv, name="r"):
    return parse_args(grpo.Args, grpo.GPU_PROFILE, ["--output-dir", str(output_dir), "--run-name", name, "--resume",
                                                    *argv])


def test_flags_not_given_again_take_the_recorded_values(tmp_path):
    record_run(tmp_path, kl_coef=0.05, learning_rate=3e-4, loss_agg_mode="seq-mean-token-mean", use_seq_mask=True,
               collapse_warmup=2, eval_episodes=4, num_iterations=3)
    args = resume(tmp_path)
    assert (args.kl_coef, args.learning_rate, args.loss_agg_mode, args.use_seq_mask) == (0.05, 3e-4,
                                                                                        "seq-mean-token-mean", True)
    assert (args.collapse.warmup, args.eval.eval_episodes, args.num_iterations) == (2, 4, 3)
    assert args.run.resume and args.run.run_name == "r"


def test_a_run_recorded_before_a_field_existed_resumes_with_the_value_it_had(tmp_path):
    """A run trained before --episode-streams became the default (its args.json has no such field) keeps the
    process stream on resume; turning the streams on is a recipe change, refused unless overridden."""
    run_dir = record_run(tmp_path)
    record = json.loads((run_dir / "args.json").read_text())
    assert record.pop("episode_streams") is True  # today's runs record the default
    (run_dir / "args.json").write_text(json.dumps(record))
    assert resume(tmp_path).engine.episode_streams is False
    with pytest.raises(SystemExit, match="--episode-streams: run False, now True"):
        resume(tmp_path, "--episode-streams")
    assert resume(tmp_path, "--episode-streams", "--resume-override", "episode-streams").engine.episode_streams is True
    assert grpo.Args().engine.episode_streams is True


def test_another_script_may_not_resume_the_run(tmp_path):
    """grpo.py's run resumed by sapo.py (same --run-name) is refused in one line naming the script that trained it;
    a run started under a given --exp-name resumes when that name is given again."""
    record_run(tmp_path)
    sapo = load_script("sapo")
    argv = ["--output-dir", str(tmp_path), "--run-name", "r", "--resume"]
    with pytest.raises(SystemExit, match=r"was trained as grpo .* not sapo: resume it with algos/grpo.py") as exc:
        parse_args(sapo.Args, sapo.GPU_PROFILE, argv)
    assert "\n" not in str(exc.value)
    record_run(tmp_path, name="mine", exp_name="grpo_lr_sweep")
    with pytest.raises(SystemExit, match="give --exp-name grpo_lr_sweep"):
        resume(tmp_path, name="mine")
    assert resume(tmp_path, "--exp-name", "grpo_lr_sweep", name="mine").exp_name == "grpo_lr_sweep"


def test_a_flag_given_again_with_its_recorded_value_is_fine(tmp_path):
    record_run(tmp_path, kl_coef=0.05)
    assert resume(tmp_path, "--kl-coef", "0.05").kl_coef == 0.05


def test_every_changed_recipe_flag_is_refused_in_one_message(tmp_path):
    run_dir = record_run(tmp_path, kl_coef=0.02, use_seq_mask=True)
    with pytest.raises(SystemExit) as exc:
        resume(tmp_path, "--kl-coef", "0.01", "--learning-rate", "0.001", "--no-seq-mask", "--num-iterations", "50")
    message = str(exc.value)
    assert message.startswith(f"error: --resume continues {run_dir} with the values in its args.json")
    assert "--kl-coef: run 0.02, now 0.01" in message and "--learning-rate: run 0.0001, now 0.001" in message
    assert "--use-seq-mask: run True, now False" in message and "--num-iterations" not in message  # mid-run flag
    assert "--resume-override learning-rate kl-coef use-seq-mask" in message and "\n" not in message


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["--num-iterations", "60"], "num_iterations", 60), (["--eval-every", "3"], "eval_every", 3),
    (["--checkpoint-every", "2"], "checkpoint_every", 2), (["--env-workers", "0"], "env_workers", 0),
    (["--env-step-timeout", "9"], "env_step_timeout", 9.0), (["--torch-threads", "1"], "torch_threads", 1),
    (["--micro-batch-size", "4"], "micro_batch_size", 4)])
def test_flags_that_may_change_mid_run_are_taken(tmp_path, argv, field, value):
    record_run(tmp_path, kl_coef=0.05)
    args = resume(tmp_path, *argv)
    assert flat_args(args)[field] == value and args.kl_coef == 0.05


def test_resume_override_lets_the_named_flags_change(tmp_path):
    record_run(tmp_path, kl_coef=0.05)
    args = resume(tmp_path, "--kl-coef", "0", "--lr", "1e-5", "--resume-override", "kl-coef", "learning_rate")
    assert (args.kl_coef, args.learning_rate) == (0.0, 1e-5)
    with pytest.raises(SystemExit, match="--learning-rate: run 0.0001, now 1e-05"):
        resume(tmp_path, "--kl-coef", "0", "--lr", "1e-5", "--resume-override", "kl_coef")


@pytest.mark.parametrize(("names", "expected"), [
    (["kl_coeff"], "error: --resume-override: no such flag --kl-coeff"),
    (["env_weights"], "the env mixture of a run cannot change")])
def test_resume_override_names_must_be_flags_of_the_recipe(tmp_path, names, expected):
    record_run(tmp_path)
    with pytest.raises(SystemExit, match=expected):
        resume(tmp_path, "--resume-override", *names)


def test_resume_override_without_resume_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="--resume-override applies to --resume: give both"):
        parse_args(grpo.Args, grpo.GPU_PROFILE, ["--resume-override", "kl_coef"])


def test_the_same_mixture_written_another_way_is_the_recorded_one(tmp_path):
    ids = ["ARL/Sokoban-Mini-v0", "ARL/WebShop-v0"]
    record_run(tmp_path, env_id=ids, env_weights=[0.5, 0.5], num_groups=4)
    args = resume(tmp_path, "--env-id", *ids, "--env-weights", "1", "1")
    assert (args.env_id, args.env_weights) == (ids, [0.5, 0.5])
    with pytest.raises(SystemExit, match="its --env-weights are 0.5 0.5"):
        resume(tmp_path, "--env-id", *ids, "--env-weights", "1", "3")


def test_no_run_in_the_folder_names_it_and_the_runs_there(tmp_path):
    record_run(tmp_path, name="grpo-a")
    record_run(tmp_path, name="grpo-b")
    (tmp_path / "notes").mkdir()
    with pytest.raises(SystemExit) as exc:
        resume(tmp_path, name="grpo-c")
    assert str(exc.value) == (f"error: --resume: no run in {tmp_path / 'grpo-c'}; runs in {tmp_path}: grpo-a, grpo-b "
                              f"(pass one as --run-name); or drop --resume to start a new run")
    assert not (tmp_path / "grpo-c").exists()
    with pytest.raises(SystemExit, match=f"{tmp_path / 'none'} holds no run"):
        resume(tmp_path / "none")
    assert run_folders(tmp_path) == ["grpo-a", "grpo-b"]


def test_the_default_run_name_is_the_one_a_new_run_gets(tmp_path):
    record_run(tmp_path, name="ARL_Sokoban-Mini-v0__grpo__3", seed=3, kl_coef=0.05)
    args = parse_args(grpo.Args, grpo.GPU_PROFILE, ["--output-dir", str(tmp_path), "--seed", "3", "--resume"])
    assert args.kl_coef == 0.05


def test_a_finished_run_says_how_to_extend_it(tmp_path):
    run_dir = record_run(tmp_path, finished=True, num_iterations=30)
    with pytest.raises(SystemExit) as exc:
        resume(tmp_path)
    assert str(exc.value) == (f"error: --resume: {run_dir} is finished (30 iterations); to train it further pass a "
                              f"larger --num-iterations with --resume (e.g. --num-iterations 60), or start a new run "
                              f"with another --run-name")
    with pytest.raises(SystemExit, match="is finished"):
        resume(tmp_path, "--num-iterations", "30")
    assert resume(tmp_path, "--num-iterations", "31").num_iterations == 31


def test_an_accepted_change_is_appended_never_written_over(tmp_path):
    run_dir = record_run(tmp_path, kl_coef=0.05, num_iterations=2)
    start = json.loads((run_dir / "args.json").read_text())
    config = {**flat_args(resume(tmp_path, "--num-iterations", "4")), "world_size": 1}
    first = updated_record(run_dir, config, 3)
    assert {k: v for k, v in first.items() if k != "changes"} == start  # the start values stay
    assert first["changes"] == [{"from_iteration": 3, "changed": {"num_iterations": {"run": 2, "now": 4}}}]
    (run_dir / "args.json").write_text(json.dumps(first))
    second = updated_record(run_dir, {**config, "num_iterations": 6, "world_size": 2}, 5)
    assert second["changes"][1] == {"from_iteration": 5, "changed": {"num_iterations": {"run": 4, "now": 6},
                                                                    "world_size": {"run": 1, "now": 2}}}
    assert recorded(second)["num_iterations"] == 6 and second["num_iterations"] == 2
    assert updated_record(run_dir, config, 5) == first  # nothing changed: the record as it was
    assert updated_record(tmp_path / "new", config, 1) == config  # a run without a record


def test_control_flags_are_neither_compared_nor_recorded(tmp_path):
    run_dir = record_run(tmp_path)
    config = {**flat_args(resume(tmp_path, "--resume-fallback")), "world_size": 1}
    assert "changes" not in updated_record(run_dir, config, 2)
    assert {"resume", "overwrite", "output_dir", "run_name", "dry_run"} <= CONTROL and not CONTROL & MID_RUN


def test_given_fields_reads_every_form_of_a_flag():
    argv = ["--kl-coef=0.1", "--loss-agg", "seq-mean-token-mean", "--no-seq-mask", "--collapse-warmup", "2",
            "--eval-every", "1", "--resume", "--env-id", "ARL/Sokoban-v0", "ARL/WebShop-v0"]
    assert given_fields(grpo.Args(), argv) == {"kl_coef", "loss_agg_mode", "use_seq_mask", "collapse_warmup",
                                               "eval_every", "resume", "env_id"}


@pytest.mark.parametrize("argv", [["--lr", "1e-3"], ["--lr=1e-3"]])
def test_lr_is_an_alias_of_learning_rate(argv):
    assert parse_args(grpo.Args, grpo.GPU_PROFILE, argv).learning_rate == 1e-3


def test_the_aliases_name_real_flags_and_stand_for_them():
    args = parse_args(grpo.Args, grpo.GPU_PROFILE, ["--model", "tiny", "--env", "ARL/WebShop-v0"])
    assert (args.model_path, args.env_id) == ("tiny", ["ARL/WebShop-v0"])
    options = {"--" + k.replace("_", "-") for k in flat_args(grpo.Args())}
    assert set(ALIASES.values()) <= options and not set(ALIASES) & options


def test_every_named_field_is_a_flag_of_the_scripts():
    fields = set(flat_args(grpo.Args()))
    assert MID_RUN - {"world_size"} <= fields and CONTROL <= fields  # world_size: the process count, not a flag
