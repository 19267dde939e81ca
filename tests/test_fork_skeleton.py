"""The loop outside the blocks needs nothing from a method but its blocks: a fork of grpo.py whose method does not
clip (REINFORCE with GRPO's advantage: its clip fields and its ``update.clip`` line deleted) runs as is, on a
mixture, and logs each env's ratios without a clip band (``approx_kl``, no ``ratio_out_frac``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Block 10 of the fork: REINFORCE's loss instead of the clipped surrogate (no clip, no band for the mixture's ratios).
REINFORCE = '''\
                    pg_loss = agg_loss(-batch["advantages"] * logp, mask, args.loss_agg_mode, pg_counts)
                    metrics = {}
'''


def fork() -> str:
    """grpo.py without ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c`` in its ``Args`` and with REINFORCE's
    loss; ``policy_loss`` stays defined (with its own defaults), only no longer called."""
    text = (ROOT / "algos" / "grpo.py").read_text()
    text, fields = re.subn(r"    clip_ratio_(low|high|c): float = .*\n    \"\"\".*\"\"\"\n", "", text)
    text, calls = re.subn(r"                    pg_loss, metrics = policy_loss\((.|\n)*?is_weights=is_weights\)\n"
                          r"                    update\.clip = .*\n", REINFORCE, text)
    assert fields == 3 and calls == 1 and "args.clip_ratio" not in text
    return text


def test_a_fork_without_clip_fields_runs_on_a_mixture(tiny_model, tmp_path):
    script = tmp_path / "reinforce.py"
    script.write_text(fork())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": ""}
    flags = ["--model-path", tiny_model, "--output-dir", str(tmp_path), "--run-name", "r", "--num-iterations", "1",
             "--num-groups", "2", "--group-size", "2", "--max-turns", "2", "--max-response-tokens", "6",
             "--mini-batch-size", "4", "--micro-batch-size", "2", "--eval-every", "0", "--checkpoint-every", "0",
             "--log-episodes", "0", "--env-id", "ARL/Sokoban-Mini-v0", "ARL/Sokoban-v0"]
    proc = subprocess.run([sys.executable, str(script), *flags], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "actor/pg_loss" in logged and "actor/clipfrac_upper" not in logged
    kl = [k for k in logged if k.startswith("env/") and k.endswith("/approx_kl")]
    assert len(kl) == 2 and not [k for k in logged if k.endswith("/ratio_out_frac")]
    shown = subprocess.run([sys.executable, str(script), "--help"], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0 and "--kl-coef" in shown.stdout and "--clip-ratio" not in shown.stdout
