"""Machinery shared by the training scripts (``algos/*.py``), ``algos/sft.py``, ``eval/`` and ``benchmarks/``.

The method scripts keep the algorithm (arguments, rollout call, scores, advantages, loss, update, weight push,
logging and checkpoint calls, in order); what is not the algorithm lives here, one submodule per concern, each
with its own tests (``tests/test_arena_train_*.py``). Helpers take explicit parameters, never a script's ``Args``,
so nothing imports a script.

- ``rollout``: ``Row``, ``RolloutConfig``, prompt encoding, task seeds, ``collect_rows`` over a group rollout
- ``batching``: padded batches (shared prompt prefixes once per group), response log-probs, ``score_rows``
  (old-policy and reference log-probs; the first mini-batch's old log-probs come from the update's own forward)
- ``logprob``: token log-probs and entropies in vocabulary chunks
- ``backends``: ``HFBackend`` (transformers ``generate``) and ``VLLMBackend`` (with the weight push)
- ``models``: model/tokenizer loading and the BC checkpoint path
- ``bc``: behaviour-cloning data, loss and validation (``algos/sft.py``, ``eval.mini_arena``)
- ``checkpoint``, ``run_dir``, ``dist``, ``logger``, ``cli``: checkpoint files (whole or absent, verified on resume),
  the run folder (``--resume``/``--overwrite``), cross-process reductions, metrics, arguments and their checks
- ``threads``: the default CPU thread count
- ``sharding``: FSDP2 / ZeRO-3 runs (rollout copy fed from shards, lockstep passes, gathered weights, reference)
- ``memory``: the per-GPU memory plan behind ``--dry-run``
- ``monitor``: the in-run collapse alarm (signals, ``--on-collapse`` warn/stop/rollback, restoring the last healthy
  checkpoint)
- ``rollout_is``: rollout/trainer mismatch statistics and TIS/MIS importance weights
"""
