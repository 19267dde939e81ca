"""The recipe's shapes on a CPU: one iteration of ``algos/grpo.py --profile gpu`` per env with a small model.

``--profile gpu`` takes each env's turn limit and prompt length (``arena_envs.env_recipe``): ``ARL/WebShop-v0``
15 turns with 4,096-token prompts, ``ARL/ALFWorld-v0`` 50 turns with 2,048; history 2, the 'arlarena' prompt,
512 new tokens per turn, gradient checkpointing. Only the batch is cut to fit a CPU (``--num-groups`` x
``--group-size``, default 2 x 4; one optimizer step on all rows). The model is ``arena_models``' tiny Qwen3 with
its byte-level tokenizer trained on the env's prompts (``benchmarks/gpu_check.py``'s ``build_model``). Bugs that
appear only at these lengths (and not at the mini-arena's 512 tokens / 16 turns) show here.

Per env: wall time of the run (process start to exit) and of the iteration's phases, the child's peak RSS (its own
``ru_maxrss``; baseline: the same process type that only imports the script, ``--help``), response tokens per turn,
update tokens per row (prompt + response), rows, prompts that dropped history pairs
(``rollout/dropped_history``) and prompts cut to the limit (``rollout/truncated_prompts``).

    python benchmarks/bench_recipe_shapes.py [--envs ARL/WebShop-v0 ARL/ALFWorld-v0] [--out runs/recipe_shapes]
    python benchmarks/bench_recipe_shapes.py --envs ARL/WebShop-v0 --history-length 15   # prompts at 4,096
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gpu_check  # the sibling benchmark: this file runs as a script, its folder on the path

ROOT = Path(__file__).resolve().parents[1]




def run_env(env_id: str, out: Path, groups: int, group_size: int, threads: int, timeout: float,
            extra: list[str]) -> dict:
    ctx = gpu_check.Context(gpu_check.Args(out=out, threads=threads), on_gpu=False)
    name = env_id.split("/")[-1] + "".join(f"_{a.lstrip('-')}" for a in extra)
    model = gpu_check.build_model(out / "models" / f"tiny-{env_id.split('/')[-1]}", "tiny", [env_id], on_gpu=False)
    baseline = gpu_check.run_child(ctx, "grpo", ["--help"], out / f"{name}.help.peak.json", timeout)
    flags = ["--profile", "gpu", "--rollout-backend", "hf", "--env-id", env_id, "--model-path", str(model),
             "--output-dir", str(out / "runs"), "--run-name", name, "--overwrite", "--num-iterations", "1",
             "--num-groups", str(groups), "--group-size", str(group_size), "--mini-batch-size", "100000",
             "--eval-every", "0", "--checkpoint-every", "0", "--on-collapse", "off", "--torch-threads", str(threads),
             *extra]
    run = gpu_check.run_child(ctx, "grpo", flags, out / f"{name}.peak.json", timeout)
    metrics = gpu_check.read_metrics(out / "runs" / name)
    args = json.loads((out / "runs" / name / "args.json").read_text()) if metrics else {}
    result = {"env_id": env_id, "returncode": run["returncode"], "wall_s": run["seconds"],
              "peak_rss_gib": run.get("peak_gib"), "baseline_rss_gib": baseline.get("peak_gib")}
    if not metrics:
        return {**result, "error": run["stderr_tail"][-1500:]}
    m = metrics[0]
    update_tokens = m["perf/update_tokens_per_s"] * m["perf/time_update_s"]
    return {**result, "history_length": args["history_length"], "max_turns": args["max_turns"],
            "max_prompt_tokens": args["max_prompt_tokens"],
            "max_response_tokens": args["max_response_tokens"], "rows": m["rollout/num_rows"],
            "episode_length": m["rollout/episode_length"], "response_tokens_per_turn": m["rollout/response_length"],
            "update_tokens_per_row": update_tokens / m["rollout/num_rows"],
            "dropped_history": m["rollout/dropped_history"], "truncated_prompts": m["rollout/truncated_prompts"],
            "time_rollout_s": m["perf/time_rollout_s"], "time_update_s": m["perf/time_update_s"],
            "grad_norm": m["actor/grad_norm"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["ARL/WebShop-v0", "ARL/ALFWorld-v0"])
    parser.add_argument("--out", type=Path, default=Path("runs/recipe_shapes"))
    parser.add_argument("--num-groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--history-length", type=int, help="past turns in the prompt (default: the profile's 2)")
    parser.add_argument("--max-response-tokens", type=int, help="new tokens per turn (default: the profile's 512)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for env_id in args.envs:
        start = time.perf_counter()
        extra = [f"--{k.replace('_', '-')}={v}" for k, v in (("history_length", args.history_length),
                                                             ("max_response_tokens", args.max_response_tokens)) if v]
        results.append(run_env(env_id, args.out, args.num_groups, args.group_size, args.threads, args.timeout_s,
                               extra))
        print(json.dumps(results[-1]), f"({time.perf_counter() - start:.0f} s)", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))  # the last call's envs only
    return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
