"""A script's ``Args`` as one flat dict and back: the keys ``args.json`` has always had.

The flag groups (``arena_train.cli``) add no prefix, so a field's flat name is its flag in snake case wherever it
lives; ``arena_train.cli`` (parsing, profiles) and ``arena_train.resume`` (the recorded recipe) both work on these
names, and this module is what they share.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from arena_train.monitor import CollapseConfig

T = TypeVar("T")


def flat_args(args: Any) -> dict[str, Any]:
    """``args`` as one flat dict of field names, the groups' fields under their own names and the alarm's under
    their flag names (``collapse_warmup``): the keys ``args.json`` has always had."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, CollapseConfig):
            out.update({CollapseConfig.flag_key(k): v for k, v in dataclasses.asdict(value).items()})
        elif dataclasses.is_dataclass(value):
            out.update(flat_args(value))
        else:
            out[f.name] = value
    return out


def replace_flat(args: T, **values: Any) -> T:
    """A copy of ``args`` with fields set by their flat names (``flat_args``'s keys), in whichever group they are."""
    own = {f.name for f in dataclasses.fields(args)}
    changes = {k: v for k, v in values.items() if k in own}
    for f in dataclasses.fields(args):
        sub = getattr(args, f.name)
        if isinstance(sub, CollapseConfig):
            keys = {CollapseConfig.flag_key(k): k for k in (g.name for g in dataclasses.fields(sub))}
            if picked := {keys[k]: v for k, v in values.items() if k in keys}:
                changes[f.name] = dataclasses.replace(sub, **picked)
        elif dataclasses.is_dataclass(sub) and (inner := set(flat_args(sub)) & set(values)):
            changes[f.name] = replace_flat(sub, **{k: values[k] for k in inner})
    unknown = set(values) - own - set(flat_args(args))
    if unknown:
        raise TypeError(f"unknown fields {sorted(unknown)}")
    return dataclasses.replace(args, **changes)
