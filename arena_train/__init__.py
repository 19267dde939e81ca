"""Machinery shared by the training scripts (``algos/*.py``), ``algos/sft.py``, ``eval/`` and ``benchmarks/``.

The method scripts keep the algorithm and its loop, top to bottom (arguments, rollout call, scores, advantages,
per mini-batch ``zero_grad`` / forward / loss / ``backward`` / clip / ``step``, weight push, metrics, evaluation,
log and alarm, checkpoint); what is not the algorithm lives here, one submodule per whole concern, each with its
own tests (``tests/test_arena_train_*.py``). Helpers take explicit parameters or the shared flag groups of
``cli``, never a script's ``Args``, so nothing imports a script.

- ``cli``: the flag groups every script shares (``RunArgs``, ``EngineArgs``, ``EvalArgs``; the alarm's
  ``monitor.CollapseConfig``), parsing with ``--profile gpu``, value checks, ``flat_args`` (args.json's keys)
- ``run``: a run's life outside the method: set-up, ``--dry-run``, run folder, resume, logger, the alarm's
  stop/rollback, checkpoints, the final save and consistency check; the default thread count
- ``update``: mini- and micro-batch iteration in lockstep, loss denominators, the rollout correction, the
  non-finite skip, and the iteration's metrics in one call
- ``losses``: ``masked_mean``, ``agg_loss`` (the four aggregations), ``kl_penalty`` (k1/k2/k3 and their '+' forms)
- ``advantages``: GiGPO's estimator for scripts that offer it as an option (``dapo.py --advantage gigpo``)
- ``rollout``: ``Row``, ``RolloutConfig``, prompt encoding, task seeds, ``collect_rows`` over a group rollout
- ``batching``: padded batches (shared prompt prefixes once per group), response log-probs, ``score_rows``
  (old-policy and reference log-probs; the first mini-batch's old log-probs come from the update's own forward)
- ``logprob``: token log-probs and entropies in vocabulary chunks
- ``backends``: ``HFBackend`` (transformers ``generate``) and ``VLLMBackend`` (with the weight push)
- ``models``: model/tokenizer loading and the BC checkpoint path
- ``bc``: behaviour-cloning data, loss and validation (``algos/sft.py``, ``eval.mini_arena``)
- ``checkpoint``, ``dist``, ``logger``: checkpoint files (whole or absent, verified on resume), cross-process
  reductions, metrics
- ``sharding``: FSDP2 / ZeRO-3 runs (rollout copy fed from shards, lockstep passes, gathered weights, reference)
- ``memory``: the per-GPU memory plan behind ``--dry-run``
- ``monitor``: the in-run collapse alarm (signals, ``--on-collapse`` warn/stop/rollback, restoring the last healthy
  checkpoint)
- ``rollout_is``: rollout/trainer mismatch statistics and TIS/MIS importance weights
"""
