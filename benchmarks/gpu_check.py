"""One command that turns a GPU into figures: does the recipe run, how fast, how much memory.

    python benchmarks/gpu_check.py --out DIR --budget-s 480     # one GPU (docs/benchmarks.md, "GPU check")
    python benchmarks/gpu_check.py --out DIR --smoke            # CPU: tiny model, the same stages, < 1 minute

Stages run in order of value, each with its own share of ``--budget-s`` (time a stage leaves unused passes on to
the next); ``DIR/report.json`` and ``DIR/report.md`` are rewritten after every stage, so a run cut short keeps what
it measured. A stage that fails is recorded with its error and the next one still runs.

1. ``machine``: GPU name, memory, driver; torch / CUDA / transformers / accelerate versions; the TFLOP/s of a bf16
   8192^3 matmul (the MFU denominator, measured in this run; CPU: float32 1024^3).
2. ``train``: ``algos/grpo.py`` and ``algos/sampo.py`` with ``--profile gpu --rollout-backend hf --mixed-precision
   bf16`` on ``ARL/Sokoban-v0`` and ``ARL/WebShop-v0``, on a random-initialised Qwen3-0.6B built from its published
   config (no download), groups reduced to 4 x 8 and turns / response tokens cut to fit the budget. Checks: the run
   ends, loss and grad norm are finite, a checkpoint is written, ``--resume`` continues with the next iteration;
   and a group of the trained policy's sampled responses to one prompt holds distinct responses.
3. ``perf`` (from stage 2's metrics, no time of its own): per iteration rollout and update tokens/s, the time
   shares of generation + env / scoring / update, the child's peak GPU memory (``torch.cuda.max_memory_allocated``;
   CPU: peak RSS) against the ``--dry-run`` plan of the same resolved flags, and the update's MFU:
   ``6 * P * update tokens/s`` over the measured matmul rate (P = parameters, the tied LM head counted once;
   attention-score FLOPs and gradient checkpointing's recomputation left out, so it is a lower bound).
4. ``mismatch``: ``--rollout-precision bf16 --rollout-is tis``: ``rollout_is/*`` logged and finite.
5. ``larger``: stage 2's first run on Qwen3-1.7B, when its share of the budget is left.

Random weights answer with tokens the small offline tokenizer does not have (they decode to nothing): every
action is invalid and every response runs to the token cap, the slowest case for the rollout; scores are all
equal, so advantages are 0 and the update's gradient comes from the KL and entropy terms only. Training signal is
not what this checks: it checks that the recipe runs on the hardware and what it costs there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import resource
import runpy
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"
#: The peak-memory wrapper: ``gpu_check.py --child PEAK_JSON SCRIPT ARGS...`` runs SCRIPT as ``__main__``.
CHILD_FLAG = "--child"
#: Metrics whose values must be finite in every iteration of a training run.
FINITE_KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/kl_ref", "actor/entropy")


@dataclass
class Args:
    """Runs the GPU check's stages within a time budget and writes DIR/report.json and DIR/report.md."""

    out: Path = Path("gpu_check")
    """folder of the report, the models and the runs (created)"""
    budget_s: float = 480.0
    """wall-clock budget of all stages together, seconds"""
    smoke: bool = False
    """CPU: a tiny model on ARL/Sokoban-Mini-v0, one iteration per run (the default test suite runs this)"""
    envs: list[str] = field(default_factory=lambda: ["ARL/Sokoban-v0", "ARL/WebShop-v0"])
    """envs of the training stage (--smoke: ARL/Sokoban-Mini-v0)"""
    scripts: list[str] = field(default_factory=lambda: ["grpo", "sampo"])
    """method scripts of the training stage (algos/<name>.py)"""
    num_groups: int = 4
    """groups per iteration (the recipe's 16, reduced to fit)"""
    group_size: int = 8
    """episodes per group"""
    max_turns: int = 3
    """turn budget per episode (the recipe's 15 / 50 cut to fit the budget)"""
    max_response_tokens: int = 128
    """new tokens per turn (the recipe's 512 cut to fit the budget; random weights always reach the cap)"""
    iterations: int = 2
    """iterations of each run before the --resume run adds one (--smoke: 1)"""
    larger_model: str = "Qwen3-1.7B"
    """stage 5's model (a Qwen3 size of arena_train.memory.QWEN3_SHAPES); '' skips the stage"""
    threads: int = 0
    """CPU threads of each child (0 = its default)"""


#: Share of the budget per stage (perf has none: it reads the training stage's metrics).
SHARES = {"machine": 0.05, "train": 0.65, "perf": 0.0, "mismatch": 0.15, "larger": 0.15}


# ------------------------------------------------------------------------------------------------ stage 1
def matmul_tflops(device: str, n: int, dtype, repeats: int = 10) -> float:
    """Dense matmul rate of ``n^3`` products in ``dtype`` on ``device`` (2 n^3 FLOPs each), after a warm-up."""
    import torch

    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(2):
        a @ b
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def stage_machine(ctx: Context) -> dict:
    import accelerate
    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "accelerate": accelerate.__version__,
            "cpu": cpu_name(), "cpu_count": os.cpu_count()}
    if ctx.on_gpu:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 2), driver=nvidia_driver(),
                    gpus=torch.cuda.device_count(), matmul="bf16 8192^3",
                    matmul_tflops=round(matmul_tflops("cuda", 8192, torch.bfloat16), 1))
    else:
        info.update(gpu=None, matmul="float32 1024^3 (no GPU)",
                    matmul_tflops=round(matmul_tflops("cpu", 1024, torch.float32, repeats=3), 4))
    ctx.peak_tflops = info["matmul_tflops"]
    return info


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


# ------------------------------------------------------------------------------------------------ models
def env_prompts(env_ids: list[str], seeds: int = 4) -> list[str]:
    """Texts of the first prompts of ``env_ids`` (the recipe's 'arlarena' layout): the tokenizer's corpus."""
    import wrappers

    texts = []
    for env_id in env_ids:
        env = wrappers.make_env(env_id, history_length=2, prompt_style="arlarena")
        for seed in range(seeds):
            _, info = env.reset(seed=seed)
            texts += [m["content"] for m in info["messages"]]
        env.close()
    return texts


def build_model(out: Path, name: str, env_ids: list[str], on_gpu: bool) -> Path:
    """A Hugging Face folder: the Qwen3 size ``name`` (``arena_train.memory.QWEN3_SHAPES``, the published
    config's sizes) with random weights in bfloat16 (float32 on CPU), and ``arena_models``' offline byte-level BPE
    tokenizer trained on the envs' prompts. The vocabulary stays Qwen3's 151,936 rows, so the LM head, the
    log-softmax and the memory are those of the real model; ids beyond the tokenizer's decode to nothing.
    ``name`` 'tiny' is ``arena_models``' xs model instead."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    from arena_models import build_tiny_model, train_tokenizer
    from arena_train.memory import QWEN3_SHAPES

    if (out / "config.json").exists():
        return out
    corpus = env_prompts(env_ids)
    if name == "tiny":
        return build_tiny_model(out, corpus=corpus)
    tokenizer = train_tokenizer(corpus, vocab_size=8192)
    config = Qwen3Config(**QWEN3_SHAPES[name], max_position_embeddings=40960, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if on_gpu else torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    if on_gpu:
        torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------------------------------------ runs
@dataclass
class Context:
    args: Args
    on_gpu: bool
    peak_tflops: float = float("nan")
    models: dict[str, Path] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        return "tiny" if self.args.smoke else "Qwen3-0.6B"

    def model(self, name: str | None = None) -> Path:
        name = name or self.model_name
        if name not in self.models:
            self.models[name] = build_model(self.args.out / "models" / name, name, self.args.envs, self.on_gpu)
        return self.models[name]


def script_flags(ctx: Context, script: str, env_id: str, model: Path, run_name: str, iterations: int,
                 extra: tuple[str, ...] = ()) -> list[str]:
    a = ctx.args
    flags = ["--profile", "gpu", "--rollout-backend", "hf", "--mixed-precision", "bf16", "--env-id", env_id,
             "--model-path", str(model), "--output-dir", str(a.out / "runs"), "--run-name", run_name,
             "--num-iterations", str(iterations), "--num-groups", str(a.num_groups), "--group-size", str(a.group_size),
             "--max-turns", str(a.max_turns), "--max-response-tokens", str(a.max_response_tokens),
             "--mini-batch-size", str(a.num_groups * a.group_size), "--checkpoint-every", "0", "--eval-every", "0",
             "--eval-episodes", str(a.num_groups), "--on-collapse", "off", "--torch-threads", str(a.threads)]
    if script == "sampo":
        flags += ["--max-num-gen-batches", "1"]  # one rollout batch per iteration: the same work as grpo's
    return flags + list(extra)


def run_child(ctx: Context, script: str, flags: list[str], peak_file: Path, timeout: float) -> dict:
    """``algos/<script>.py flags`` in a child process (through ``--child``, which records its peak memory);
    -> returncode, seconds, the tail of stderr, the peak."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if not ctx.on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, str(Path(__file__).resolve()), CHILD_FLAG, str(peak_file), str(ALGOS / f"{script}.py"),
           *flags]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(timeout, 1.0))
        code, tail = proc.returncode, proc.stderr[-2500:]
    except subprocess.TimeoutExpired as exc:
        code, tail = "timeout", (exc.stderr or b"")[-2500:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
    peak = json.loads(peak_file.read_text()) if peak_file.exists() else {}
    return {"returncode": code, "seconds": round(time.perf_counter() - start, 1), "stderr_tail": tail, **peak}


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def check_run(ctx: Context, script: str, env_id: str, timeout: float, model_name: str | None = None,
              extra: tuple[str, ...] = (), resume: bool = True) -> dict:
    """One training run, then (``resume``) its ``--resume`` run with one more iteration; the checks of stage 2."""
    from arena_train.checkpoint import latest_checkpoint

    model = ctx.model(model_name)
    n = 1 if ctx.args.smoke else ctx.args.iterations
    name = f"{script}-{env_id.split('/')[-1]}-{model.name}{'-' + extra[1] if extra else ''}"
    run_dir = ctx.args.out / "runs" / name
    start = time.monotonic()
    flags = script_flags(ctx, script, env_id, model, name, n, extra) + ["--overwrite"]
    record = {"run": name, "script": script, "env_id": env_id, "model": model.name, "flags": flags,
              "first": run_child(ctx, script, flags, ctx.args.out / f"{name}.peak.json", timeout)}
    ctx.runs.append(record)
    if record["first"]["returncode"] != 0:
        raise RuntimeError(f"{name}: exit {record['first']['returncode']}: {record['first']['stderr_tail'][-800:]}")
    metrics = read_metrics(run_dir)
    found = latest_checkpoint(run_dir)
    checks = {"iterations": [m["iteration"] for m in metrics] == list(range(1, n + 1)),
              "finite_loss_and_grad_norm": all(math.isfinite(m.get(k, math.nan)) for m in metrics for k in FINITE_KEYS),
              "checkpoint_written": found is not None and found[1] == n}
    if resume:
        flags = script_flags(ctx, script, env_id, model, name, n + 1, extra) + ["--resume"]
        record["resume"] = run_child(ctx, script, flags, ctx.args.out / f"{name}.resume.peak.json",
                                     timeout - (time.monotonic() - start))
        after = read_metrics(run_dir)
        checks["resume_continues"] = (record["resume"]["returncode"] == 0
                                      and [m["iteration"] for m in after] == list(range(1, n + 2)))
        metrics = after
    record.update(metrics=metrics, checks=checks, plan_gib=planned_gib(run_dir))
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # GBs each at 0.6B: the disk would fill up
    if not all(checks.values()):
        failed = [k for k, ok in checks.items() if not ok]
        tail = record.get("resume", {}).get("stderr_tail", "")[-800:] if failed == ["resume_continues"] else ""
        raise RuntimeError(f"{name}: failed checks {failed} {tail}")
    return record


def planned_gib(run_dir: Path) -> float | None:
    """The ``--dry-run`` plan's total for the run's resolved flags (``args.json``): the same call as the
    scripts' ``--dry-run``, its printed table kept out of the way."""
    import contextlib
    import io
    import re

    from arena_train.memory import print_run_plan

    path = run_dir / "args.json"
    if not path.exists():
        return None
    a = json.loads(path.read_text())
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_run_plan(a["model_path"], micro_batch_size=a["micro_batch_size"], lora_rank=a["lora_rank"],
                       max_prompt_tokens=a["max_prompt_tokens"], max_response_tokens=a["max_response_tokens"],
                       gradient_checkpointing=a["gradient_checkpointing"], rollout_backend=a["rollout_backend"],
                       vllm_share=a["vllm_gpu_memory_utilization"], mixed_precision=a["mixed_precision"])
    found = re.search(r"^total\s+([\d.]+) GiB", text.getvalue(), re.M)
    return float(found.group(1)) if found else None


def distinct_group(ctx: Context, record: dict) -> dict:
    """The trained policy (the run's final model) samples a group of responses to one first prompt of its env
    at the run's temperature through the scripts' transformers backend: how many are distinct."""
    import torch

    import wrappers
    from arena_train.backends import HFBackend
    from arena_train.models import load_model_and_tokenizer
    from arena_train.rollout import encode_prompt

    run_dir = ctx.args.out / "runs" / record["run"]
    a = json.loads((run_dir / "args.json").read_text())
    device = "cuda" if ctx.on_gpu else "cpu"
    model, tokenizer = load_model_and_tokenizer(str(run_dir / "final"), torch.bfloat16 if ctx.on_gpu else torch.float32)
    model.to(device).eval()
    env = wrappers.make_env(record["env_id"], history_length=a["history_length"], prompt_style=a["prompt_style"])
    _, info = env.reset(seed=a["seed"])
    env.close()
    prompt = encode_prompt(tokenizer, info["messages"], a["max_prompt_tokens"])[0]
    torch.manual_seed(a["seed"])
    group = HFBackend(model, tokenizer).generate([prompt] * a["group_size"], a["max_response_tokens"],
                                                 a["temperature"], a["top_p"], False)
    del model
    if ctx.on_gpu:
        torch.cuda.empty_cache()
    return {"run": record["run"], "group_size": len(group), "distinct": len({tuple(r) for r in group}),
            "prompt_tokens": len(prompt), "mean_response_tokens": sum(map(len, group)) / len(group)}


def stage_train(ctx: Context, budget: float) -> dict:
    envs = ["ARL/Sokoban-Mini-v0"] if ctx.args.smoke else ctx.args.envs
    scripts = ctx.args.scripts
    # every script and every env early ((grpo, Sokoban), (sampo, WebShop)), then the other pairings
    first = [(scripts[k % len(scripts)], envs[k % len(envs)]) for k in range(max(len(scripts), len(envs)))]
    cases = first + [(s, e) for e in envs for s in scripts if (s, e) not in first]
    end = time.monotonic() + budget
    out, errors = {"runs": []}, []
    ctx.model()  # built before the first run's clock starts
    for k, (script, env_id) in enumerate(cases):
        share = (end - time.monotonic()) / (len(cases) - k)  # time a run leaves unused passes to the next
        try:
            record = check_run(ctx, script, env_id, share)
            out["runs"].append({"run": record["run"], "checks": record["checks"],
                                "seconds": [record[k]["seconds"] for k in ("first", "resume") if k in record]})
            if "distinct_responses" not in out:
                out["distinct_responses"] = distinct_group(ctx, record)
            shutil.rmtree(ctx.args.out / "runs" / record["run"] / "final", ignore_errors=True)
        except Exception as exc:  # a run that fails is recorded; the next one still runs
            errors.append(f"{script} {env_id}: {type(exc).__name__}: {exc}")
            out["runs"].append({"run": f"{script} {env_id}", "error": errors[-1]})
    group = out.get("distinct_responses")
    if group and group["distinct"] < 2:
        errors.append(f"the group's {group['group_size']} sampled responses are all the same")
    if errors:
        raise StageError("; ".join(errors), out)
    return out


# ------------------------------------------------------------------------------------------------ stage 3
def iteration_perf(m: dict, params: int, peak_tflops: float) -> dict:
    """Throughput, time shares and MFU of one iteration's metrics (``perf/*``, docs/metrics.md)."""
    rollout, score, update = (m.get(f"perf/time_{k}_s", math.nan) for k in ("rollout", "score", "update"))
    total = rollout + update
    update_tps = m.get("perf/update_tokens_per_s", math.nan)
    return {"iteration": m["iteration"], "rollout_tokens_per_s": m.get("perf/rollout_tokens_per_s"),
            "update_tokens_per_s": update_tps, "time_s": round(total, 2),
            "share_generate_env": round((rollout - score) / total, 3), "share_score": round(score / total, 3),
            "share_update": round(update / total, 3),
            "update_mfu": 6 * params * update_tps / (peak_tflops * 1e12) if peak_tflops > 0 else None}


def model_params(path: Path) -> int:
    from arena_train.memory import named_shape

    return named_shape(str(path)).params


def stage_perf(ctx: Context) -> dict:
    if not ctx.runs:
        raise RuntimeError("no training run to measure")
    rows = []
    for record in ctx.runs:
        params = model_params(ctx.args.out / "models" / record["model"])
        peaks = [r.get("peak_gib") for r in (record.get("first", {}), record.get("resume", {})) if r.get("peak_gib")]
        rows.append({"run": record["run"], "params": params, "peak_gib": max(peaks) if peaks else None,
                     "peak_kind": record["first"].get("peak_kind"), "plan_gib": record.get("plan_gib"),
                     "iterations": [iteration_perf(m, params, ctx.peak_tflops) for m in record.get("metrics", [])]})
    return {"runs": rows}


# ------------------------------------------------------------------------------------------------ stage 4, 5
def stage_mismatch(ctx: Context, budget: float) -> dict:
    env_id = "ARL/Sokoban-Mini-v0" if ctx.args.smoke else ctx.args.envs[0]
    record = check_run(ctx, "grpo", env_id, budget, extra=("--rollout-precision", "bf16", "--rollout-is", "tis"),
                       resume=False)
    stats = [{k: v for k, v in m.items() if k.startswith("rollout_is/")} for m in record["metrics"]]
    if not stats or not all(s and all(math.isfinite(v) for v in s.values()) for s in stats):
        raise StageError("rollout_is/* missing or not finite", {"rollout_is": stats})
    return {"run": record["run"], "rollout_is": stats}


def stage_larger(ctx: Context, budget: float) -> dict:
    if ctx.args.smoke or not ctx.args.larger_model:
        raise Skipped("--smoke" if ctx.args.smoke else "--larger-model ''")
    record = check_run(ctx, ctx.args.scripts[0], ctx.args.envs[0], budget, model_name=ctx.args.larger_model,
                       resume=False)
    return {"run": record["run"], "checks": record["checks"]}


# ------------------------------------------------------------------------------------------------ report
class Skipped(Exception):
    """A stage that does not apply to this run (its message says why)."""


class StageError(RuntimeError):
    """A stage's failure that keeps what the stage measured before it."""

    def __init__(self, message: str, partial: dict):
        super().__init__(message)
        self.partial = partial


def write_report(out: Path, report: dict) -> None:
    """``report.json`` and ``report.md``, each written whole under a temporary name and renamed into place."""
    for name, text in (("report.json", json.dumps(report, indent=1, default=str)), ("report.md", markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def markdown(report: dict) -> str:
    lines = [f"# GPU check ({'smoke, CPU' if report.get('smoke') else 'GPU'})", "",
             f"budget {report.get('budget_s', math.nan):.0f} s, elapsed {report['elapsed_s']:.0f} s", "",
             "| stage | status | seconds | error |", "|---|---|---|---|"]
    for s in report["stages"]:
        error = (s.get("error") or "").replace("|", "/").replace("\n", " ")[:300]
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | {error} |")
    machine = next((s.get("result") for s in report["stages"] if s["name"] == "machine"), None)
    if machine:
        lines += ["", "## Machine", ""] + [f"- {k}: {v}" for k, v in machine.items()]
    perf = next((s.get("result") for s in report["stages"] if s["name"] == "perf" and s.get("result")), None)
    if perf:
        lines += ["", "## Per iteration", "", "| run | it | rollout tok/s | update tok/s | s | gen+env / score / "
                  "update | update MFU | peak / plan GiB |", "|---|---|---|---|---|---|---|---|"]
        for run in perf["runs"]:
            for it in run["iterations"]:
                mfu = it["update_mfu"]
                lines.append(
                    f"| {run['run']} | {it['iteration']} | {fmt(it['rollout_tokens_per_s'])} | "
                    f"{fmt(it['update_tokens_per_s'])} | {fmt(it['time_s'])} | {it['share_generate_env']:.2f} / "
                    f"{it['share_score']:.2f} / {it['share_update']:.2f} | "
                    f"{'–' if mfu is None else f'{100 * mfu:.1f} %'} | {fmt(run['peak_gib'], 2)} "
                    f"({run['peak_kind']}) / {fmt(run['plan_gib'], 2)} |")
    for s in report["stages"]:
        if s["name"] in ("train", "mismatch") and s.get("result"):
            lines += ["", f"## {s['name']}", "", "```", json.dumps(s["result"], indent=1, default=str), "```"]
    return "\n".join(lines) + "\n"


def run_stages(stages: dict, shares: dict[str, float], budget_s: float, out: Path, report: dict) -> int:
    """Runs ``stages`` (name -> callable(seconds) -> result) in order, each given its share of ``budget_s`` plus
    what the stages before it left unused; rewrites the report after each; -> the number of failed stages.

    A stage that raises is recorded with its error (and, for a ``StageError``, what it measured) and the next
    one still runs; ``Skipped`` records why a stage did not apply; once the budget is spent, the remaining
    stages are recorded as skipped. The first stage always runs (it is the cheap description of the machine)."""
    start, carried, failed = time.monotonic(), 0.0, 0
    for k, (name, stage) in enumerate(stages.items()):
        budget = shares[name] * budget_s + carried
        left = budget_s - (time.monotonic() - start)
        began = time.monotonic()
        entry = {"name": name, "budget_s": round(budget, 1)}
        if k and left <= 0:
            entry.update(status="skipped", error="the budget is spent")
        else:
            try:
                entry.update(status="ok", result=stage(min(budget, left)))
            except Skipped as exc:
                entry.update(status="skipped", error=str(exc))
            except Exception as exc:  # recorded with its error; the next stage still runs
                entry.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                             result=getattr(exc, "partial", None), traceback=traceback.format_exc()[-3000:])
                failed += 1
        entry["seconds"] = round(time.monotonic() - began, 1)
        carried = max(budget - entry["seconds"], 0.0)
        report["stages"].append(entry)
        report["elapsed_s"] = round(time.monotonic() - start, 1)
        write_report(out, report)
        print(f"gpu_check: {name}: {entry['status']} ({entry['seconds']:.0f} s)"
              + (f": {entry['error'][:300]}" if entry.get("error") else ""), flush=True)
    return failed


def main(args: Args) -> int:
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    ctx = Context(args, on_gpu=torch.cuda.is_available() and not args.smoke)
    if args.smoke:  # the smallest run of every stage: a check that the code runs, not a measurement
        args.envs, args.num_groups, args.group_size, args.max_turns, args.max_response_tokens = (
            ["ARL/Sokoban-Mini-v0"], 2, 2, 2, 8)
    report = {"smoke": args.smoke, "budget_s": args.budget_s, "elapsed_s": 0.0, "args": dataclasses.asdict(args),
              "stages": []}
    stages = {"machine": lambda b: stage_machine(ctx), "train": lambda b: stage_train(ctx, b),
              "perf": lambda b: stage_perf(ctx), "mismatch": lambda b: stage_mismatch(ctx, b),
              "larger": lambda b: stage_larger(ctx, b)}
    failed = run_stages(stages, SHARES, args.budget_s, args.out, report)
    print(f"gpu_check: report in {args.out / 'report.md'}")
    return 1 if failed else 0


def child(peak_file: str, script: str, argv: list[str]) -> None:
    """Runs ``script`` as ``__main__`` and records its peak memory in ``peak_file`` however it ends."""
    import atexit

    def record() -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak = {"peak_gib": torch.cuda.max_memory_allocated() / 2**30, "peak_kind": "cuda allocated",
                    "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}
        else:
            peak = {"peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "peak_kind": "RSS"}
        Path(peak_file).write_text(json.dumps(peak))

    atexit.register(record)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == CHILD_FLAG:
        child(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        import tyro

        raise SystemExit(main(tyro.cli(Args)))
