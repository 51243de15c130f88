"""The Triton kernels behind :func:`attention_book.triton_attention.flash_attention`.

Chapter 20 builds these kernels one idea at a time; this file holds the finished ones. It is
imported twice by :mod:`attention_book.triton_attention`, never directly: once as GPU kernels
(``triton.jit``) and once with Triton's interpreter switched on, so that each copy's kernels
call helpers of their own kind and a CPU tensor can run through the interpreter in the same
process as a CUDA tensor runs natively.

Layout: every tensor is ``(B, heads, T, head_dim)`` with a last stride of 1; the kernels get
the three other strides. Query head ``h`` reads key/value head ``h // group`` (grouped-query
attention by index arithmetic, without copying the keys). Scores are computed in base 2:
``qk_scale = scale * log2(e)`` is folded into one multiplication, so ``exp2`` replaces ``exp``.
The log-sum-exp is stored in natural units, float32, one per query row.

Not part of the public API: see :mod:`attention_book.triton_attention`.
"""

import triton
import triton.language as tl

# Kernels may read a global only when it is a constexpr.
LOG2_E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * log2(e))
LN_2 = tl.constexpr(0.6931471805599453)  # ln(2): a base-2 logarithm times ln(2) is the natural one


@triton.jit
def _attend_tiles(acc, row_sum, row_max, q, key_base, value_base, stride_kt, stride_vt,
                  start, end, offs_m, num_keys, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                  MASKED: tl.constexpr, USE_EXP2: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the key tiles ``start … end`` into one query block's online softmax.

    ``MASKED`` tiles may hold hidden scores (the causal diagonal, or keys past the end);
    the others are visible whole, so they need neither a mask nor a bounds check.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n  # (BLOCK_N,) positions of this tile's keys
        key_ptrs = key_base + keys[:, None] * stride_kt + offs_d[None, :]
        value_ptrs = value_base + keys[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            inside = keys[:, None] < num_keys  # (BLOCK_N, 1): the last tile may be ragged
            k = tl.load(key_ptrs, mask=inside, other=0.0)  # (BLOCK_N, HEAD_DIM)
            v = tl.load(value_ptrs, mask=inside, other=0.0)
        else:
            k = tl.load(key_ptrs)
            v = tl.load(value_ptrs)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        if MASKED:
            visible = keys[None, :] < num_keys  # (1, BLOCK_N)
            if IS_CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None])  # (BLOCK_M, BLOCK_N)
            scores = tl.where(visible, scores, float("-inf"))
        # Every row has seen key 0 by now (the first tile holds it), so new_max is finite.
        new_max = tl.maximum(row_max, tl.max(scores, 1))  # (BLOCK_M,)
        if USE_EXP2:
            rescale = tl.exp2(row_max - new_max)
            p = tl.exp2(scores - new_max[:, None])  # (BLOCK_M, BLOCK_N)
        else:
            rescale = tl.exp(row_max - new_max)
            p = tl.exp(scores - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def attention_forward_kernel(
        query_ptr, key_ptr, value_ptr, output_ptr, lse_ptr,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
        stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
        num_heads, group, num_queries, num_keys, scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IS_CAUSAL: tl.constexpr, USE_EXP2: tl.constexpr, SPLIT_MASKED: tl.constexpr,
        PRECISION: tl.constexpr):
    """One program: one block of BLOCK_M queries of one (batch, head), all its keys."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    start_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)
    head = batch_head % num_heads
    kv_head = (head // group).to(tl.int64)  # grouped heads: no copy of the keys
    head = head.to(tl.int64)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    offs_d = tl.arange(0, HEAD_DIM)
    query_base = query_ptr + batch * stride_qb + head * stride_qh
    key_base = key_ptr + batch * stride_kb + kv_head * stride_kh
    value_base = value_ptr + batch * stride_vb + kv_head * stride_vh
    row_inside = offs_m[:, None] < num_queries  # (BLOCK_M, 1)
    q = tl.load(query_base + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_inside,
                other=0.0)  # (BLOCK_M, HEAD_DIM): stays in registers for the whole loop

    qk_scale = scale * LOG2_E if USE_EXP2 else scale
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)

    if IS_CAUSAL:  # num_queries == num_keys
        full_end = start_m * BLOCK_M  # keys before the block's first query: all visible
        masked_end = tl.minimum((start_m + 1) * BLOCK_M, num_keys)  # the diagonal; later: skipped
    else:
        full_end = num_keys // BLOCK_N * BLOCK_N  # whole tiles
        masked_end = num_keys  # the ragged last tile, if any
    if SPLIT_MASKED:
        acc, row_sum, row_max = _attend_tiles(
            acc, row_sum, row_max, q, key_base, value_base, stride_kt, stride_vt,
            0, full_end, offs_m, num_keys, qk_scale, HEAD_DIM, BLOCK_N, IS_CAUSAL,
            False, USE_EXP2, PRECISION)
        acc, row_sum, row_max = _attend_tiles(
            acc, row_sum, row_max, q, key_base, value_base, stride_kt, stride_vt,
            full_end, masked_end, offs_m, num_keys, qk_scale, HEAD_DIM, BLOCK_N, IS_CAUSAL,
            True, USE_EXP2, PRECISION)
    else:  # one loop that masks every tile: the plain kernel, kept for the measurements
        acc, row_sum, row_max = _attend_tiles(
            acc, row_sum, row_max, q, key_base, value_base, stride_kt, stride_vt,
            0, masked_end, offs_m, num_keys, qk_scale, HEAD_DIM, BLOCK_N, IS_CAUSAL,
            True, USE_EXP2, PRECISION)

    acc = acc / row_sum[:, None]
    if USE_EXP2:
        lse = (row_max + tl.log2(row_sum)) * LN_2
    else:
        lse = row_max + tl.log(row_sum)
    output_ptrs = output_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_ot
    tl.store(output_ptrs + offs_d[None, :], acc.to(output_ptr.dtype.element_ty), mask=row_inside)
    tl.store(lse_ptr + batch_head.to(tl.int64) * num_queries + offs_m, lse,
             mask=offs_m < num_queries)


@triton.jit
def backward_preprocess_kernel(output_ptr, grad_output_ptr, delta_ptr,
                               stride_ob, stride_oh, stride_ot, stride_gb, stride_gh, stride_gt,
                               num_heads, num_queries,
                               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """D = rowsum(dO * O), one float32 per query row: the term every dS shares."""
    start_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)
    head = (batch_head % num_heads).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    inside = offs_m[:, None] < num_queries
    o = tl.load(output_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_ot
                + offs_d[None, :], mask=inside, other=0.0).to(tl.float32)
    do = tl.load(grad_output_ptr + batch * stride_gb + head * stride_gh
                 + offs_m[:, None] * stride_gt + offs_d[None, :], mask=inside,
                 other=0.0).to(tl.float32)
    tl.store(delta_ptr + batch_head.to(tl.int64) * num_queries + offs_m, tl.sum(o * do, 1),
             mask=offs_m < num_queries)


@triton.jit
def _key_block_gradients(dk, dv, k, v, query_base, grad_output_base, lse_base, delta_base,
                         stride_qt, stride_gt, start, end, offs_n, num_queries, qk_scale,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                         PRECISION: tl.constexpr):
    """Add the query blocks ``start … end`` of one head to a key block's dK and dV.

    Works on transposed tiles (keys along the rows), so that dK and dV accumulate by rows.
    A query row past the end reads log-sum-exp +inf, so its weights are 0.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(start, end, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        queries = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        inside = queries < num_queries
        q = tl.load(query_base + queries[:, None] * stride_qt + offs_d[None, :],
                    mask=inside[:, None], other=0.0)  # (BLOCK_M, HEAD_DIM)
        do = tl.load(grad_output_base + queries[:, None] * stride_gt + offs_d[None, :],
                     mask=inside[:, None], other=0.0)
        lse = tl.load(lse_base + queries, mask=inside, other=float("inf")) * LOG2_E
        delta = tl.load(delta_base + queries, mask=inside, other=0.0)
        scores_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M)
        p_t = tl.exp2(scores_t - lse[None, :])  # P^T, recomputed from the saved log-sum-exp
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= queries[None, :], p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)  # (BLOCK_N, HEAD_DIM)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)  # (BLOCK_N, HEAD_DIM)
    return dk, dv


@triton.jit
def backward_dkdv_kernel(
        query_ptr, key_ptr, value_ptr, grad_output_ptr, lse_ptr, delta_ptr,
        grad_key_ptr, grad_value_ptr,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
        stride_vb, stride_vh, stride_vt, stride_gb, stride_gh, stride_gt,
        stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
        num_heads, num_kv_heads, group, num_queries, num_keys, scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One program: one block of BLOCK_N keys of one (batch, key/value head); its dK and dV.

    The loop runs over every query head of the key's group and every query block that sees
    the keys, so each dK and dV row is written once, by one program, without atomics.
    """
    tl.static_assert(BLOCK_N % BLOCK_M == 0)
    start_n = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch = (batch_kv_head // num_kv_heads).to(tl.int64)
    kv_head = (batch_kv_head % num_kv_heads).to(tl.int64)

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
    offs_d = tl.arange(0, HEAD_DIM)
    key_inside = offs_n[:, None] < num_keys
    k = tl.load(key_ptr + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kt
                + offs_d[None, :], mask=key_inside, other=0.0)  # (BLOCK_N, HEAD_DIM)
    v = tl.load(value_ptr + batch * stride_vb + kv_head * stride_vh
                + offs_n[:, None] * stride_vt + offs_d[None, :], mask=key_inside, other=0.0)
    dk = tl.full([BLOCK_N, HEAD_DIM], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, HEAD_DIM], 0.0, tl.float32)
    qk_scale = scale * LOG2_E

    if IS_CAUSAL:  # num_queries == num_keys
        diagonal_start = start_n * BLOCK_N  # the first query that sees the block's first key
        diagonal_end = tl.minimum((start_n + 1) * BLOCK_N, num_queries)
    else:
        diagonal_start = 0
        diagonal_end = 0
    for member in range(0, group):
        head = kv_head * group + member
        row = (batch * num_heads + head) * num_queries  # this head's log-sum-exp and D
        query_base = query_ptr + batch * stride_qb + head * stride_qh
        grad_output_base = grad_output_ptr + batch * stride_gb + head * stride_gh
        dk, dv = _key_block_gradients(
            dk, dv, k, v, query_base, grad_output_base, lse_ptr + row, delta_ptr + row,
            stride_qt, stride_gt, diagonal_start, diagonal_end, offs_n, num_queries, qk_scale,
            HEAD_DIM, BLOCK_M, True, PRECISION)
        dk, dv = _key_block_gradients(
            dk, dv, k, v, query_base, grad_output_base, lse_ptr + row, delta_ptr + row,
            stride_qt, stride_gt, diagonal_end, num_queries, offs_n,
            num_queries, qk_scale, HEAD_DIM, BLOCK_M, False, PRECISION)

    dk = dk * scale
    tl.store(grad_key_ptr + batch * stride_dkb + kv_head * stride_dkh
             + offs_n[:, None] * stride_dkt + offs_d[None, :],
             dk.to(grad_key_ptr.dtype.element_ty), mask=key_inside)
    tl.store(grad_value_ptr + batch * stride_dvb + kv_head * stride_dvh
             + offs_n[:, None] * stride_dvt + offs_d[None, :],
             dv.to(grad_value_ptr.dtype.element_ty), mask=key_inside)


@triton.jit
def _query_block_gradient(dq, q, do, lse, delta, key_base, value_base, stride_kt, stride_vt,
                          start, end, offs_m, num_keys, qk_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                          MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Add the key tiles ``start … end`` to a query block's dQ."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        key_ptrs = key_base + keys[:, None] * stride_kt + offs_d[None, :]
        value_ptrs = value_base + keys[:, None] * stride_vt + offs_d[None, :]
        if MASKED:
            inside = keys[:, None] < num_keys
            k = tl.load(key_ptrs, mask=inside, other=0.0)  # (BLOCK_N, HEAD_DIM)
            v = tl.load(value_ptrs, mask=inside, other=0.0)
        else:
            k = tl.load(key_ptrs)
            v = tl.load(value_ptrs)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        p = tl.exp2(scores - lse[:, None])
        if MASKED:
            visible = keys[None, :] < num_keys
            if IS_CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)  # (BLOCK_M, HEAD_DIM)
    return dq


@triton.jit
def backward_dq_kernel(
        query_ptr, key_ptr, value_ptr, grad_output_ptr, lse_ptr, delta_ptr, grad_query_ptr,
        stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
        stride_vb, stride_vh, stride_vt, stride_gb, stride_gh, stride_gt,
        stride_dqb, stride_dqh, stride_dqt,
        num_heads, group, num_queries, num_keys, scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One program: one block of BLOCK_M queries of one (batch, head); its dQ."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    start_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)
    head = batch_head % num_heads
    kv_head = (head // group).to(tl.int64)
    head = head.to(tl.int64)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_inside = offs_m < num_queries
    row = batch_head.to(tl.int64) * num_queries
    q = tl.load(query_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qt
                + offs_d[None, :], mask=row_inside[:, None], other=0.0)
    do = tl.load(grad_output_ptr + batch * stride_gb + head * stride_gh
                 + offs_m[:, None] * stride_gt + offs_d[None, :], mask=row_inside[:, None],
                 other=0.0)
    lse = tl.load(lse_ptr + row + offs_m, mask=row_inside, other=float("inf")) * LOG2_E
    delta = tl.load(delta_ptr + row + offs_m, mask=row_inside, other=0.0)
    dq = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)
    qk_scale = scale * LOG2_E
    key_base = key_ptr + batch * stride_kb + kv_head * stride_kh
    value_base = value_ptr + batch * stride_vb + kv_head * stride_vh

    if IS_CAUSAL:
        full_end = start_m * BLOCK_M
        masked_end = tl.minimum((start_m + 1) * BLOCK_M, num_keys)
    else:
        full_end = num_keys // BLOCK_N * BLOCK_N
        masked_end = num_keys
    dq = _query_block_gradient(dq, q, do, lse, delta, key_base, value_base, stride_kt, stride_vt,
                               0, full_end, offs_m, num_keys, qk_scale, HEAD_DIM, BLOCK_N,
                               IS_CAUSAL, False, PRECISION)
    dq = _query_block_gradient(dq, q, do, lse, delta, key_base, value_base, stride_kt, stride_vt,
                               full_end, masked_end, offs_m, num_keys, qk_scale, HEAD_DIM,
                               BLOCK_N, IS_CAUSAL, True, PRECISION)
    dq = dq * scale
    tl.store(grad_query_ptr + batch * stride_dqb + head * stride_dqh
             + offs_m[:, None] * stride_dqt + offs_d[None, :],
             dq.to(grad_query_ptr.dtype.element_ty), mask=row_inside[:, None])
