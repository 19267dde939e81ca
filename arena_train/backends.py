"""Rollout backends with one interface: ``generate`` token ids, ``push`` trained weights, ``sleep``/``wake``,
``close`` (before the process group ends).

``HFBackend`` generates with the trained model itself (transformers ``generate`` with KV cache), so a push is a
no-op; ``VLLMBackend`` runs a vLLM engine in the trainer's process and receives the weights after every update.
Both stop at the first end-of-turn token of the tokenizer's chat format (``arena_train.chat``: its eos, its
generation config's eos ids, its template's assistant terminator; Gemma's ``<end_of_turn>``, Llama's
``<|eot_id|>``) and keep it in the response, and after every ``generate`` / ``generate_scored`` call hold why each
response stopped in ``last_stop_reasons`` (``eos``: an end-of-turn token; ``max_response_tokens``: the token limit
cut it).

Sampling draws from the process's random stream, or, with ``seeds`` (one int per prompt), each response from a
stream of its own seeded by its prompt's seed: its tokens then depend on its prompt and seed only, never on the
other prompts of the call or its place among them (held-out evaluation: ``arena_train.streams``).

Every backend's ``generate_scored`` also returns the log-prob of each sampled token under the distribution that
drew it (the behaviour policy). ``score_rollouts`` says whether those equal the trainer's own scoring to float
rounding, so that they may replace its scoring pass; otherwise they measure and correct the rollout/trainer gap
(``arena_train.rollout_is``).
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

import torch

from arena_train.chat import format_of, render
from arena_train.kv_cache import cache_name
from arena_train.logprob import token_logprobs
from arena_train.weights import full_parameters

#: Fewer leading columns shared by a whole batch are not worth a separate prefill.
MIN_SHARED_COLUMNS = 8


def logits_warpers(temperature: float, top_k: int, top_p: float) -> list:
    """transformers' sampling warpers in ``generate``'s order (temperature, top-k, top-p), each only when active."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers: list = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))
    return warpers


def sample_categorical(probs: torch.Tensor, generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (B, V) drawn with probability ``probs[b, v] / probs[b].sum()``: inverse-CDF
    sampling on the float64 cumulative sums, with one uniform number per row (B,): from torch's global stream, or
    row b's from ``generators[b]`` (B generators on ``probs``' device), so that a row's draw depends on its own
    generator only.

    Row b picks the v with cdf[v - 1] <= u < cdf[v], u uniform on [0, cdf[-1]) (a float64 uniform below 1 times
    a positive double stays below it): an index of probability 0 has cdf[v - 1] == cdf[v] and is never picked."""
    cdf = probs.double().cumsum(-1)  # (B, V)
    if generators is None:
        u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device)  # (B, 1)
    else:
        u = torch.cat([torch.rand(1, dtype=torch.float64, device=probs.device, generator=g)
                       for g in generators])[:, None]  # (B, 1)
    return (cdf <= u * cdf[:, -1:]).sum(-1)  # (B,)


class HFBackend:
    """Batched transformers ``generate`` with KV cache on the trained model itself (no push needed).

    ``top_k`` applies to sampled generation only (0 = off; a ``generate`` call may override it); a tokenizer
    without a pad token pads with its end token. ``share_prompts``: identical prompts of a batch (the G episodes of
    a group on their first turn, every row of single-turn GRPO) are prefilled once and their KV cache copied,
    instead of G times; so are the leading columns common to the whole batch (``_shared_prefill``).
    ``score_rollouts`` says that ``generate_scored``'s log-probs may stand in for the policy's scoring pass: set
    it only when ``model`` is the trained policy itself in float32 without autocast, where the decoding pass and a
    full forward agree to float rounding (in bf16 they differ by ~1e-2)."""

    def __init__(self, model, tokenizer, batch_size: int = 256, top_k: int = 0, share_prompts: bool = True,
                 score_rollouts: bool = False):
        self.model, self.tokenizer, self.batch_size, self.top_k = model, tokenizer, batch_size, top_k
        self.share_prompts, self.score_rollouts = share_prompts, score_rollouts
        self.last_stop_reasons: list[str] = []  # per response of the last call: "eos" or "max_response_tokens"

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 greedy: bool, top_k: int | None = None, seeds: list[int] | None = None) -> list[list[int]]:
        """New token ids per prompt (left-padded batches of ``batch_size``), cut after the first end token;
        ``top_k=None`` uses the backend's. ``seeds``: sampled prompt i draws from a ``torch.Generator`` seeded
        with ``seeds[i]`` (greedy ignores them)."""
        return self._generate(prompts, max_new_tokens, temperature, top_p, greedy, top_k, False, seeds)[0]

    def generate_scored(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                        top_k: int | None = None, seeds: list[int] | None = None
                        ) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
        """Sampled ``generate`` with, per new token, its log-prob and the entropy of its distribution at
        ``temperature`` (before top-k / top-p, as ``arena_train.batching.sequence_logprobs`` scores them)."""
        return self._generate(prompts, max_new_tokens, temperature, top_p, False, top_k, True, seeds)

    @torch.inference_mode()  # no autograd bookkeeping at all: ~7-15 % less per decoding step, the same tokens
    def _generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                  greedy: bool, top_k: int | None, scored: bool, seeds: list[int] | None = None
                  ) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
        tok, device = self.tokenizer, next(self.model.parameters()).device
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"need one seed per prompt, got {len(seeds)} seeds for {len(prompts)} prompts")
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        end_ids = format_of(tok).end_ids
        warpers = [] if greedy else logits_warpers(temperature, self.top_k if top_k is None else top_k, top_p)
        was_training = self.model.training
        self.model.eval()
        outputs: list[list[int]] = []
        logps: list[list[float]] = []
        entropies: list[list[float]] = []
        reasons: list[str] = []
        for i in range(0, len(prompts), self.batch_size):
            chunk = prompts[i:i + self.batch_size]
            L = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
            attn = torch.zeros((len(chunk), L), dtype=torch.long)
            for b, p in enumerate(chunk):
                ids[b, L - len(p):], attn[b, L - len(p):] = torch.tensor(p), 1
            ids, attn = ids.to(device), attn.to(device)
            cache = self._shared_prefill(chunk, ids, attn, device) if self.share_prompts else None
            generators = None if seeds is None or greedy else [
                torch.Generator(device).manual_seed(int(s)) for s in seeds[i:i + self.batch_size]]
            gen, logp, entropy = self._decode(ids, attn, cache, max_new_tokens, greedy, warpers,
                                              torch.tensor(end_ids, device=device), pad_id,
                                              temperature if scored else None, generators)
            for b, seq in enumerate(gen.tolist()):
                end = next((k + 1 for k, t in enumerate(seq) if t in end_ids), None)  # just after the first
                n = len(seq) if end is None else end
                outputs.append(seq[:n])
                reasons.append("max_response_tokens" if end is None else "eos")
                if scored:
                    logps.append(logp[b, :n].tolist())
                    entropies.append(entropy[b, :n].tolist())
        self.model.train(was_training)
        self.last_stop_reasons = reasons
        return outputs, logps, entropies

    def _decode(self, ids: torch.Tensor, attn: torch.Tensor, cache, max_new_tokens: int, greedy: bool,
                warpers: list, end_ids: torch.Tensor, pad_id: int, score_temperature: float | None,
                generators: list[torch.Generator] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(B, N <= max_new_tokens) new tokens of the left-padded batch ``ids`` / ``attn`` (B, L), pad after a row's
        end token, stopping once every row has ended; ``cache`` holds the KV of all but the last prompt column.
        Greedy takes the argmax; otherwise every step samples, from the softmax of the logits after ``warpers``
        (none at temperature 1 without top-k / top-p: the model's own distribution), with one uniform number per row
        and step from torch's global stream or from row b's ``generators[b]``.
        With ``score_temperature``, also the (B, N) log-probs of the new tokens and entropies at that temperature.

        The loop of ``generate(do_sample=...)`` without its per-step machinery (kwargs preparation, stopping
        criteria, the logits-processor list): the same model calls (positions = cumsum of the mask - 1, as
        ``generate`` sets them), transformers' own warpers, and inverse-CDF sampling (``sample_categorical``) in
        place of ``torch.multinomial``, whose per-row set-up dominated a decoding step of a small model."""
        positions = (attn.cumsum(-1) - 1).masked_fill(attn == 0, 1)
        start = 0 if cache is None else ids.shape[1] - 1
        kv = cache_name()
        out = self.model(input_ids=ids[:, start:], attention_mask=attn, position_ids=positions[:, start:],
                         use_cache=True, logits_to_keep=1, **{kv: cache})
        last = positions[:, -1]
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        new: list[torch.Tensor] = []
        scores: list[tuple[torch.Tensor, torch.Tensor]] = []
        for step in range(max_new_tokens):
            logits = out.logits[:, -1].float()  # (B, V)
            if greedy:
                token = logits.argmax(-1)
            else:
                warped = logits
                for warp in warpers:
                    warped = warp(None, warped)
                token = sample_categorical(warped.softmax(-1), generators)
            token = token.masked_fill(done, pad_id)
            new.append(token)
            if score_temperature is not None:
                scores.append(token_logprobs(logits, token, score_temperature))
            done |= torch.isin(token, end_ids)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            last = last + 1
            out = self.model(input_ids=token[:, None], attention_mask=attn, position_ids=last[:, None],
                             use_cache=True, **{kv: getattr(out, kv)})
        if score_temperature is None:
            return torch.stack(new, dim=1), None, None
        return (torch.stack(new, dim=1), torch.stack([lp for lp, _ in scores], dim=1),
                torch.stack([h for _, h in scores], dim=1))

    def _shared_prefill(self, chunk: list[list[int]], ids: torch.Tensor, attn: torch.Tensor, device):
        """The KV cache of all but the last column of the left-padded batch, so that decoding runs only the last
        prompt column and the new tokens; None when nothing is shared. The cache is computed once per
        distinct prompt, and the leading columns that every distinct prompt has in common (the instructions of
        later turns, when the prompts have one length) once for the whole batch; then indexed out to the rows.
        Positions follow ``generate``'s rule (cumsum of the mask - 1)."""
        slots: dict[tuple[int, ...], int] = {}
        row_slot = [slots.setdefault(tuple(p), len(slots)) for p in chunk]
        first = [row_slot.index(k) for k in range(len(slots))]  # one row per distinct prompt
        u_ids, u_attn = ids[first, :-1].to(device), attn[first, :-1].to(device)
        differs = (u_ids != u_ids[:1]).any(0) | (u_attn != u_attn[:1]).any(0)  # columns
        common = int(differs.long().argmax()) if bool(differs.any()) else u_ids.shape[1]
        if common < MIN_SHARED_COLUMNS:
            common = 0
        if (len(slots) == len(chunk) and not common) or u_ids.shape[1] < 1:
            return None
        positions = (u_attn.cumsum(-1) - 1).masked_fill(u_attn == 0, 1)
        kv, cache = cache_name(), None
        if common:
            cache = getattr(self.model(input_ids=u_ids[:1, :common], attention_mask=u_attn[:1, :common],
                                       position_ids=positions[:1, :common], use_cache=True, logits_to_keep=1), kv)
            cache.reorder_cache(torch.zeros(len(first), dtype=torch.long, device=device))
        if common < u_ids.shape[1]:
            cache = getattr(self.model(input_ids=u_ids[:, common:], attention_mask=u_attn,
                                       position_ids=positions[:, common:], use_cache=True, logits_to_keep=1,
                                       **{kv: cache}), kv)
        cache.reorder_cache(torch.tensor(row_slot, device=device))
        return cache

    def push(self, model) -> dict[str, float]:
        return {}

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass


class VLLMBackend:
    """vLLM engine in the trainer's process; trained weights are pushed after every update.

    ``seed`` seeds the engine's sampling (give each process its own); ``max_model_len`` = prompt + response
    tokens; ``max_num_seqs`` = the most sequences of one generate call (sizes the CPU KV cache);
    ``mixed_precision`` is the trainer's ('no', 'bf16', 'fp16'); ``precision`` 'bf16' runs the engine in
    bfloat16 whatever the trainer's; ``external_launcher`` gives one engine per process under ``accelerate launch``.
    """

    score_rollouts = False  # another engine: its log-probs measure the gap, never replace the trainer's

    def __init__(self, model_path: str, tokenizer, *, seed: int, max_model_len: int, max_num_seqs: int,
                 mixed_precision: str = "no", gpu_memory_utilization: float = 0.35, external_launcher: bool = False,
                 precision: str = "trainer"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: weights pass as tensors
        from transformers import AutoConfig
        from vllm import LLM

        self.tokenizer, self.on_gpu = tokenizer, torch.cuda.is_available()
        self.last_stop_reasons: list[str] = []  # per response of the last call: "eos" or "max_response_tokens"
        kwargs: dict[str, Any] = dict(model=model_path, seed=seed, enable_prefix_caching=True,
                                      max_model_len=max_model_len, logprobs_mode="processed_logprobs")
        if external_launcher:
            kwargs["distributed_executor_backend"] = "external_launcher"  # one engine per rank
        if self.on_gpu:  # the trainer's precision ('auto' would downcast a float32 checkpoint)
            dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(mixed_precision, "float32")
            kwargs.update(dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        else:
            # vLLM's CPU defaults run a float32 checkpoint in bf16 (log-prob gaps ~1e-2) and reserve ~90% of the
            # RAM for the KV cache: compute in float32 and size the cache for every sequence of one turn at full
            # length (VLLM_CPU_KVCACHE_SPACE, in GiB, overrides the size).
            cfg = AutoConfig.from_pretrained(model_path).get_text_config()
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
            kv_bytes = 2 * cfg.num_hidden_layers * kv_heads * head_dim * 4 * max(max_num_seqs, 1) * max_model_len
            kwargs.update(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=kv_bytes)  # K and V, float32
        if precision == "bf16":
            kwargs["dtype"] = "bfloat16"
        self.llm = LLM(**kwargs)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 greedy: bool, top_k: int | None = None, seeds: list[int] | None = None) -> list[list[int]]:
        """``top_k``: sampled generation only; None or 0 = off (vLLM's -1). ``seeds``: sampled prompt i draws from
        vLLM's per-request generator seeded with ``seeds[i]`` (``SamplingParams.seed``; greedy ignores them)."""
        from vllm.inputs import TokensPrompt

        params = self._params(len(prompts), None if greedy else seeds, max_tokens=max_new_tokens,
                              temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                              top_k=top_k if top_k and not greedy else -1)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        self.last_stop_reasons = [_vllm_stop_reason(o) for o in outs]
        return [list(o.outputs[0].token_ids) for o in outs]

    def generate_scored(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                        top_k: int | None = None, seeds: list[int] | None = None
                        ) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
        """Sampled ``generate`` with each new token's log-prob as the engine drew it (``processed_logprobs``:
        after temperature, top-k and top-p). vLLM returns no entropies: 0 (they are used only where a backend's
        log-probs stand in for the trainer's, which a vLLM engine's never do)."""
        from vllm.inputs import TokensPrompt

        params = self._params(len(prompts), seeds, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              top_k=top_k or -1, logprobs=0)  # 0: the sampled token's log-prob only
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        self.last_stop_reasons = [_vllm_stop_reason(o) for o in outs]
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        logps = [[step[t].logprob for t, step in zip(ids, o.outputs[0].logprobs)] for ids, o in zip(tokens, outs)]
        return tokens, logps, [[0.0] * len(ids) for ids in tokens]

    def _params(self, n: int, seeds: list[int] | None, **kwargs):
        """One ``SamplingParams`` for the ``n`` prompts, or one per prompt carrying its seed.

        Stop at the chat format's end-of-turn ids, as HFBackend: ``ignore_eos`` leaves out vLLM's own reading of
        the checkpoint's eos so that both backends stop at the same set (``arena_train.chat.format_of``, which
        holds the generation config's ids once the run configured it). The stop token stays in the response."""
        from vllm import SamplingParams

        kwargs.update(n=1, stop_token_ids=list(format_of(self.tokenizer).end_ids), ignore_eos=True)
        if seeds is None:
            return SamplingParams(**kwargs)
        if len(seeds) != n:
            raise ValueError(f"need one seed per prompt, got {len(seeds)} seeds for {n} prompts")
        return [SamplingParams(**kwargs, seed=int(s)) for s in seeds]

    def push(self, model) -> dict[str, float]:
        """Load the trained weights (``lm_head.weight`` included: tied embeddings are otherwise
        silently skipped), drop cached prefixes computed with old weights, and check a probe.

        The weights stream in from ``arena_train.weights.full_parameters``: one parameter gathered at a time
        from FSDP2/ZeRO-3 shards (every process pushes into its own engine, in the same order), LoRA merged.
        vLLM buffers them only until its layer (fused q/k/v, gate/up) is complete, so a process holds at most
        one layer's full weights besides its engine, never a full state dict. Call it on every process: the
        gathers, the probe's sharded forward and the probe's maximum over the processes are collectives."""
        start = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": full_parameters(model)})
        self.llm.reset_prefix_cache()
        seconds = time.perf_counter() - start
        return {"rollout/push_time_s": seconds, "rollout/push_logp_diff": _max_over_processes(self._probe(model))}

    @torch.no_grad()
    def _probe(self, model) -> float:
        """|log-prob difference| of this process's engine's greedy next token against the trained model."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        text = render(self.tokenizer, [[{"role": "user", "content": "probe"}]])[0]
        prompt = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt))],
                                SamplingParams(max_tokens=1, temperature=0.0, logprobs=1), use_tqdm=False)[0]
        token = out.outputs[0].token_ids[0]
        vllm_logp = out.outputs[0].logprobs[0][token].logprob
        device = next(model.parameters()).device
        logits = model(input_ids=torch.tensor([list(prompt)], device=device)).logits[0, -1].float()
        return abs(float(torch.log_softmax(logits, -1)[token]) - vllm_logp)

    def sleep(self) -> None:
        if self.on_gpu:
            self.llm.sleep(level=1)  # frees the KV cache during the update

    def wake(self) -> None:
        if self.on_gpu:
            self.llm.wake_up()

    def close(self) -> None:
        """Shut the engine down. Under ``accelerate launch`` call it after the last collective and before
        ``accelerator.end_training()``: vLLM's teardown ends the process group it shares with the trainer,
        and at interpreter exit, after ``end_training``, it would fail on groups already destroyed."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None


def _vllm_stop_reason(output) -> str:
    """vLLM's ``finish_reason`` as a stop reason: 'length' is the token limit, 'stop' the end token."""
    return "max_response_tokens" if output.outputs[0].finish_reason == "length" else "eos"


def _max_over_processes(value: float) -> float:
    """``value``'s maximum over the processes of a distributed run (the value itself in a single process)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def vllm_available() -> bool:
    """Whether ``vllm`` imports (a broken install counts as absent)."""
    try:
        importlib.import_module("vllm")
    except Exception:
        return False
    return True


def rollout_backend_name(requested: str) -> str:
    """'auto' -> 'vllm' on a GPU where vLLM imports, else 'hf'; 'hf' and 'vllm' stay as they are."""
    if requested == "auto":
        return "vllm" if torch.cuda.is_available() and vllm_available() else "hf"
    return requested
