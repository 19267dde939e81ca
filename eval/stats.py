"""Moved to ``arena_train.stats``: the training machinery's verdict uses it, and ``arena_train`` never imports
``eval``. This name stays for code that imported it from here."""

from arena_train.stats import (  # noqa: F401
    Estimate,
    clustered_proportion_ci,
    mean_ci,
    paired_difference_ci,
    pass_at_k,
    pct_ci,
    proportion_ci,
    t_quantile,
)
