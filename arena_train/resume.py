"""``--resume`` continues the recorded recipe: the run's ``args.json`` is the source of every value.

A flag not given again takes the run's recorded value, not the script's default, so a resumed run is the same
experiment under the same name. A flag given again with another value is refused, in one message listing every
difference, unless it may change mid-run (``MID_RUN``: length, evaluation and checkpoint cadence, env workers and
timeouts, logging, threads, memory knobs that leave the update's math alone) or is named in ``--resume-override``.
An accepted change is appended to ``args.json``'s ``changes`` list (what changed, from which iteration); the
values the run was started with are never written over.

Before any of that: ``--resume`` of a folder without a run is an error naming the folder and the runs that exist
beside it (a typo in ``--run-name`` must not train a new run), and ``--resume`` of a finished run says how to
extend it (a larger ``--num-iterations``). Settings that reach the network (``ASKED``: the env servers) are never
taken from the record: a run folder may come from someone else, and its ``args.json`` must not choose the machines
that play the training; a recorded one not given again is refused, naming it.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, Sequence

from arena_train.flat import flat_args, replace_flat

#: Fields that locate or steer the run itself, not its recipe: always this command line's, never compared or
#: recorded as changes.
CONTROL = frozenset({"output_dir", "run_name", "resume", "resume_fallback", "resume_override", "overwrite", "dry_run"})
#: Fields that may change mid-run without making it another experiment: how long it runs, how often it evaluates
#: and checkpoints, how the envs are stepped and when their failures stop it, logging, threads, and the memory
#: knobs of the update (the one-batch update divides by the mini-batch's counts: same math, other float sums).
MID_RUN = frozenset({
    "num_iterations", "checkpoint_every", "eval_every", "env_workers", "env_servers", "env_step_timeout",
    "max_env_failures", "overlap_turns", "torch_threads", "track", "wandb_project", "log_episodes", "micro_batch_size",
    "micro_batch_tokens", "gradient_checkpointing", "vllm_gpu_memory_utilization", "world_size"})
#: Recipe fields added after runs were recorded, with the value every run recorded before them had: such a run's
#: args.json lacks the field, and it resumes with that value, not with today's default (episode streams became the
#: default after runs had trained without them).
INTRODUCED = {"episode_streams": False, "chat_template": None, "chat_template_kwargs": ""}
#: The env mixture is the run's data: it never changes on resume (``arena_train.mixture.resume_problem``).
MIXTURE = ("env_id", "env_weights")
#: Fields that reach the network: a resumed run takes them from its command line only, never from ``args.json``
#: (whoever wrote the folder would pick the machines that play its training episodes); a recorded value not given
#: again is refused, naming it (``network_problem``).
ASKED = ("env_servers",)
#: What a training script writes into its run folder that makes it a run (``arena_train.run.RUN_ENTRIES``' core).
RUN_MARKERS = ("args.json", "metrics.jsonl", "checkpoints")


def flag(name: str) -> str:
    """The command-line flag of a flat field name (``kl_coef`` -> ``--kl-coef``)."""
    return "--" + name.replace("_", "-")


def _aliases(cls: type) -> dict[str, str]:
    """Option strings declared with ``tyro.conf.arg(aliases=...)`` -> the flat name of their field."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            continue  # a group: flat_args names its fields
        for meta in getattr(hint, "__metadata__", ()):
            for alias in getattr(meta, "aliases", None) or ():
                out[alias] = f.name
    return out


def flag_fields(args: Any) -> dict[str, str]:
    """Every option string of ``args``' command line (``--x``, ``--no-x``, declared aliases) -> its flat field
    name (``flat_args``' keys); groups add no prefix, so a field's flag is its flat name in kebab case."""
    out: dict[str, str] = {}
    for name in flat_args(args):
        out[flag(name)] = name
        out["--no-" + flag(name)[2:]] = name
    for alias, name in _aliases(type(args)).items():
        out[alias] = name
        out["--no-" + alias[2:]] = name
    return out


def given_fields(args: Any, argv: Sequence[str]) -> set[str]:
    """The flat names of the fields given on the command line ``argv`` (``--x v``, ``--x=v``, ``--no-x``)."""
    names = flag_fields(args)
    return {names[token.split("=", 1)[0]] for token in argv if token.split("=", 1)[0] in names}


def recorded(record: dict[str, Any]) -> dict[str, Any]:
    """The values a run holds now: ``args.json``'s start values (``INTRODUCED``'s for fields it predates) with its
    ``changes`` applied in order."""
    values = {**INTRODUCED, **{k: v for k, v in record.items() if k != "changes"}}
    for change in record.get("changes", []):
        values.update({k: diff["now"] for k, diff in change["changed"].items()})
    return values


def _json(value: Any) -> Any:
    """``value`` as ``args.json`` holds it (tuples are lists)."""
    return json.loads(json.dumps(value))


def _shown(value: Any) -> str:
    """A value as it is typed on the command line."""
    if isinstance(value, list):
        return " ".join(map(str, value)) or "(none)"
    return "none" if value is None else str(value)


def changed_values(record: dict[str, Any], config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{field: {"run": recorded value, "now": config's}}`` for every recipe field of ``config`` (flat names)
    whose value differs from what ``record`` (``args.json``) holds now; ``CONTROL`` fields are left out."""
    values = recorded(record)
    out = {}
    for key, now in config.items():
        if key in CONTROL or key not in values:
            continue
        if _json(now) != values[key]:
            out[key] = {"run": values[key], "now": _json(now)}
    return out


def run_folders(output_dir: Path) -> list[str]:
    """The names of the folders of ``output_dir`` that hold a run, sorted."""
    if not output_dir.is_dir():
        return []
    return sorted(p.name for p in output_dir.iterdir() if p.is_dir() and any((p / m).exists() for m in RUN_MARKERS))


def missing_run_problem(run_dir: Path) -> str | None:
    """Why ``--resume`` of ``run_dir`` cannot start (no run there: one line naming the folder and the runs beside
    it), or None."""
    if any((run_dir / m).exists() for m in RUN_MARKERS):
        return None
    found = run_folders(run_dir.parent)
    where = (f"runs in {run_dir.parent}: {', '.join(found[:10])}{' ...' if len(found) > 10 else ''} (pass one as "
             f"--run-name)" if found else f"{run_dir.parent} holds no run")
    return f"error: --resume: no run in {run_dir}; {where}; or drop --resume to start a new run"


def finished_problem(run_dir: Path, values: dict[str, Any], num_iterations: int | None) -> str | None:
    """Why ``--resume`` of a finished run (``summary.json``) would do nothing, with how to extend it; or None
    when ``num_iterations`` (given now) is larger than the run's."""
    if not (run_dir / "summary.json").is_file():
        return None
    done = values.get("num_iterations")
    if not isinstance(done, int) or (num_iterations is not None and num_iterations > done):
        return None
    return (f"error: --resume: {run_dir} is finished ({done} iterations); to train it further pass a larger "
            f"--num-iterations with --resume (e.g. --num-iterations {2 * done}), or start a new run with another "
            f"--run-name")


def override_names(names: Sequence[str], known: set[str]) -> tuple[set[str], str | None]:
    """(flat names, problem) of ``--resume-override``'s values (``kl_coef``, ``kl-coef`` or ``--kl-coef``)."""
    flat = {n.lstrip("-").replace("-", "_") for n in names}
    unknown = sorted(flat - known)
    if unknown:
        return flat, f"error: --resume-override: no such flag {', '.join(map(flag, unknown))}"
    fixed = sorted(flat & set(MIXTURE))
    if fixed:
        return flat, (f"error: --resume-override {' '.join(fixed)}: the env mixture of a run cannot change; start a "
                      f"new run (another --run-name) from its checkpoint")
    return flat, None


def run_name_for(mixture_label: str, exp_name: str, seed: int) -> str:
    """A run's folder name when ``--run-name`` is not given: ``<env>__<exp_name>__<seed>``."""
    return f"{mixture_label}__{exp_name}__{seed}"


def default_run_name(args: Any) -> str:
    """``run_name_for`` the parsed ``args`` of a script."""
    from arena_train.mixture import Mixture

    label = Mixture.parse(args.env_id, getattr(args, "env_weights", None), check_registry=False).label
    return run_name_for(label, args.exp_name, args.seed)


def updated_record(run_dir: Path, config: dict[str, Any], start_iteration: int) -> dict[str, Any]:
    """What ``args.json`` holds once a resumed run starts at ``start_iteration`` with ``config`` (flat values): its
    record as it was, plus a ``changes`` entry for the values that differ (``{"from_iteration": i, "changed":
    {field: {"run": old, "now": new}}}``). A folder without a readable record gets ``config``."""
    try:
        record = json.loads((run_dir / "args.json").read_text())
    except (OSError, ValueError):
        return config
    if not isinstance(record, dict):
        return config
    changed = changed_values(record, config)
    if not changed:
        return record
    return {**record, "changes": [*record.get("changes", []), {"from_iteration": start_iteration, "changed": changed}]}


def script_problem(run_dir: Path, recorded_name: str | None, name: str | None) -> str | None:
    """Why this script may not resume the run in ``run_dir``, or None. ``exp_name`` defaults to the script's file
    name, so a run recorded under another one was trained by another script (or under a given ``--exp-name``):
    continuing it with this script's loss would mix two methods in one run without a trace."""
    if recorded_name is None or name is None or recorded_name == name:
        return None
    return (f"error: {run_dir} was trained as {recorded_name} (exp_name in its args.json), not {name}: resume it "
            f"with algos/{recorded_name}.py, or give --exp-name {recorded_name} if this script trained it under "
            "that name")


def network_problem(run_dir: Path, values: dict[str, Any], given: set[str]) -> str | None:
    """Why ``--resume`` cannot go on without one of the ``ASKED`` flags the run recorded (one line naming the
    recorded value and how to give it, or to play locally), or None."""
    for name in ASKED:
        recorded_value = values.get(name)
        if recorded_value and name not in given:
            shown = _shown(recorded_value)
            return (f"error: --resume: {run_dir} played on {flag(name)} {shown} (its args.json); a resumed run plays "
                    f"only on servers its command line names: give {flag(name)} {shown} to use them, or "
                    f"{flag(name)} alone to play locally")
    return None


def resume_args(args: Any, argv: Sequence[str]) -> Any:
    """``args`` of a ``--resume`` run: the recorded values of the run for every flag not given in ``argv``; a given
    flag that differs from the record is a one-line ``SystemExit`` listing every difference, unless ``MID_RUN`` or
    named in ``--resume-override``."""
    from arena_train.mixture import Mixture, resume_problem

    run_dir = Path(args.run.output_dir) / (args.run.run_name or default_run_name(args))
    problem = missing_run_problem(run_dir)
    if problem is not None:
        raise SystemExit(problem)
    try:
        record = json.loads((run_dir / "args.json").read_text())
    except (OSError, ValueError):
        return args  # nothing recorded (a damaged folder): the checkpoint checks report it
    values, given, fields = recorded(record), given_fields(args, argv), flat_args(args)
    problem = finished_problem(run_dir, values, getattr(args, "num_iterations", None) if "num_iterations" in given
                               else None)
    if problem is None:
        overrides, problem = override_names(args.run.resume_override, set(fields))
    if problem is None:
        problem = network_problem(run_dir, values, given)
    if problem is None and "exp_name" not in given:
        problem = script_problem(run_dir, values.get("exp_name"), getattr(args, "exp_name", None))
    if problem is None and given & set(MIXTURE):  # the same mixture may be written another way (1 1 = 0.5 0.5)
        problem = resume_problem(run_dir, Mixture.parse(args.env_id, getattr(args, "env_weights", None),
                                                        check_registry=False))
    if problem is not None:
        raise SystemExit(problem)
    keep = {k: v for k, v in values.items() if k in fields and k not in CONTROL and k not in ASKED
            and (k in MIXTURE or k not in given)}
    resumed = replace_flat(args, **keep)
    differ = changed_values(record, flat_args(resumed))
    refused = [k for k in differ if k not in MID_RUN and k not in overrides]
    if refused:
        listed = "; ".join(f"{flag(k)}: run {_shown(differ[k]['run'])}, now {_shown(differ[k]['now'])}"
                           for k in refused)
        raise SystemExit(f"error: --resume continues {run_dir} with the values in its args.json, and these differ: "
                         f"{listed}. Drop them to continue the run as it was, or add --resume-override "
                         f"{' '.join(flag(k)[2:] for k in refused)} to change them from the next iteration")
    return resumed
