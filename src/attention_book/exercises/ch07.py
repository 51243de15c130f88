"""Checkers for chapter 7's exercises (multi-head, cross- and grouped-query attention)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .feedback import (
    ExerciseFailure,
    call,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    hand_over,
    on_cpu,
    passed,
)

__all__ = [
    "check_multi_head_cross_attention",
    "check_load_c_attn",
    "check_mha_to_gqa",
]

_SPLIT_HINT = (
    "Check the head split of the queries and the keys: head h holds the features h * head_dim "
    "to (h + 1) * head_dim - 1 of every token, and the head dimension then moves in front of "
    "the token dimension (section 7.3)."
)


def _call_explained(fn: Callable, *args, prop: str, hints: tuple[tuple[str, str], ...] = ()):
    """Call ``fn``; an error whose message contains a known phrase gets that phrase's hint."""
    try:
        return on_cpu(fn(*args))
    except NotImplementedError:
        return call(fn, *args)  # raises the "You have not written ... yet" feedback
    except ExerciseFailure:
        raise
    except Exception as error:  # noqa: BLE001 - an error in learner code becomes feedback
        for phrase, hint in hints:
            if phrase in str(error):
                fail(prop, expected="no error", actual=f"{type(error).__name__}: {error}",
                     hint=hint)
        return call(fn, *args, prop=prop)  # the generic feedback, with the error message


# --------------------------------------------------------------------------- exercise 7.1


def _torch_projections(reference: nn.MultiheadAttention):
    """The query, key and value weights and biases of ``nn.MultiheadAttention``."""
    if reference.in_proj_weight is not None:  # one (3 * E, E) matrix when kdim == vdim == E
        weights = reference.in_proj_weight.chunk(3)
    else:
        weights = (reference.q_proj_weight, reference.k_proj_weight, reference.v_proj_weight)
    biases = (reference.in_proj_bias.chunk(3) if reference.in_proj_bias is not None
              else (None, None, None))
    return weights, biases


def _cross_weights(queries, keys, num_heads, mask, *, variant="right"):
    """Attention weights (B, num_heads, T_q, T_kv) of projected queries and keys, or a mistake."""
    batch, num_queries, d_out = queries.shape
    num_keys, head_dim = keys.shape[1], d_out // num_heads
    q = queries.view(batch, num_queries, num_heads, head_dim).transpose(1, 2)
    k = keys.view(batch, num_keys, num_heads, head_dim).transpose(1, 2)
    scale = {"right": math.sqrt(head_dim), "d_out": math.sqrt(d_out), "none": 1.0}
    scores = q @ k.transpose(-2, -1) / scale.get(variant, math.sqrt(head_dim))
    allowed = torch.ones(num_queries, num_keys, dtype=torch.bool)
    if variant == "causal":
        allowed = torch.ones(num_queries, num_keys, dtype=torch.bool).tril()
    if mask is not None and variant != "mask ignored":
        allowed = allowed & (~mask if variant == "mask inverted" else mask)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-2 if variant == "softmax over queries" else -1)


_WEIGHT_MISTAKES = (  # variant, the property that fails, what the answer did, the hint
    ("d_out", "the scores are scaled by 1 / sqrt(head_dim)", "scores divided by sqrt(d_out)",
     "Each head's dot product adds up head_dim products, so the scores are divided by the "
     "square root of head_dim, not of d_out."),
    ("none", "the scores are scaled before the softmax", "scores that were not scaled",
     "Divide the scores by the square root of head_dim before the softmax, as in chapter 4."),
    ("causal", "cross-attention has no causal mask", "weights with a causal mask",
     "Cross-attention needs no causal mask: every token of x_q may look at every token of "
     "x_kv, because the other sequence is complete before the queries read it."),
    ("mask inverted", "the mask keeps the keys where it is True",
     "weight on the keys where the mask is False",
     "In this book's masks True means 'may attend': keys where the mask is False must get "
     "weight 0, and the others share the weight."),
    ("mask ignored", "the mask is applied", "weight on the masked keys",
     "Use the mask argument: keys where it is False must get weight 0."),
    ("softmax over queries", "each query's weights sum to 1", "columns that sum to 1",
     "The softmax runs over the keys, the last dimension, so that the weights of each query "
     "sum to 1."),
)


@checker
def check_multi_head_cross_attention(cls) -> None:
    """Check a multi-head cross-attention layer against ``torch.nn.MultiheadAttention``.

    ``cls(d_out, d_kv, num_heads, qkv_bias=...)`` must build a layer with ``W_query``,
    ``W_key``, ``W_value`` and ``out_proj``; its ``forward(x_q, x_kv, mask=None)`` must
    return ``(output, attn_weights)`` of shapes ``(B, T_q, d_out)`` and
    ``(B, num_heads, T_q, T_kv)``. The checker copies the weights of an
    ``nn.MultiheadAttention(d_out, num_heads, kdim=d_kv, vdim=d_kv)`` into the layer and
    compares weights and outputs, with and without a padding mask (True = may attend).

    Taught in chapter 7 (exercise 7.1).
    """
    expect_true("the answer is a class (an nn.Module subclass)",
                isinstance(cls, type) and issubclass(cls, nn.Module),
                expected="a class such as MultiHeadCrossAttention",
                actual=type(cls).__name__ if not isinstance(cls, type) else cls.__name__,
                hint="Pass the class itself, not an instance of it or its forward method.")
    cases = (  # d_out, d_kv, num_heads, T_q, T_kv, qkv_bias, padded
        (8, 8, 2, 5, 5, True, False),
        (12, 6, 3, 3, 5, True, False),
        (12, 6, 3, 4, 2, False, False),
        (8, 4, 2, 3, 5, True, True),
    )
    for index, (d_out, d_kv, num_heads, num_queries, num_keys, bias, padded) in enumerate(cases):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(70 + index)
            reference = nn.MultiheadAttention(d_out, num_heads, bias=bias, kdim=d_kv, vdim=d_kv,
                                              batch_first=True).eval()
            x_q = torch.randn(2, num_queries, d_out)  # (B, T_q, d_out)
            x_kv = torch.randn(2, num_keys, d_kv)  # (B, T_kv, d_kv)
            layer = call(cls, d_out, d_kv, num_heads, qkv_bias=bias,
                         prop="the class builds a layer")
        (w_q, w_k, w_v), (b_q, b_k, b_v) = _torch_projections(reference)
        try:
            with torch.no_grad():
                for name, weight, bias_value in (("W_query", w_q, b_q), ("W_key", w_k, b_k),
                                                 ("W_value", w_v, b_v)):
                    getattr(layer, name).weight.copy_(weight)
                    if bias_value is not None:
                        getattr(layer, name).bias.copy_(bias_value)
                layer.out_proj.weight.copy_(reference.out_proj.weight)
                if bias:
                    layer.out_proj.bias.copy_(reference.out_proj.bias)
                else:
                    layer.out_proj.bias.zero_()
        except (AttributeError, RuntimeError) as error:
            fail("the layer keeps the projections that the class's __init__ creates",
                 expected="W_query (d_out <- d_out), W_key and W_value (d_out <- d_kv), out_proj",
                 actual=f"{type(error).__name__}: {error}",
                 hint="Keep the __init__ of the exercise as it is and write only forward.")
        layer.eval()
        mask = None
        if padded:
            lengths = torch.tensor([num_keys, 2])
            mask = (torch.arange(num_keys) < lengths[:, None])[:, None, None, :]  # (B,1,1,T_kv)
        args = f"d_out={d_out}, d_kv={d_kv}, num_heads={num_heads}, T_q={num_queries}, " \
               f"T_kv={num_keys}" + (", with a padding mask" if padded else "")
        differ = ("Your forward fails when x_q and x_kv differ in length or width. The keys "
                  "and values come from x_kv, so their projection and their length T_kv belong "
                  "to x_kv, not to x_q.")
        hints = (("shape", differ), ("size", differ))
        with torch.no_grad():
            result = _call_explained(layer.forward, x_q.clone(), x_kv.clone(), mask,
                                     prop=f"forward runs ({args})", hints=hints if index else ())
            expected, expected_weights = reference(
                x_q, x_kv, x_kv, key_padding_mask=None if mask is None else ~mask[:, 0, 0],
                need_weights=True, average_attn_weights=False,
            )  # (B, T_q, d_out), (B, num_heads, T_q, T_kv)
        expect_true(f"forward returns the pair (output, attn_weights) ({args})",
                    isinstance(result, (tuple, list)) and len(result) == 2,
                    expected="(output, attn_weights)", actual=type(result).__name__,
                    hint="Return the output and the weights, in that order, as the docstring "
                         "says.")
        output, weights = result
        if (isinstance(weights, torch.Tensor) and num_queries != num_keys
                and tuple(weights.shape) == (2, num_heads, num_queries, num_queries)):
            fail(f"the weights have shape (B, num_heads, T_q, T_kv) ({args})",
                 expected=(2, num_heads, num_queries, num_keys), actual=tuple(weights.shape),
                 hint="The keys must come from x_kv: each query gets one weight per token of "
                      "x_kv.")
        expect_shape(f"attn_weights ({args})", weights, expected_weights.shape,
                     hint="One weight per batch element, head, query token and key token.")
        weights = weights.detach().to(expected_weights.dtype)
        queries = x_q @ w_q.T + (b_q if b_q is not None else 0)  # (B, T_q, d_out)
        keys = x_kv @ w_k.T + (b_k if b_k is not None else 0)  # (B, T_kv, d_out)
        if not torch.allclose(weights, expected_weights, atol=1e-5):
            if num_queries == num_keys and d_kv == d_out:
                from_queries = x_q @ w_k.T + (b_k if b_k is not None else 0)
                if torch.allclose(weights, _cross_weights(queries, from_queries, num_heads, mask),
                                  atol=1e-5):
                    fail(f"the keys and values come from x_kv ({args})",
                         expected="keys projected from x_kv", actual="keys projected from x_q",
                         hint="Only the queries come from x_q; the keys and the values come "
                              "from x_kv, the other sequence.")
            for variant, prop, did, hint in _WEIGHT_MISTAKES:
                if (variant.startswith("mask") and mask is None) or (
                        variant == "causal" and num_queries > num_keys):
                    continue
                wrong = _cross_weights(queries, keys, num_heads, mask, variant=variant)
                if torch.allclose(weights, wrong, atol=1e-5, equal_nan=True):
                    fail(f"{prop} ({args})", expected="the weights of nn.MultiheadAttention",
                         actual=did, hint=hint)
        expect_close(f"attn_weights ({args})", weights, expected_weights, hint=_SPLIT_HINT)
        expect_shape(f"the output ({args})", output, expected.shape,
                     hint="The output has one d_out-vector per token of x_q.")
        output = output.detach().to(expected.dtype)
        values = x_kv @ w_v.T + (b_v if b_v is not None else 0)  # (B, T_kv, d_out)
        head_dim = d_out // num_heads
        v = values.view(2, num_keys, num_heads, head_dim).transpose(1, 2)
        context = expected_weights @ v  # (B, num_heads, T_q, head_dim)
        merged = context.transpose(1, 2).reshape(2, num_queries, d_out)  # (B, T_q, d_out)
        if torch.allclose(output, merged, atol=1e-5):
            fail(f"the output goes through out_proj ({args})", expected="out_proj(merged heads)",
                 actual="the merged heads themselves",
                 hint="The weights are right; pass the merged heads through out_proj, which "
                      "mixes the heads.")
        viewed = context.reshape(2, num_queries, d_out)
        if num_heads > 1 and torch.allclose(output, reference.out_proj(viewed), atol=1e-5):
            fail(f"each output row is one token's heads side by side ({args})",
                 expected="row t = [head 0 of token t, head 1 of token t, ...]",
                 actual="rows that mix the tokens of one head",
                 hint="The weights are right, but the heads were merged without moving the head "
                      "dimension back behind the token dimension first (section 7.3).")
        expect_close(f"the output ({args})", output, expected,
                     hint="The weights are right: check how the context vectors of the heads "
                          "are merged and passed through out_proj.")
    passed("your cross-attention equals nn.MultiheadAttention with kdim = vdim = d_kv, "
           "weights and outputs, with and without a padding mask.")


# --------------------------------------------------------------------------- exercise 7.2


def _layer(d_in: int, d_out: int, num_heads: int, seed: int):
    from ..modules import MultiHeadAttention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(d_in, d_out, num_heads, qkv_bias=True)


@checker
def check_load_c_attn(fn) -> None:
    """Check ``fn(mha, c_attn_weight, c_attn_bias)`` loads a GPT-2-style fused projection.

    ``c_attn_weight`` has shape ``(d_in, 3 * d_out)`` and ``c_attn_bias`` ``(3 * d_out,)``, the
    layout of GPT-2's ``Conv1D`` (``x @ weight + bias``), queries, keys and values side by
    side. After the call, ``mha.W_query``, ``W_key`` and ``W_value`` (weights and biases) must
    compute the three thirds of that projection.

    Taught in chapter 7 (exercise 7.2).
    """
    prop_runs = "your function loads the weights without an error"
    hints = (
        ("leaf Variable", "Copying into a parameter in place is only allowed under "
                          "torch.no_grad(): autograd must not record the copy."),
        ("must match the size", "A slice does not fit the parameter it is copied into: compare "
                                "the shape of each slice with the shape of the parameter."),
        ("not enough values", "c_attn_weight holds the three projections side by side: split "
                              "it into three parts along the right dimension."),
        ("too many values", "c_attn_weight holds the three projections side by side: split it "
                            "into three parts along the right dimension."),
    )
    for index, (d_in, d_out, num_heads) in enumerate(((8, 8, 2), (6, 8, 2), (8, 12, 3))):
        mha = hand_over(_layer(d_in, d_out, num_heads, seed=72 + index))  # read back below
        generator = torch.Generator().manual_seed(720 + index)
        c_attn_weight = torch.randn(d_in, 3 * d_out, generator=generator)  # (d_in, 3 * d_out)
        c_attn_bias = torch.randn(3 * d_out, generator=generator)  # (3 * d_out,)
        _call_explained(fn, mha, c_attn_weight.clone(), c_attn_bias.clone(), prop=prop_runs,
                        hints=hints)
        blocks = c_attn_weight.split(d_out, dim=1)  # 3 x (d_in, d_out)
        bias_blocks = c_attn_bias.split(d_out)  # 3 x (d_out,)
        names = ("W_query", "W_key", "W_value")
        where = f"(d_in={d_in}, d_out={d_out})"
        for position, name in enumerate(names):
            weight = getattr(mha, name).weight.detach()
            expect_shape(f"mha.{name}.weight {where}", weight, (d_out, d_in),
                         hint="Keep the layer's parameters as they are and copy values into "
                              "them.")
            right = blocks[position].T  # (d_out, d_in)
            if torch.equal(weight, right):
                continue
            if d_in == d_out and torch.equal(weight, blocks[position]):
                fail(f"mha.{name}.weight holds its third of c_attn in nn.Linear's layout {where}",
                     expected="nn.Linear's layout, (out_features, in_features)",
                     actual="the slice in c_attn's layout, (in_features, out_features)",
                     hint="nn.Linear keeps its weight as (out_features, in_features) and computes "
                          "x @ weight.T; c_attn keeps (in_features, out_features) and computes "
                          "x @ weight. The layouts differ, even when the shapes agree.")
            others = [n for p, n in enumerate(("queries", "keys", "values"))
                      if p != position and torch.equal(weight, blocks[p].T)]
            if others:
                fail(f"mha.{name}.weight holds the {('queries', 'keys', 'values')[position]}' "
                     f"third of c_attn {where}", expected=f"third number {position + 1}",
                     actual=f"the {others[0]}' third",
                     hint="c_attn lays the query, key and value projections side by side, in "
                          "that order.")
            fail(f"mha.{name}.weight is its third of c_attn {where}",
                 expected=f"{right[0, 0].item():.4g} at index (0, 0)",
                 actual=f"{weight[0, 0].item():.4g} at index (0, 0)",
                 hint="Each projection is one of three equal blocks of c_attn_weight, side by "
                      "side; check which dimension you split and the layout of the block.")
        for position, name in enumerate(names):
            bias = getattr(mha, name).bias.detach()
            if torch.equal(bias, bias_blocks[position]):
                continue
            taken = [("queries", "keys", "values")[p] for p in range(3)
                     if torch.equal(bias, bias_blocks[p])]
            fail(f"mha.{name}.bias is its third of c_attn_bias {where}",
                 expected=f"the {('queries', 'keys', 'values')[position]}' third",
                 actual=f"the {taken[0]}' third" if taken else "numbers that are not a third "
                        "of c_attn_bias",
                 hint="Each of the three projections takes its own third of c_attn_bias, in the "
                      "order queries, keys, values.")
        x = torch.randn(2, 4, d_in, generator=generator)  # (B, T, d_in)
        with torch.no_grad():
            fused = x @ c_attn_weight + c_attn_bias  # (B, T, 3 * d_out)
            for name, expected in zip(names, fused.split(d_out, dim=-1), strict=True):
                expect_close(f"mha.{name}(x) {where}", getattr(mha, name)(x), expected,
                             hint="Each projection must compute its third of x @ c_attn_weight "
                                  "+ c_attn_bias.")
    passed("the loaded layer computes GPT-2's fused query, key and value projections, for "
           "square and non-square weights.")


# --------------------------------------------------------------------------- exercise 7.3


def _pooled(weight: torch.Tensor, num_kv_heads: int, head_dim: int, how: str) -> torch.Tensor:
    """Key/value heads of a (num_heads * head_dim, ...) weight, grouped and pooled."""
    num_heads = weight.shape[0] // head_dim
    group_size = num_heads // num_kv_heads
    rest = weight.shape[1:]
    if how == "tiled":
        heads = weight.reshape(group_size, num_kv_heads, head_dim, *rest).mean(0)
    else:
        grouped = weight.reshape(num_kv_heads, group_size, head_dim, *rest)
        heads = {"mean": grouped.mean(1), "sum": grouped.sum(1), "first": grouped[:, 0]}[how]
    return heads.reshape(num_kv_heads * head_dim, *rest)


def _check_pooled(name: str, actual: torch.Tensor, source: torch.Tensor, num_kv_heads: int,
                  head_dim: int, where: str) -> None:
    expected = _pooled(source, num_kv_heads, head_dim, "mean")
    expect_shape(f"{name} {where}", actual, expected.shape,
                 hint="The new layer has num_kv_heads key/value heads of head_dim features.")
    actual = actual.detach()
    if torch.allclose(actual, expected, atol=1e-6):
        return
    group_size = source.shape[0] // head_dim // num_kv_heads
    mistakes = (
        ("tiled", "the heads of a group are consecutive",
         "every num_kv_heads-th head averaged together",
         "Query heads that share a key/value head are neighbours (head h reads key/value head "
         "h // group_size): average heads that stand next to each other, not every "
         "num_kv_heads-th head."),
        ("first", "each new head is the mean of its group", "the first head of each group",
         "Keep every head of the group: the new head is their mean, not one of them."),
        ("sum", "each new head is the mean of its group, not the sum",
         "the sum of each group's heads",
         "Divide by the number of heads in the group: the new head is their mean."),
    )
    for how, prop, did, hint in mistakes:
        if group_size > 1 and torch.allclose(actual, _pooled(source, num_kv_heads, head_dim, how),
                                             atol=1e-6):
            fail(f"{name}: {prop} {where}", expected="the mean of each group of consecutive heads",
                 actual=did, hint=hint)
    fail(f"the values of {name} {where}",
         expected="the mean of each group of consecutive heads of the multi-head layer",
         actual="other numbers",
         hint="Cut the multi-head parameter into heads of head_dim rows, group consecutive heads "
              "and average each group; the biases are pooled like the weights.")


@checker
def check_mha_to_gqa(fn) -> None:
    """Check ``fn(mha, num_kv_heads)`` turns a multi-head layer into grouped-query attention.

    The result must be a new :class:`~attention_book.GroupedQueryAttention` with the same
    sizes, bias and causal setting, the same ``W_query`` and ``out_proj``, and key/value
    heads that are the means of each group of consecutive heads of ``mha`` (Ainslie et al.,
    2023). ``mha`` itself must stay unchanged.

    Taught in chapter 7 (exercise 7.3).
    """
    from ..modules import GroupedQueryAttention, MultiHeadAttention

    cases = (  # d_in, d_out, num_heads, num_kv_heads, qkv_bias, causal
        (8, 8, 4, 2, True, True),
        (6, 12, 6, 3, False, False),
        (8, 8, 4, 1, True, False),
        (8, 8, 4, 4, True, True),
    )
    for index, (d_in, d_out, num_heads, num_kv_heads, bias, causal) in enumerate(cases):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(73 + index)
            mha = MultiHeadAttention(d_in, d_out, num_heads, qkv_bias=bias, causal=causal)
        before = {key: value.clone() for key, value in mha.state_dict().items()}
        mha = hand_over(mha)  # the answer's copy: the checks below read what it left there
        where = f"(num_heads={num_heads}, num_kv_heads={num_kv_heads})"
        gqa = call(fn, mha, num_kv_heads, prop=f"your function runs {where}")
        expect_true(f"mha is left unchanged {where}",
                    all(torch.equal(value, before[key]) for key, value in mha.state_dict().items()),
                    expected="the multi-head layer as it was", actual="changed parameters",
                    hint="Build a new layer and copy into it; the checkpoint you convert must "
                         "stay as it is.")
        expect_true(f"the result is a GroupedQueryAttention {where}",
                    isinstance(gqa, GroupedQueryAttention), expected="GroupedQueryAttention",
                    actual=type(gqa).__name__,
                    hint="Return the new attention_book.GroupedQueryAttention layer.")
        expect_true(f"the new layer has the same sizes {where}",
                    (gqa.d_in, gqa.d_out, gqa.num_heads, gqa.num_kv_heads)
                    == (d_in, d_out, num_heads, num_kv_heads),
                    expected=(d_in, d_out, num_heads, num_kv_heads),
                    actual=(gqa.d_in, gqa.d_out, gqa.num_heads, gqa.num_kv_heads),
                    hint="Build it with mha's d_in, d_out and num_heads, and num_kv_heads "
                         "key/value heads.")
        expect_true(f"the new layer keeps the causal setting and the qkv bias {where}",
                    gqa.causal == causal and (gqa.W_query.bias is not None) == bias,
                    expected=f"causal={causal}, qkv_bias={bias}",
                    actual=f"causal={gqa.causal}, qkv_bias={gqa.W_query.bias is not None}",
                    hint="Read causal and the presence of the bias from mha and pass them on.")
        for name in ("W_query", "out_proj"):
            for part in ("weight", "bias"):
                source = getattr(getattr(mha, name), part)
                if source is None:
                    continue
                expect_true(f"{name}.{part} is copied unchanged {where}",
                            torch.equal(getattr(getattr(gqa, name), part).detach(), source),
                            expected=f"mha.{name}.{part}", actual="other numbers",
                            hint="Only the keys and values are pooled: the query heads and "
                                 "out_proj stay as they were.")
        head_dim = d_out // num_heads
        for name in ("W_key", "W_value"):
            _check_pooled(f"{name}.weight", getattr(gqa, name).weight,
                          getattr(mha, name).weight.detach(), num_kv_heads, head_dim, where)
            if bias:
                _check_pooled(f"{name}.bias", getattr(gqa, name).bias,
                              getattr(mha, name).bias.detach(), num_kv_heads, head_dim, where)
        x = torch.randn(2, 5, d_in, generator=torch.Generator().manual_seed(730 + index))
        with torch.no_grad():
            if num_kv_heads == num_heads:
                expect_close(f"the output {where}", gqa(x), mha(x),
                             hint="With one key/value head per query head the new layer must "
                                  "compute exactly what mha computes.")
    passed("each key/value head is the mean of its group of consecutive heads, and the "
           "queries and out_proj are unchanged (Ainslie et al., 2023).")
