"""The name transformers gives the KV cache in model calls and outputs.

transformers 5 renamed ``past_key_values`` to ``cache``: the old name warns on every forward (and on every read of
``output.past_key_values``) and goes away in 5.40, while transformers 4.x, which the project still supports, knows
only the old one. Model calls pass ``**{cache_name(): cache}`` and read ``getattr(output, cache_name())``.
"""

from __future__ import annotations

import functools


@functools.cache
def cache_name() -> str:
    """'cache' where the installed transformers' model outputs have that field, else 'past_key_values'."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
