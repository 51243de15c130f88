"""Checkers for chapter 1's exercises (context vectors and positions)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from .feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = [
    "check_average_so_far", "check_window_average", "check_recency_weights", "check_offset_matrix",
]


class _TensorWatch(TorchFunctionMode):
    """Count the torch calls an answer makes and note the first tensor with two dims of size T."""

    def __init__(self, num_tokens: int):
        super().__init__()
        self.num_tokens = num_tokens
        self.calls = 0
        self.square_shape: tuple[int, ...] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.calls += 1
        for out in result if isinstance(result, (tuple, list)) else (result,):
            if (self.square_shape is None and isinstance(out, torch.Tensor)
                    and list(out.shape).count(self.num_tokens) >= 2):
                self.square_shape = tuple(out.shape)
        return result


def _watched_call(fn, x: torch.Tensor) -> _TensorWatch:
    """Run ``fn(x)`` while watching which tensors it builds."""
    watch = _TensorWatch(x.shape[-2])
    with watch:
        call(fn, x)
    return watch


def _reference_average(x: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Average of the last ``window`` tokens up to each position (all of them if None)."""
    num_tokens = x.shape[-2]
    window = num_tokens if window is None else window
    query_pos = torch.arange(num_tokens).unsqueeze(1)  # (T, 1)
    key_pos = torch.arange(num_tokens).unsqueeze(0)  # (1, T)
    visible = ((key_pos <= query_pos) & (key_pos > query_pos - window)).to(x.dtype)  # (T, T)
    weights = visible / visible.sum(dim=-1, keepdim=True)  # (T, T)
    return weights @ x  # (..., T, d)


def _encoding(context_length: int, d_model: int, pair_step: int = 2) -> torch.Tensor:
    """The sinusoidal positional encoding of Vaswani et al. (2017), in float64.

    ``pair_step=1`` gives the common mistake of using the pair index ``i`` instead of
    ``2i`` in the exponent.
    """
    positions = torch.arange(context_length, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    pair_index = torch.arange(0, d_model // 2, dtype=torch.float64) * pair_step  # (d_model / 2,)
    angles = positions * 10000.0 ** (-pair_index / d_model)  # (T, d_model / 2)
    encoding = torch.zeros(context_length, d_model, dtype=torch.float64)  # (T, d_model)
    encoding[:, 0::2] = torch.sin(angles)
    encoding[:, 1::2] = torch.cos(angles)
    return encoding


@checker
def check_average_so_far(fn) -> None:
    """Check ``fn(x)`` returns the running average over tokens, for ``(..., T, d)`` input.

    The answer must build no ``(T, T)`` tensor and must not loop over the tokens: the checker
    watches every tensor the answer creates (a ``TorchFunctionMode``) and counts its torch
    calls for a short and a long sequence.

    Taught in chapter 1.
    """
    small = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]])  # (3, 2)
    expect_close(
        "the running average of the hand example", call(fn, small),
        torch.tensor([[1.0, 2.0], [2.0, 3.0], [3.0, 2.0]]),
        hint="Token t averages tokens 0 ... t, so divide the running sum at t by t + 1, not by T.",
    )
    torch.manual_seed(0)
    x = torch.randn(7, 5)  # (T, d)
    expect_close(
        "the running average of a (7, 5) input", call(fn, x), _reference_average(x),
        hint="Take the running sum along the token dim (dim=-2), then divide row t by t + 1.",
    )
    batch = torch.randn(2, 3, 6, 4)  # (B, H, T, d)
    expect_close(
        "the running average of a (2, 3, 6, 4) input", call(fn, batch),
        _reference_average(batch),
        hint="Use dim=-2 for the tokens and shape the counts (T, 1), so that any leading "
             "batch dims are left alone.",
    )
    watch = _watched_call(fn, torch.randn(2, 3, 9, 5))  # (B, H, T=9, d)
    expect_true(
        "your function builds no (T, T) tensor", watch.square_shape is None,
        expected="no tensor with two dims of size T = 9",
        actual=f"a tensor of shape {watch.square_shape}",
        hint="A (T, T) matrix of weights is way 2 of the chapter, which this exercise asks "
             "you to avoid: running sums and running counts need only (..., T, d) and (T, 1).",
    )
    short, long = _watched_call(fn, torch.randn(6, 2)), _watched_call(fn, torch.randn(30, 2))
    expect_true(
        "your function does not loop over the tokens", long.calls <= short.calls + 10,
        expected="about the same number of torch operations for 6 and for 30 tokens",
        actual=f"{short.calls} operations for 6 tokens and {long.calls} for 30",
        hint="A Python loop over the positions does T steps; one call of torch.cumsum along "
             "the token dim does them all at once.",
    )
    passed("token t is the average of tokens 0 ... t, for any number of leading dims, "
           "with no loop and no (T, T) matrix.")


@checker
def check_window_average(fn) -> None:
    """Check ``fn(x, window)`` averages the last ``window`` tokens up to each position.

    Taught in chapter 1.
    """
    torch.manual_seed(0)
    x = torch.randn(6, 3)  # (T, d)
    output = call(fn, x, 3)
    expect_shape("the output for window=3", output, (6, 3),
                 hint="Return one context vector per token: shape (T, d).")
    changed = x.clone()
    changed[-1] += 10.0
    later = call(fn, changed, 3)
    expect_true(
        "changing the last token leaves every earlier context vector alone",
        torch.allclose(later[:-1], output[:-1], atol=1e-5),
        expected="rows 0 ... T-2 unchanged", actual="an earlier row changed",
        hint="Token t may look at key s only when s <= t: block every key after the query, "
             "as the causal average of the chapter does.",
    )
    if torch.allclose(output, _reference_average(x), atol=1e-5):
        fail("window=3 averages tokens t-2, t-1 and t", expected="3 tokens in every full window",
             actual="all the tokens 0 ... t",
             hint="Your function ignores the window: block the keys that lie window or more "
                  "positions before the query, as well as the later ones.")
    for wrong_window in (4, 2):
        if torch.allclose(output, _reference_average(x, wrong_window), atol=1e-5):
            fail("window=3 averages tokens t-2, t-1 and t",
                 expected="3 tokens in every full window", actual=f"{wrong_window} tokens",
                 hint="Token t may look at key s when t - window < s <= t: count the keys "
                      "that this condition lets through for window=3.")
    divided_by_window = torch.stack([x[max(0, t - 2): t + 1].sum(dim=0) / 3 for t in range(6)])
    if torch.allclose(output, divided_by_window, atol=1e-5):
        fail("the first tokens average only the tokens they can see",
             expected="token 0 keeps its own vector", actual="token 0 divided by the window",
             hint="At the start of the sequence the window holds fewer tokens: average only "
                  "those, which the softmax of masked scores does by itself.")
    expect_close(
        "the output for window=3", output, _reference_average(x, 3),
        hint="Row t of the weights holds equal weights on keys t - window + 1 ... t (those that "
             "exist) and zero elsewhere.",
    )
    expect_close(
        "the output for window=1", call(fn, x, 1), x,
        hint="With window=1, token t may look only at itself, so every token keeps its vector.",
    )
    expect_close(
        "the output for a window as long as the sequence", call(fn, x, 6),
        _reference_average(x),
        hint="A window of T tokens is the average so far of the chapter.",
    )
    expect_close(
        "the output for a window longer than the sequence", call(fn, x, 10),
        _reference_average(x),
        hint="A window larger than T must not break anything: it is the average so far.",
    )
    passed("each token averages itself and the window - 1 tokens before it.")


_RECENCY = torch.tensor([[1.0, 0.0, 0.0], [1 / 3, 2 / 3, 0.0], [1 / 7, 2 / 7, 4 / 7]],
                        dtype=torch.float64)


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_recency_weights(fn) -> None:
    """Check the predicted (3, 3) weights of a causal softmax with scores ``s * ln 2``.

    The prediction is accepted within 0.002 of the exact weights (four decimals by hand).

    Taught in chapter 1.
    """
    value = call(fn, prop="predicted_weights() runs without an error")
    try:
        weights = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        fail("your prediction is a table of numbers", expected="a (3, 3) nested list or tensor",
             actual=type(value).__name__,
             hint="Return a list of three rows of three numbers, e.g. [[1.0, 0.0, 0.0], ...].")
    expect_shape("your predicted weights", weights, (3, 3),
                 hint="Give one row per query (tokens 0, 1, 2) and one column per key.")

    def matches(table) -> bool:
        return torch.allclose(weights, torch.as_tensor(table, dtype=torch.float64), atol=2e-3)

    hints = [
        ([[1 / 7, 2 / 7, 4 / 7]] * 3,
         "The mask still applies: token t sees only keys 0 ... t, so token 0 can only look at "
         "itself and the weights above the diagonal are 0."),
        ([[1, 0, 0], [2 / 3, 1 / 3, 0], [4 / 7, 2 / 7, 1 / 7]],
         "A larger score gets a larger weight, and here the latest key has the largest score."),
        ([[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]],
         "These are the weights of the plain average, whose scores were all zero; the scores "
         "now grow with the key's position."),
        ([[1, 0, 0], [0, 1, 0], [0, 1 / 3, 2 / 3]],
         "The softmax exponentiates every score before it normalises: a score of s ln 2 "
         "becomes e^(s ln 2), not s ln 2."),
        ([[1, 0, 0], [1, 2, 0], [1, 2, 4]],
         "The softmax divides each row by its sum, so that every row sums to 1."),
    ]
    for table, hint in hints:
        if matches(table):
            fail("your weights are the causal softmax of the scores s ln 2",
                 expected="the weights of the masked softmax", actual=weights.tolist(),
                 hint=hint)
    expect_true(
        "every weight above the diagonal is 0",
        bool((weights.triu(diagonal=1).abs() < 2e-3).all()),
        expected="0 wherever the key comes after the query", actual=weights.tolist(),
        hint="The causal mask puts -inf on those scores, and e^(-inf) = 0.",
    )
    expect_true(
        "every row of your weights sums to 1",
        bool(torch.allclose(weights.sum(dim=-1), torch.ones(3, dtype=torch.float64), atol=3e-3)),
        expected="row sums 1, 1, 1", actual=[round(v, 4) for v in weights.sum(dim=-1).tolist()],
        hint="The softmax divides each row by its sum.",
    )
    expect_close("your predicted weights", weights, _RECENCY, atol=2e-3, rtol=0,
                 hint="Row t holds e^(s ln 2) for each key s <= t, divided by the sum of the row.")
    passed("each token weighs the key s in proportion to 2^s among the keys it may see: "
           "an average that favours recent tokens.")


@checker
def check_offset_matrix(fn) -> None:
    """Check ``fn(offset, d_model)`` maps the encoding of position p to that of p + offset.

    Taught in chapter 1.
    """
    d_model, offset = 8, 3
    matrix = call(fn, offset, d_model)
    expect_shape("the offset matrix", matrix, (d_model, d_model),
                 hint="Return a square (d_model, d_model) matrix.")
    matrix = matrix.detach().to(torch.float64)
    encoding = _encoding(40, d_model)  # (40, d_model)
    moved = encoding[:-offset] @ matrix.T  # (40 - offset, d_model)
    if torch.allclose(encoding[offset:] @ matrix.T, encoding[:-offset], atol=1e-4):
        fail("M @ PE(p) equals PE(p + 3)", expected="every position moved forward by 3",
             actual="every position moved back by 3",
             hint="Your rotation turns the wrong way: flip the sign of the two sin entries in "
                  "each 2 x 2 block (sin(a + b) = sin a cos b + cos a sin b).")
    wrong_frequencies = _encoding(40, d_model, pair_step=1)
    if torch.allclose(wrong_frequencies[:-offset] @ matrix.T, wrong_frequencies[offset:],
                      atol=1e-4):
        fail("M @ PE(p) equals PE(p + 3)", expected="the angle offset * 10000^(-2i / d_model)",
             actual="the angle offset * 10000^(-i / d_model)",
             hint="Pair i holds dimensions 2i and 2i + 1, and its frequency is "
                  "10000^(-2i / d_model): the exponent uses 2i, the first of the pair's dims.")
    expect_close(
        "the moved encodings PE(p) @ M^T for offset=3, d_model=8", moved, encoding[offset:],
        hint="Each 2 x 2 block rotates (sin a, cos a) into (sin(a + b), cos(a + b)); write "
             "both angle-sum formulas and read off the four entries.",
        atol=1e-4, rtol=1e-4,
    )
    for offset, d_model in ((1, 4), (7, 16)):
        matrix = call(fn, offset, d_model)
        encoding = _encoding(30, d_model)  # (30, d_model)
        moved = encoding[:-offset] @ matrix.detach().to(torch.float64).T
        expect_close(
            f"the positions moved by the matrix for offset={offset}, d_model={d_model}", moved,
            encoding[offset:],
            hint="The angle of pair i is offset * 10000^(-2i / d_model); use d_model and offset "
                 "from the arguments, not fixed numbers.",
            atol=1e-4, rtol=1e-4,
        )
    expect_close(
        "the matrix for offset 0", call(fn, 0, 6).detach().to(torch.float64),
        torch.eye(6, dtype=torch.float64),
        hint="With offset 0 every rotation angle is 0, so M is the identity.", atol=1e-6,
    )
    passed("one fixed matrix moves every position forward by the offset: a rotation per pair.")
