"""Checkers for chapter 8's exercises (reading the attention of a real model)."""

from __future__ import annotations

import torch

from .feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = ["check_top_head", "check_predicted_bias_effects", "check_norm_based_weights"]


def _random_attentions(num_layers: int, num_heads: int, num_tokens: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.softmax(torch.randn(1, num_heads, num_tokens, num_tokens, generator=generator), -1)
        for _ in range(num_layers)
    ]


def _as_pair(answer):
    if isinstance(answer, torch.Tensor):
        answer = answer.tolist()
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return None
    try:
        return tuple(int(value) for value in answer)
    except (TypeError, ValueError):
        return None


@checker
def check_top_head(fn) -> None:
    """Check ``fn(attentions, query_index, key_index)`` returns the ``(layer, head)`` whose
    weight from the query token to the key token is the largest.

    ``attentions`` is a list of per-layer ``(1, num_heads, T, T)`` tensors, as a
    ``transformers`` model returns them with ``output_attentions=True``. The checker plants one
    clear winner in random weights with more heads than layers, so that each of the typical
    mistakes (reading a column instead of a row, splitting the flat index by the number of
    layers) gives a wrong pair.

    Taught in chapter 8 (exercise 8.1).
    """
    hint = ("Take the weight from the query token to the key token in every layer and head, "
            "and find the (layer, head) where it is largest.")
    for num_layers, num_heads, seed in ((3, 5, 0), (2, 7, 1), (4, 6, 2)):
        attentions = _random_attentions(num_layers, num_heads, 6, seed)
        query_index, key_index = 4, 1
        layer, head = num_layers - 2, num_heads - 2
        attentions[layer][0, head, query_index] = 0.0  # one clear winner, in row query_index
        attentions[layer][0, head, query_index, key_index] = 1.0
        # A decoy in the column: the largest weight *from* the key token *to* the query token.
        decoy_layer, decoy_head = num_layers - 1, 1
        attentions[decoy_layer][0, decoy_head, key_index] = 0.0
        attentions[decoy_layer][0, decoy_head, key_index, query_index] = 1.0
        answer = call(fn, [a.clone() for a in attentions], query_index, key_index)
        pair = _as_pair(answer)
        if pair is None:
            fail("the answer is a pair (layer, head) of ints", expected=(layer, head),
                 actual=repr(answer)[:60],
                 hint="Return the two numbers as a tuple, for example with int(...) on each.")
        if pair == (layer, head):
            continue
        flat = decoy_layer * num_heads + decoy_head
        winner = layer * num_heads + head
        where = f"({num_layers} layers of {num_heads} heads)"
        if pair in (divmod(winner, num_layers), divmod(flat, num_layers)):
            fail(f"the flat index is split into (layer, head) correctly {where}",
                 expected=(layer, head), actual=pair,
                 hint="In a flattened (num_layers, num_heads) table the head index runs fastest: "
                      "think about which of the two sizes the flat index must be divided by.")
        if pair in ((decoy_layer, decoy_head), (decoy_head, decoy_layer)):
            fail(f"the weight read goes from the query token to the key token {where}",
                 expected=(layer, head), actual=pair,
                 hint="Row i of a weight matrix is query token i (the token that attends); "
                      "column j is key token j. The code reads the weight from the key token "
                      "to the query token.")
        if pair == (head, layer):
            fail(f"the pair is (layer, head), in that order {where}", expected=(layer, head),
                 actual=pair, hint="Return the layer first and the head second.")
        fail(f"the (layer, head) with the largest weight {where}", expected=(layer, head),
             actual=pair, hint=hint)
    passed("you find the head that attends most from one token to another, by computation.")


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_bias_effects(fn) -> None:
    """Check the prediction ``fn()`` about removing the query or the key bias of a BERT layer.

    ``fn()`` returns a dict with the keys ``"key bias"`` and ``"query bias"``, each True when
    the learner predicts that setting that bias to zero changes some attention weight (by more
    than 1e-6). Zeroing the key bias changes no weight: it adds ``q_i · b_K`` to every score
    of row ``i``, and the softmax ignores a constant added to a row. Zeroing the query bias
    does change the weights, since ``b_Q · k_j`` differs from key to key.

    Taught in chapter 8 (exercise 8.2).
    """
    answer = call(fn)
    expect_true("the prediction is a dict with the keys 'key bias' and 'query bias'",
                isinstance(answer, dict) and set(answer) == {"key bias", "query bias"}
                and all(isinstance(value, bool) for value in answer.values()),
                expected="{'key bias': True or False, 'query bias': True or False}",
                actual=repr(answer)[:80],
                hint="Return a dict whose two values are True (some weight changes) or False.")
    if answer["key bias"]:
        fail("your prediction for the key bias",
             expected="a prediction that survives the experiment", actual="some weight changes",
             hint="Write the score of query i and key j with the bias, q_i · (W_K x_j + b_K), "
                  "and look for the part that is the same for every key j of the row. What "
                  "does the softmax do with a number added to every score of a row?")
    if not answer["query bias"]:
        fail("your prediction for the query bias",
             expected="a prediction that survives the experiment", actual="no weight changes",
             hint="Write the score with the query bias, (W_Q x_i + b_Q) · k_j: the extra term "
                  "b_Q · k_j involves the key. Is it the same for every key j of the row?")
    passed("the key bias adds q_i · b_K to every score of row i, which the softmax ignores, "
           "while the query bias adds b_Q · k_j, which differs from key to key.")


def _norm_based(weights: torch.Tensor, transformed: torch.Tensor, variant: str = "right"):
    lengths = transformed.norm(dim=-1)  # (num_heads, T)
    if variant == "squared":
        lengths = lengths**2
    contributions = weights * lengths[:, None, :]  # (num_heads, T_q, T_k)
    if variant == "not renormalised":
        return contributions
    if variant == "columns":
        return contributions / contributions.sum(dim=-2, keepdim=True)
    return contributions / contributions.sum(dim=-1, keepdim=True)


@checker
def check_norm_based_weights(fn) -> None:
    """Check ``fn(weights, transformed)`` computes norm-based attention maps for every head.

    ``weights`` has shape ``(num_heads, T, T)`` and ``transformed`` ``(num_heads, T, d)``, the
    vector ``f_h(x_j)`` that key token ``j`` would add through head ``h`` (its value times
    the head's part of ``W_O``). The result ``(num_heads, T, T)`` holds, for every head and
    query ``i``, the lengths ``‖α_ij f_h(x_j)‖`` divided by their sum over ``j`` (Kobayashi
    et al., 2020): every row sums to 1.

    Taught in chapter 8 (exercise 8.3).
    """
    generator = torch.Generator().manual_seed(8)
    weights = torch.softmax(torch.randn(3, 5, 5, generator=generator), dim=-1)  # (heads, T, T)
    transformed = torch.randn(3, 5, 4, generator=generator)  # (heads, T, d)
    transformed = transformed * torch.tensor([0.05, 1.0, 2.0, 3.0, 0.5])[None, :, None]
    expected = _norm_based(weights, transformed)
    actual = call(fn, weights.clone(), transformed.clone())
    expect_shape("the norm-based weights", actual, expected.shape,
                 hint="One map per head: a (num_heads, T, T) tensor, like the attention weights.")
    actual = actual.detach().to(expected.dtype)
    mistakes = (
        ("raw weights", weights, "the norm-based weights differ from the attention weights",
         "the attention weights themselves",
         "Multiply each weight by the length of the vector that key token j sends, f_h(x_j): "
         "a large weight on a short vector contributes little."),
        ("not renormalised", _norm_based(weights, transformed, "not renormalised"),
         "every row sums to 1", "the lengths ‖α_ij f_h(x_j)‖ themselves",
         "Divide each row by its sum, so that the map can be read like attention weights."),
        ("columns", _norm_based(weights, transformed, "columns"),
         "every row (one query) sums to 1", "columns that sum to 1",
         "Normalise over the keys j of each query i: row i is query i."),
        ("squared", _norm_based(weights, transformed, "squared"),
         "the map uses the lengths of the vectors", "squared lengths",
         "Use the length (the norm) of α_ij f_h(x_j), not its square."),
    )
    for _, wrong, prop, did, hint in mistakes:
        if torch.allclose(actual, wrong, atol=1e-5):
            fail(prop, expected="‖α_ij f_h(x_j)‖ / Σ_j' ‖α_ij' f_h(x_j')‖", actual=did, hint=hint)
    expect_close("the norm-based weights", actual, expected,
                 hint="For every head h and query i: the lengths of α_ij f_h(x_j) over the keys j "
                      "(norms over the feature dimension), divided by their sum.")
    passed("every row shows how much of what reaches query i comes from each key token, by the "
           "length of what that token sends, not only by its weight.")
