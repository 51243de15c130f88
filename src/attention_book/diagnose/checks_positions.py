"""Checks of positions: decoding with a key/value cache equals the full forward pass.

A layer that decodes with a :class:`~attention_book.KVCache` (chapter 10) sees
one sequence over several calls. Whatever depends on a token's position, such
as the rotation of RoPE (chapter 12), must then use the token's position in the
whole sequence, ``len(cache) + t``, not its index inside the call: a layer whose
positions restart at 0 at every call computes the first call right and every
later one wrong. So the probe feeds a prefix in one call and the remaining
tokens one at a time, and compares every output with the full forward pass.
"""

from __future__ import annotations

import inspect

import torch

from ..kv_cache import KVCache
from .context import DiagnosisContext
from .numerics import fmt, fmt_tol, max_diff
from .registry import Failed, NotApplicable, register_check
from .subjects import UserError, describe_error, unpack

#: Tokens fed in the first call (into an empty cache); the rest come one at a time.
PREFIX = 2


def _takes_kv_cache(module: torch.nn.Module) -> bool:
    try:
        return "kv_cache" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def _decode(module: torch.nn.Module, x: torch.Tensor, cache: KVCache, start: int,
            stop: int) -> torch.Tensor:
    """The module's output for tokens ``start … stop-1`` of ``x``, fed with ``cache``."""
    try:
        result = module(x[:, start:stop], kv_cache=cache)
    except Exception as error:  # noqa: BLE001 - the user's error becomes evidence
        raise UserError(f"{describe_error(error)} (decoding tokens {start}..{stop - 1} "
                        f"with a KVCache holding {len(cache)})") from None
    return unpack(result)[0]  # (B, stop - start, d_out)


@register_check(
    "cache_positions",
    property="decoding with a KV cache equals the full forward pass, positions included",
    hint=(
        "the new tokens' positions continue after the cached ones: read len(cache) before "
        "the cache grows, rotate the new queries and keys by positions len(cache) ... "
        "len(cache) + T_new - 1, and store the rotated keys in the cache"
    ),
    order=1500,
    needs=("returns_output", "dropout_eval", "softmax_dim", "head_mixing", "scale",
           "causality", "batch", "lengths"),
)
def check_cache_positions(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    if not ctx.is_module:
        raise NotApplicable("a function has no key/value cache")
    if not _takes_kv_cache(s.module):
        raise NotApplicable("forward takes no kv_cache argument")
    num_tokens = s.num_tokens
    x = s.inputs()  # (B, T, d_in)
    full, _ = s.call(x)  # (B, T, d_out)
    cache = KVCache(num_tokens)
    first = _decode(s.module, x, cache, 0, PREFIX)  # (B, PREFIX, d_out)
    later = [_decode(s.module, x, cache, t, t + 1) for t in range(PREFIX, num_tokens)]
    tol = ctx.tol.reference
    plan = f"{PREFIX} tokens into an empty cache, then {num_tokens - PREFIX} one at a time"
    if not s.causal:
        # Without a causal mask only the last token sees the same keys as in the full pass.
        diff = max_diff(later[-1], full[:, -1:])
        if diff > tol:
            raise Failed(
                f"{plan}: the last token, which sees every key, differs from the full "
                f"forward pass by {fmt(diff)}: the cached tokens or the new one sit at "
                "the wrong positions"
            )
        return f"{plan}: the last token equals the full forward pass (within {fmt_tol(tol)})"
    first_diff = max_diff(first, full[:, :PREFIX])
    later_diffs = [max_diff(out, full[:, t : t + 1]) for t, out in enumerate(later, PREFIX)]
    if first_diff > tol:
        raise Failed(
            f"{plan}: even the first call, into an empty cache, differs from the full "
            f"forward pass by {fmt(first_diff)}"
        )
    worst = max(range(len(later_diffs)), key=lambda i: later_diffs[i])
    if later_diffs[worst] > tol:
        token = worst + PREFIX
        raise Failed(
            f"{plan}: the first call matches the full forward pass, but token {token}, "
            f"decoded with {token} tokens in the cache, differs by "
            f"{fmt(later_diffs[worst])}: a later call does not see the cached tokens as the "
            "full pass does (the usual cause: its positions restart at 0 instead of "
            "continuing from len(cache))"
        )
    return f"{plan}: every output equals the full forward pass (within {fmt_tol(tol)})"
