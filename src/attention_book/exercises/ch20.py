"""Checkers for chapter 20's exercises (writing the attention kernel in Triton): the loop
bounds of a causal kernel whose key tiles are not its query tiles (a variant), the offset of
the key row a query head reads when the keys lie in the (B, T, H_kv, d) layout (a variant), a
kernel that leaks the keys past the end of the last tile (a bug hunt) and a kernel's TFLOP/s
predicted from its bytes and FLOPs (a prediction).

None of them imports Triton: an answer's kernel runs wherever the answer runs.

Taught in chapter 20.
"""

from __future__ import annotations

import math
import numbers

import torch

from .feedback import call, checker, expect_int, expect_shape, expect_true, fail, passed

__all__ = [
    "check_causal_key_range",
    "check_key_row_offset",
    "check_attention_any_length",
    "check_predicted_tflops",
]


# --------------------------------------------------------------------------- 20.1 loop bounds

# (start_m, block_m, block_n, num_tokens): key tiles larger than, equal to and smaller than the
# query tiles, first and last blocks, lengths that are and are not a multiple of either tile.
_RANGE_CASES = ((0, 16, 64, 200), (1, 16, 64, 200), (5, 16, 64, 200), (12, 16, 64, 200),
                (4, 16, 64, 70), (3, 32, 128, 300), (9, 32, 128, 300), (2, 64, 64, 192),
                (2, 64, 64, 150), (3, 128, 32, 500), (0, 128, 32, 100), (6, 16, 32, 100),
                (7, 32, 16, 500), (0, 128, 32, 40), (1, 64, 16, 70))


def _tiles(start: int, end: int, block_n: int) -> list[int]:
    return list(range(start, end, block_n))


@checker
def check_causal_key_range(fn) -> None:
    """Check ``fn(start_m, block_m, block_n, num_tokens)`` gives a causal kernel's key loop.

    It returns ``(full_end, masked_end)``: the kernel runs the key tiles starting at
    ``0, block_n, …`` below ``full_end`` without a mask and those from ``full_end`` below
    ``masked_end`` with the causal mask. The check looks at the tiles that loop visits: every
    key a query of the block sees is in one, no tile lies wholly after the block's last query,
    the unmasked tiles are seen whole by every query of the block, and the first masked tile
    is not (else it could have run unmasked).

    Args:
        fn: the learner's ``causal_key_range``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 20.
    """
    for start_m, block_m, block_n, num_tokens in _RANGE_CASES:
        args = f"causal_key_range({start_m}, {block_m}, {block_n}, {num_tokens})"
        result = call(fn, start_m, block_m, block_n, num_tokens)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            fail(f"{args} returns two numbers", expected="(full_end, masked_end)",
                 actual=type(result).__name__ if not isinstance(result, (tuple, list))
                 else f"{len(result)} values",
                 hint="Return a pair: where the unmasked tiles end and where the loop stops.",
                 reveal=True)
        full_end, masked_end = result
        for name, value in (("full_end", full_end), ("masked_end", masked_end)):
            expect_int(f"{name} of {args}", value,
                       "Key positions are whole numbers: compute them with // and *, not /.")
        first_query = start_m * block_m
        last_query = min(first_query + block_m, num_tokens) - 1
        unmasked = _tiles(0, full_end, block_n)
        masked = _tiles(full_end, masked_end, block_n)
        expect_true(f"{args}: full_end is a multiple of block_n", full_end % block_n == 0,
                    expected=f"a multiple of {block_n}", actual=full_end,
                    hint="The loop without the mask visits whole tiles of block_n keys from key "
                         "0: where it stops must be a tile boundary.")
        for tile in unmasked:
            if tile + block_n - 1 > first_query:
                fail(f"{args}: every query of the block sees the whole of each unmasked tile",
                     expected=f"keys {tile}..{tile + block_n - 1} all at or before query "
                              f"{first_query}",
                     actual=f"query {first_query} runs the tile without a mask, but must not "
                            f"see key {tile + block_n - 1}",
                     hint="A tile may skip the mask only when even the block's first query "
                          "sees all its keys: the unmasked tiles must end at or before that "
                          "query's position.")
        visited = set(unmasked) | set(masked)
        for key in range(last_query + 1):
            if key - key % block_n not in visited:
                fail(f"{args}: the loop visits every key a query of the block sees",
                     expected=f"key {key} (seen by query {last_query}) in a visited tile",
                     actual=f"the tile of keys {key - key % block_n}.."
                            f"{key - key % block_n + block_n - 1} is never loaded",
                     hint="The block's last query is at min(start_m * block_m + block_m, "
                          "num_tokens) - 1 and sees every key up to its own position: the "
                          "loop must reach it.")
        for tile in masked:
            if tile > last_query:
                fail(f"{args}: no visited tile lies wholly after the block's last query",
                     expected=f"tiles starting at or before key {last_query}",
                     actual=f"the tile of keys {tile}..{tile + block_n - 1} is computed and "
                            "then hidden entirely",
                     hint="The causal loop stops after the last key the block's last query "
                          "sees; remember that the last block may stop at num_tokens.")
        if masked and masked[0] + block_n - 1 <= first_query:
            fail(f"{args}: the first masked tile needs the mask",
                 expected=f"full_end past key {masked[0]}",
                 actual=f"the tile of keys {masked[0]}..{masked[0] + block_n - 1} is masked, "
                        f"though query {first_query} and every later one sees all of it",
                 hint="Every tile that the block's first query sees whole can run in the "
                      "loop without a mask, which costs less on a GPU: let full_end grow to "
                      "the last such tile boundary.")
    passed("the unmasked loop covers the whole tiles before the block's first query, "
           "(start_m * block_m) // block_n * block_n, and the masked loop runs up to the block's "
           "last query, min((start_m + 1) * block_m, num_tokens). With block_n > block_m the "
           "masked loop starts before the block: one tile holds keys of several query blocks.")


# --------------------------------------------------------------------------- 20.2 grouped heads

_OFFSET_CASES = ((0, 0, 0, 8, 2, 16, 32), (1, 1, 3, 8, 2, 16, 32), (0, 6, 2, 8, 4, 5, 16),
                 (1, 5, 3, 8, 2, 16, 32), (2, 7, 15, 8, 2, 16, 32),
                 (0, 3, 9, 4, 4, 12, 16), (1, 5, 0, 6, 3, 5, 64), (3, 11, 4, 12, 1, 7, 128),
                 (2, 2, 6, 6, 2, 9, 16))


def _offset(batch, head, position, num_heads, num_kv_heads, num_tokens, head_dim, *,
            kv_head=None, kv_stride=None, layout="bthd"):
    group = num_heads // num_kv_heads
    kv_head = head // group if kv_head is None else kv_head
    kv_stride = num_kv_heads if kv_stride is None else kv_stride
    if layout == "bhtd":
        return ((batch * kv_stride + kv_head) * num_tokens + position) * head_dim
    return ((batch * num_tokens + position) * kv_stride + kv_head) * head_dim


@checker
def check_key_row_offset(fn) -> None:
    """Check ``fn(batch, query_head, position, num_heads, num_kv_heads, num_tokens, head_dim)``.

    It returns where, counted in elements from the start of a contiguous ``(B, T, H_kv,
    head_dim)`` key tensor, begins the key row that query head ``query_head`` of sequence
    ``batch`` reads at ``position``: query head ``h`` shares key head ``h // (H / H_kv)``.
    The expected offsets are read off a real tensor (``torch.arange`` reshaped).

    Args:
        fn: the learner's ``key_row_offset``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 20.
    """
    for case in _OFFSET_CASES:
        batch, head, position, num_heads, num_kv_heads, num_tokens, head_dim = case
        keys = torch.arange(4 * num_tokens * num_kv_heads * head_dim).reshape(
            4, num_tokens, num_kv_heads, head_dim)  # (B, T, H_kv, head_dim), entry = its offset
        expected = int(keys[batch, position, head // (num_heads // num_kv_heads), 0])
        args = f"key_row_offset{case}"
        actual = call(fn, *case)
        expect_int(args, actual, "An offset counts elements: a whole number, built with * and +.")
        if actual == expected:
            continue
        prop = f"{args} is where that key row starts"
        group = num_heads // num_kv_heads
        slips = {
            _offset(*case, kv_head=head % num_kv_heads):
                "You paired the heads round-robin (query head h with key head h % H_kv). "
                "Grouped-query attention gives each key head a run of consecutive query "
                "heads: h // (H / H_kv).",
            _offset(*case, kv_head=head, kv_stride=num_heads):
                "You indexed the keys as if every query head had its own: the tensor holds "
                "H_kv heads, so the heads' stride is H_kv * head_dim, and query head h reads "
                "key head h // (H / H_kv).",
            _offset(*case, kv_stride=num_heads):
                "The right key head, but the stride of a position counts H heads: this "
                "tensor holds only H_kv heads per position.",
            _offset(*case, layout="bhtd"):
                "That is the offset in the (B, H_kv, T, head_dim) layout of the chapter. Here "
                "the keys lie as (B, T, H_kv, head_dim): next to one position's heads comes "
                "the next position.",
            _offset(*case, kv_head=head // num_kv_heads) if group != num_kv_heads else None:
                "The group size is H / H_kv, not H_kv: query head h reads key head "
                "h // (H / H_kv).",
        }
        hint = slips.get(actual, "Write the strides of a contiguous (B, T, H_kv, head_dim) "
                                 "tensor (the last dim has stride 1), then add batch, position "
                                 "and the key head, each times its stride.")
        fail(prop, expected=expected, actual=actual, hint=hint)
    passed("with the keys as (B, T, H_kv, head_dim) the strides are T * H_kv * d, H_kv * d, d "
           "and 1, and query head h reads key head h // (H / H_kv): a kernel reaches the shared "
           "keys by arithmetic on its program id, without copying them H / H_kv times.")


# --------------------------------------------------------------------------- 20.3 bug hunt


def _attention(query, key, value):
    """Float64 attention of float32 inputs, back in float32."""
    scores = query.double() @ key.double().transpose(-2, -1) / math.sqrt(query.size(-1))
    return (torch.softmax(scores, dim=-1) @ value.double()).float()


def _leaky_attention(query, key, value, block_n):
    """What a kernel computes when the keys past the end of the last tile score 0 (value 0)."""
    num_tokens = key.size(-2)
    padded = -(-num_tokens // block_n) * block_n
    key = torch.nn.functional.pad(key, (0, 0, 0, padded - num_tokens))
    value = torch.nn.functional.pad(value, (0, 0, 0, padded - num_tokens))
    return _attention(query, key, value)


# (batch, heads, T, head_dim): T a multiple of every tile first, then lengths that are not.
_ATTENTION_CASES = ((1, 2, 64, 16), (1, 2, 50, 16), (2, 1, 17, 32), (1, 3, 100, 16),
                    (1, 1, 1, 16))


@checker
def check_attention_any_length(fn) -> None:
    """Check ``fn(query, key, value)`` is attention for any length T.

    Lengths that are a multiple of every tile size come first, then lengths that are not;
    an answer right only on the first gets the hint about the last tile.

    Args:
        fn: the learner's ``attention_any_length``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 20.
    """
    generator = torch.Generator().manual_seed(20)
    even_ok = False
    for batch, heads, num_tokens, head_dim in _ATTENTION_CASES:
        query, key, value = (torch.randn(batch, heads, num_tokens, head_dim, generator=generator)
                             for _ in range(3))
        shape = (batch, heads, num_tokens, head_dim)
        output = call(fn, query.clone(), key.clone(), value.clone())
        expect_shape(f"attention_any_length's output for T = {num_tokens}", output, shape,
                     hint="Return the (B, H, T, head_dim) output, one row per query.")
        output = output.detach().to("cpu", torch.float32)
        expected = _attention(query, key, value)
        error = float((output - expected).abs().max())
        if error <= 1e-4:
            even_ok = even_ok or num_tokens % 64 == 0
            continue
        prop = f"attention_any_length equals attention for T = {num_tokens}"
        leaks = [block for block in (16, 32, 64, 128) if num_tokens % block and float(
            (output - _leaky_attention(query, key, value, block)).abs().max()) <= 1e-4]
        if leaks:
            fail(prop, expected="the softmax over the T real keys",
                 actual=f"the softmax over {-(-num_tokens // leaks[0]) * leaks[0]} keys: the "
                        f"last tile's {-num_tokens % leaks[0]} places past the end joined in "
                        "with score 0",
                 hint="The loads of the last tile read 0 for the keys past the end, but their "
                      "scores still enter the row's maximum and sum. Give those scores -inf "
                      "before the softmax: which axis of the tile are the keys?")
        if even_ok:
            fail(prop, expected="the same results for every length",
                 actual=f"right when T is a multiple of 64, off by {error:.3g} for "
                        f"T = {num_tokens}",
                 hint="Only a length that does not fill the last tile exposes this bug: look "
                      "at what the kernel does with the positions past T in its last tile of "
                      "keys.")
        fail(prop, expected="within 1e-4 of attention", actual=f"off by {error:.3g}",
             hint="Compare your kernel with the colleague's line by line on T = 64 first; "
                  "it must give softmax(Q K^T / sqrt(head_dim)) V.")
    passed("the kernel hides the keys past the end of its last tile, so every length gives "
           "attention, not only lengths that fill whole tiles. A test at T = 64 alone could "
           "never have shown the bug.")


# --------------------------------------------------------------------------- 20.4 prediction

#: The GPU and the kernel of Exercise 20.4.
H100_TFLOPS, H100_TB_PER_S = 989.0, 3.35
PREDICTION_BLOCK_M, PREDICTION_BLOCK_N, PREDICTION_HEAD_DIM = 64, 32, 128


def _roofline() -> float:
    """TFLOP/s: the smaller of the peak and (FLOPs per byte of one step) x bandwidth."""
    flops = 4 * PREDICTION_BLOCK_M * PREDICTION_BLOCK_N * PREDICTION_HEAD_DIM  # two products
    moved = 2 * PREDICTION_BLOCK_N * PREDICTION_HEAD_DIM * 2  # a key and a value tile, bf16
    return min(H100_TFLOPS, flops / moved * H100_TB_PER_S)


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_tflops(fn) -> None:
    """Check ``fn()`` predicts the roofline bound of Exercise 20.4's kernel, in TFLOP/s.

    Args:
        fn: the learner's ``predicted_tflops``.

    Returns:
        True when the prediction is within 2% (the decorator prints the feedback).

    Taught in chapter 20.
    """
    prediction = call(fn)
    if isinstance(prediction, bool) or not isinstance(prediction, numbers.Real):
        fail("your prediction is a number", expected="a number of TFLOP/s, such as 123.4",
             actual=type(prediction).__name__, hint="Return a float (or an int).", reveal=True)
    prediction = float(prediction)
    expected = _roofline()
    if abs(prediction - expected) <= 0.02 * expected:
        passed(f"each tile does 4 * {PREDICTION_BLOCK_M} * {PREDICTION_BLOCK_N} * "
               f"{PREDICTION_HEAD_DIM} FLOPs for 2 * {PREDICTION_BLOCK_N} * "
               f"{PREDICTION_HEAD_DIM} * 2 bytes: {PREDICTION_BLOCK_M} FLOP per byte, whatever "
               f"block_n and head_dim are, below the H100's ridge of "
               f"{H100_TFLOPS / H100_TB_PER_S:.0f}. So the bound is {PREDICTION_BLOCK_M} x "
               f"{H100_TB_PER_S} TB/s = {expected:.1f} TFLOP/s, memory-bound: a larger block_m, "
               "or the L2 cache, is what lifts it.")
        return
    slips = {  # (what the answer equals, the hint)
        H100_TFLOPS: "That is the GPU's peak: it holds only when the kernel does enough work per "
                     "byte. Compare the kernel's FLOPs per byte with the ridge point "
                     "(peak / bandwidth).",
        2 * expected: "Your number is twice the bound: each step loads a tile of keys and a tile "
                      "of values, each number 2 bytes (bfloat16).",
        expected / 2: "Your number is half the bound: count both products of a step (Q K^T and "
                      "P V, 2 FLOPs per multiply-add), and 2 bytes (not 4) per bfloat16 number.",
        8 * expected: "Bytes, not bits: the bandwidth is in bytes per second.",
        4 * expected: "Your number is four times the bound: count the bytes of both tiles a step "
                      "loads, 2 bytes per number.",
    }
    hint = next((text for value, text in slips.items()
                 if abs(prediction - value) <= 0.02 * value), None)
    fail("your prediction is the kernel's roofline bound (within 2%)",
         expected="the bound your count gives", actual=round(prediction, 1),
         hint=hint or "Count one step of the loop: the FLOPs of its two products and the bytes "
                      "of the tiles it loads from HBM. Their ratio is the kernel's FLOPs per "
                      "byte; the bound is the smaller of the peak and that ratio times the "
                      "bandwidth.")
