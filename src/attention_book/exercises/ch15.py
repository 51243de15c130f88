"""Checkers for chapter 15's exercises (attention inside a model)."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from ..heads import ablate_heads, hand_built_induction_model, head_name
from ..model import TinyGPT, TransformerBlock
from ._feedback import call, checker, expect_close, expect_true, fail, passed

__all__ = [
    "check_block_parameter_count",
    "check_breaking_heads",
    "check_block_forward",
    "check_is_causal",
]


def _count(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


@checker
def check_block_parameter_count(fn) -> None:
    """Check ``fn(d_model, mlp_ratio, qkv_bias)`` counts the parameters of a TransformerBlock.

    The answer is ``(4 + 2 r) d^2 + (6 + r) d``, plus ``3 d`` with a bias on the query, key and
    value projections; the checker counts real blocks.

    Taught in chapter 15.
    """
    hint = ("add up, for d = d_model and r = mlp_ratio: two LayerNorms (a weight and a bias of "
            "d each), the query, key and value projections (d x d each, plus a bias of d each "
            "when qkv_bias), the output projection (d x d and a bias), and the MLP (d x rd and "
            "a bias of rd, then rd x d and a bias of d)")
    for d_model, mlp_ratio, qkv_bias in ((16, 4, False), (16, 4, True), (24, 2, False),
                                         (8, 3, True), (64, 1, False)):
        block = TransformerBlock(d_model, 4, 8, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                 device="meta")
        expected = _count(block)
        actual = call(fn, d_model, mlp_ratio, qkv_bias)
        label = f"block_parameter_count({d_model}, {mlp_ratio}, {qkv_bias})"
        if isinstance(actual, bool) or not isinstance(actual, numbers.Integral):
            fail(f"{label} is an int", expected="an int", actual=type(actual).__name__,
                 hint=hint)
        if actual == expected:
            continue
        d = d_model
        if actual == expected - 3 * d * qkv_bias or actual == expected + 3 * d * (not qkv_bias):
            fail(f"{label} counts the query, key and value biases when qkv_bias is set",
                 expected=expected, actual=actual,
                 hint="qkv_bias adds a bias of d_model numbers to each of the three "
                      "projections, and only then; the output projection always has one")
        if actual == expected - 4 * d:
            fail(f"{label} counts the LayerNorms", expected=expected, actual=actual,
                 hint="each of the two LayerNorms learns a weight and a bias of d_model each")
        plain = (4 + 2 * 4) * d * d + (6 + 4) * d + 3 * d * qkv_bias
        if mlp_ratio != 4 and actual == plain:
            fail(f"{label} follows mlp_ratio", expected=expected, actual=actual,
                 hint="the MLP's hidden layer has mlp_ratio * d_model units, not always 4")
        fail(f"{label} has the right value", expected=expected, actual=actual, hint=hint)
    passed("a block holds (4 + 2r) d^2 + (6 + r) d parameters (+ 3d with qkv_bias): at r = 4, "
           "two thirds of them are in the MLP.")


_BREAKING = {"L0H0", "L1H0"}


def _copy_accuracy(model: nn.Module) -> float:
    generator = torch.Generator().manual_seed(0)
    segments = torch.stack([torch.randperm(7, generator=generator) + 1 for _ in range(16)])
    tokens = torch.cat([torch.zeros(16, 1, dtype=torch.long), segments, segments], dim=1)
    with torch.no_grad():
        predicted = model(tokens).argmax(-1)  # (16, 15)
    return (predicted[:, 8:-1] == tokens[:, 9:]).double().mean().item()


@checker
def check_breaking_heads(fn) -> None:
    """Check ``fn()`` names the heads of the hand-built model whose ablation alone breaks copying.

    The checker zeroes each of the four heads of ``hand_built_induction_model()`` in turn and
    measures how often the second copy of a repeated sequence is predicted.

    Taught in chapter 15.
    """
    hint = ("a head matters when something downstream reads what it writes: follow the "
            "previous-token block from the head that fills it to the head whose key reads it, "
            "and the copied-token block to the output layer")
    predicted = call(fn)
    if isinstance(predicted, str) or not isinstance(predicted, (set, list, tuple, frozenset)):
        fail("the prediction is a set of head names", expected="a set such as {'L0H1'}",
             actual=type(predicted).__name__, hint="return a set of names like 'L1H0'")
    predicted = set(predicted)
    model = hand_built_induction_model(dtype=torch.float64)
    names = {head_name(layer, head) for layer in range(2) for head in range(2)}
    unknown = predicted - names
    expect_true("every predicted name is a head of the model", not unknown,
                expected=f"names among {sorted(names)}", actual=sorted(map(str, unknown)),
                hint="heads are named L<layer>H<head>, counted from 0")
    breaking = set()
    for name in sorted(names):
        with ablate_heads(model, [name]):
            if _copy_accuracy(model) < 0.5:
                breaking.add(name)
    if "L0H1" in predicted:
        fail("the prediction leaves out heads that look right but write nothing",
             expected="L0H1 does not break copying", actual="L0H1 predicted to break it",
             hint="L0H1 attends to the previous token as sharply as L0H0, but its value "
                  "projection is zero: a pattern says where a head looks, not what it adds")
    if "L0H0" not in predicted:
        fail("the prediction includes the head that writes the previous token",
             expected="L0H0 breaks copying", actual="L0H0 left out",
             hint="without L0H0 the previous-token block stays empty, so the induction head's "
                  "keys all look alike and it can no longer find the earlier copy")
    expect_true("the prediction names exactly the heads whose ablation breaks copying",
                predicted == breaking, expected=sorted(breaking), actual=sorted(predicted),
                hint=hint)
    passed("L0H0 and L1H0 form the circuit; the decoy L0H1 has the right pattern but writes "
           "nothing that any later head reads.")


def _reference_forward(block: TransformerBlock, x: torch.Tensor) -> torch.Tensor:
    x = x + block.attention(block.attention_norm(x))  # (B, T, d_model)
    return x + block.mlp(block.mlp_norm(x))  # (B, T, d_model)


class _PartsOnly(TransformerBlock):
    """A block whose own forward refuses to run: the answer must call its parts."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("call the block's parts (attention_norm, attention, mlp_norm, mlp), "
                           "not the block itself")


@checker
def check_block_forward(fn) -> None:
    """Check ``fn(block, x)`` computes a pre-LayerNorm block from its parts.

    Taught in chapter 15.
    """
    hint = ("the stream x itself is never normalised: each branch reads a LayerNorm-ed copy, "
            "x = x + attention(attention_norm(x)), then x = x + mlp(mlp_norm(x))")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        block = _PartsOnly(8, 2, 6, dtype=torch.float64).eval()
        with torch.no_grad():
            for norm in (block.attention_norm, block.mlp_norm):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
        x = 3 * torch.randn(2, 5, 8, dtype=torch.float64) + 1  # (B, T, d_model)
    with torch.no_grad():
        expected = _reference_forward(block, x)
        actual = call(fn, block, x.clone())
        normed = block.attention_norm(x)  # (B, T, d_model)
        stream_normed = normed + block.attention(normed)
        stream_normed = stream_normed + block.mlp(block.mlp_norm(stream_normed))
        after_attention = x + block.attention(block.attention_norm(x))
        raw_mlp = after_attention + block.mlp(after_attention)
        post_norm = block.attention_norm(x + block.attention(x))
        post_norm = block.mlp_norm(post_norm + block.mlp(post_norm))
    if isinstance(actual, torch.Tensor) and actual.shape == expected.shape:
        actual = actual.detach().to(expected.dtype)
        for wrong, prop, detail in (
            (stream_normed, "the residual stream carries x, not attention_norm(x)",
             "x = attention_norm(x) replaces the stream by its normalised copy: the block's "
             "input no longer reaches its output unchanged; keep x and add to it"),
            (raw_mlp, "the MLP reads a LayerNorm-ed copy of the stream",
             "feed mlp_norm(x) to the MLP, as attention reads attention_norm(x)"),
            (post_norm, "the block is pre-LayerNorm",
             "this is the post-LN block of the 2017 Transformer: normalise what each branch "
             "reads, not the sum"),
        ):
            if torch.allclose(actual, wrong):
                fail(prop, expected="x + attention(attention_norm(x)), then + mlp(mlp_norm(x))",
                     actual="the buggy output", hint=detail)
    expect_close("the block's output", actual, expected, hint=hint)
    passed("each branch reads a normalised copy and adds to the untouched stream.")


class _TimeNormGPT(TinyGPT):
    """Subtracts the mean over the sequence from the final stream: every position sees all."""

    def _forward(self, idx, kv_caches=None):
        logits, weights = super()._forward(idx, kv_caches)
        return logits - logits.mean(dim=1, keepdim=True), weights  # (B, T, V)


class _PeekAheadGPT(TinyGPT):
    """Each position is given the logits of the position after it: it sees one token ahead."""

    def _forward(self, idx, kv_caches=None):
        logits, weights = super()._forward(idx, kv_caches)
        ahead = torch.cat([logits[:, 1:], logits[:, -1:]], dim=1)  # (B, T, V)
        return ahead, weights


class _MiddleLeakGPT(TinyGPT):
    """Position 0 also reads token 3: only a test that changes every token catches it."""

    def _forward(self, idx, kv_caches=None):
        logits, weights = super()._forward(idx, kv_caches)
        leak = torch.zeros_like(logits)  # (B, T, V)
        leak[:, 0, 0] = 0.1 * idx[:, 3].to(logits.dtype)
        return logits + leak, weights


def _models():
    sizes = (13, 16, 4, 2, 9)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        healthy = TinyGPT(*sizes, dtype=torch.float64).eval()
        torch.manual_seed(1)
        attention_only = TinyGPT(*sizes, attention_only=True, dtype=torch.float64).eval()
        torch.manual_seed(2)
        sees_future = TinyGPT(*sizes, dtype=torch.float64).eval()
        for block in sees_future.blocks:
            block.attention.causal = False
        broken = {"attention without the causal mask": sees_future}
        for name, cls in (("a normalisation over the sequence (every position sees every "
                           "token)", _TimeNormGPT),
                          ("each position sees the token after it", _PeekAheadGPT),
                          ("position 0 reads token 3 (a leak only from the middle)",
                           _MiddleLeakGPT)):
            torch.manual_seed(3)
            broken[name] = cls(*sizes, dtype=torch.float64).eval()
    return {"TinyGPT": healthy, "an attention-only TinyGPT": attention_only}, broken


@checker
def check_is_causal(fn) -> None:
    """Check the property test ``fn(model) -> bool``: True for causal models, False for leaky ones.

    It is run on two healthy models and four broken ones, each with ``vocab_size`` and
    ``context_length`` attributes and ``model(tokens) -> logits``.

    Taught in chapter 15.
    """
    hint = ("for every position p, change the token at p (e.g. to (token + 1) % vocab_size) "
            "and require the logits at positions 0 … p - 1 to stay the same; compare with "
            "torch.allclose, and use a whole context of random tokens")
    healthy, broken = _models()
    for name, model in healthy.items():
        verdict = call(fn, model)
        if not isinstance(verdict, bool):
            fail(f"is_causal returns a bool for {name}", expected="True or False",
                 actual=type(verdict).__name__, hint="return the result of your comparison "
                 "as a bool (bool(...) around a tensor)")
        expect_true(f"is_causal accepts a healthy {name}", verdict, expected=True,
                    actual=verdict, hint="a causal model gives exactly the same logits at the "
                    "earlier positions; compare only positions before the changed token")
    for name, model in broken.items():
        verdict = call(fn, model)
        expect_true(f"is_causal rejects a model with {name}", verdict is False,
                    expected=False, actual=verdict, hint=hint)
    passed("your test accepts both healthy models and catches all four leaks, including the "
           "one that only a change in the middle of the sequence reveals.")
