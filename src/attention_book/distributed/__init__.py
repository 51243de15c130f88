"""Attention over a sequence split across devices, with ``torch.distributed`` (chapter 17).

One device cannot hold the activations of a very long sequence, so context parallelism
splits the sequence: each of ``P`` ranks holds ``T / P`` positions of the queries, keys and
values, ``(B, H, T / P, d)``, and returns its positions of the output. The package holds one
job per module:

- :mod:`~attention_book.distributed.launch`: :func:`run_on_ranks` starts ``P`` processes joined
  by the gloo backend over 127.0.0.1 (timeouts, tracebacks, no process left behind), so all
  of it runs on one laptop; it knows nothing about attention;
- :mod:`~attention_book.distributed.sharding`: which positions each rank holds
  (:func:`shard_positions`, a ``"contiguous"`` block or the ``"zigzag"`` pair of chunks),
  :func:`shard` and :func:`unshard`;
- :mod:`~attention_book.distributed.algorithms`: the three ways of attending across ranks,
  :func:`allgather_kv_attention`, :func:`ring_attention` and :func:`ulysses_attention`, and
  :func:`simulate_ring_attention`, the ring in one process; every one of them is chapter 10's
  partial attention and its merge (:mod:`attention_book.flash`);
- :mod:`~attention_book.distributed.collectives`: the messages they exchange (all-gather,
  all-to-all, one hop around the ring), differentiable;
- :mod:`~attention_book.distributed.traffic`: :func:`count_traffic`, the meters of bytes and
  scores per rank;
- :mod:`~attention_book.distributed.cases`: :func:`run_attention_cases`, many
  :class:`AttentionCase` in one start of the ranks.

Every name a reader uses is importable from here, ``attention_book.distributed``. Functions
meant to run in the ranks live in the package, because each rank process imports the
function it runs by its module and name.

Taught in chapter 17.
"""

from .algorithms import (
    METHODS,
    allgather_kv_attention,
    check_heads,
    ring_attention,
    simulate_ring_attention,
    ulysses_attention,
)
from .cases import AttentionCase, CaseResult, run_attention_cases
from .launch import RankFailed, run_on_ranks
from .sharding import LAYOUTS, shard, shard_positions, shard_runs, unshard
from .traffic import Traffic, count_traffic

__all__ = [
    "LAYOUTS",
    "METHODS",
    "RankFailed",
    "run_on_ranks",
    "shard_positions",
    "shard_runs",
    "shard",
    "unshard",
    "Traffic",
    "count_traffic",
    "check_heads",
    "allgather_kv_attention",
    "ring_attention",
    "ulysses_attention",
    "simulate_ring_attention",
    "AttentionCase",
    "CaseResult",
    "run_attention_cases",
]
