"""Evaluation and analysis: ``evaluate`` (checkpoints vs expert/random baselines),
``stability`` (collapse diagnostics from metrics logs), ``sweep`` (grids over the four
design dimensions) and ``report`` (plots, results tables, HTML/Markdown report).

Submodules are imported on use, so ``import eval.stability`` never loads torch.
"""
