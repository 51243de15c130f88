"""Context parallelism (chapter 17): all-gather, ring and Ulysses attention on real gloo ranks.

Starting rank processes is the slow part (each imports torch), so one start of 4 ranks runs
every case: on the whole world (P = 4) and, at the same time, on subgroups of 2, 3 and 1
ranks. Two more starts of 2 ranks test run_on_ranks itself: a failing rank and a timeout.
"""

from __future__ import annotations

import os
import pickle
import time

import pytest
import torch
import torch.nn.functional as F

from attention_book.distributed import (
    LAYOUTS,
    AttentionCase,
    RankFailed,
    allgather_kv_attention,
    count_traffic,
    ring_attention,
    run_attention_cases,
    run_on_ranks,
    shard,
    shard_positions,
    simulate_ring_attention,
    ulysses_attention,
    unshard,
)

B, H, T, D, D_V = 1, 12, 24, 4, 3
TOLERANCE = 1e-10
PARTITIONS = {  # how the 4 ranks are grouped: every group runs the case at the same time
    4: None,
    2: ((0, 2), (1, 3)),
    31: ((0, 1, 2), (3,)),  # a group of 3 and a group of 1
}


def _inputs(seed: int = 0, heads: int = H, seq_len: int = T):
    torch.manual_seed(seed)
    query = torch.randn(B, heads, seq_len, D, dtype=torch.float64)
    key = torch.randn(B, heads, seq_len, D, dtype=torch.float64)
    value = torch.randn(B, heads, seq_len, D_V, dtype=torch.float64)
    grad_output = torch.randn(B, heads, seq_len, D_V, dtype=torch.float64)
    return query, key, value, grad_output


def _low_precision_inputs(seq_len: int = 256):
    """bfloat16 queries, keys and values of (1, 4, seq_len, 32), scores of order 1 to 10."""
    generator = torch.Generator().manual_seed(7)
    return tuple(torch.randn(1, 4, seq_len, 32, generator=generator).bfloat16() for _ in range(3))


def _cases():
    """(name, case) for every method, layout, mask and grouping, then the bad inputs."""
    query, key, value, grad_output = _inputs()
    cases = []
    for partition, subgroups in PARTITIONS.items():
        for method in ("allgather", "ring", "ulysses"):
            for layout in LAYOUTS:
                if method == "ulysses" and (layout == "zigzag" or partition == 31):
                    continue  # Ulysses: contiguous only; 12 heads over 3 ranks tested at P=4/2
                for is_causal in (False, True):
                    name = f"{method}-{layout}-{'causal' if is_causal else 'full'}-P{partition}"
                    cases.append((name, AttentionCase(method, query, key, value, is_causal,
                                                      layout, grad_output, subgroups)))
    # Grouped key/value heads: 12 query heads share 4 key/value heads (3 each).
    for method in ("allgather", "ring", "ulysses"):
        for layout in LAYOUTS:
            if method == "ulysses" and layout == "zigzag":
                continue
            cases.append((f"{method}-{layout}-causal-P4-gqa",
                          AttentionCase(method, query, key[:, :4], value[:, :4], True, layout,
                                        grad_output)))
    # 16-bit inputs, forward only: the error of the ring at P = 4 and P = 2 (issue 35).
    low_q, low_k, low_v = _low_precision_inputs()
    for partition in (4, 2):
        for layout in LAYOUTS:
            cases.append((f"bf16-ring-{layout}-causal-P{partition}",
                          AttentionCase("ring", low_q, low_k, low_v, True, layout, None,
                                        PARTITIONS[partition])))
    q6, k6, v6, _ = _inputs(heads=6)
    q10, k10, v10, _ = _inputs(seq_len=10)
    q12, k12, v12, _ = _inputs(seq_len=12)
    cases += [
        ("error-heads", AttentionCase("ulysses", q6, k6, v6, True)),
        ("error-uneven", AttentionCase("ring", q10, k10, v10, True)),
        ("error-zigzag", AttentionCase("allgather", q12, k12, v12, True, "zigzag")),
        ("error-dtype", AttentionCase("ring", query, key.float(), value)),
        ("error-kv-heads", AttentionCase("allgather", query, key[:, :5], value[:, :5])),
        ("error-ulysses-kv-heads", AttentionCase("ulysses", query, key[:, :2], value[:, :2])),
    ]
    return cases


CASES = _cases()
ERRORS = {
    "error-heads": "num_heads (6) must be divisible by world_size (4)",
    "error-uneven": "the ranks hold [3, 3, 2, 2] positions: a sequence of T = 10 is not "
                    "divisible by world_size = 4",
    "error-zigzag": "2 * world_size = 8 chunks, but T = 12 is not divisible by 8",
    "error-dtype": "must share a dtype",
    "error-kv-heads": "must share B and T, and key and value their H_kv heads, which must divide "
                      "the H query heads",
    "error-ulysses-kv-heads": "the 2 key/value heads must be divisible by world_size (4)",
}
_CHECKED = [i for i, (name, _) in enumerate(CASES) if not name.startswith(("error", "bf16"))]


@pytest.fixture(scope="module")
def four_ranks():
    """Every case on 4 gloo ranks, in one start of the processes; also its wall time."""
    start = time.perf_counter()
    results = run_on_ranks(run_attention_cases, 4, [case for _, case in CASES])
    return results, time.perf_counter() - start


def _groups(results, index):
    """The results of case ``index``, one list per group, each in group-rank order."""
    per_rank = [rank_results[index] for rank_results in results]
    groups = {}
    for result in per_rank:
        groups.setdefault(result.group_ranks, []).append(result)
    return [sorted(members, key=lambda r: r.rank) for members in groups.values()]


def _reference(case):
    query, key, value = (t.clone().requires_grad_() for t in (case.query, case.key, case.value))
    output = F.scaled_dot_product_attention(query, key, value, is_causal=case.is_causal,
                                            enable_gqa=True)
    output.backward(case.grad_output)
    return output.detach(), (query.grad, key.grad, value.grad)


def _shard_bytes(case, world_size):
    """Bytes of one rank's shard of the queries, keys, values and output."""
    local = case.query.size(2) // world_size

    def per_shard(tensor, features):
        return tensor.size(0) * tensor.size(1) * local * features * tensor.element_size()
    return (per_shard(case.query, D), per_shard(case.key, D), per_shard(case.value, D_V),
            per_shard(case.query, D_V))


def _expected_bytes(method, world_size, query_bytes, key_bytes, value_bytes, out_bytes):
    """(forward, backward) bytes each rank sends, by the formulas of chapter 17."""
    p = world_size
    if method == "allgather":  # keys and values to P - 1 ranks; back: a reduce-scatter
        return (p - 1) * (key_bytes + value_bytes), (p - 1) * (key_bytes + value_bytes)
    if method == "ring":  # P - 1 hops of K, V; back: K, V and their gradients, P hops for these
        kv = key_bytes + value_bytes
        return (p - 1) * kv, ((p - 1) * kv + p * kv if p > 1 else 0)  # P = 1: nothing moves
    # Ulysses: (P - 1) / P of q, k, v and the output; back: the same for their gradients
    total = query_bytes + key_bytes + value_bytes + out_bytes
    return (p - 1) * total // p, (p - 1) * total // p


@pytest.mark.parametrize("index", _CHECKED, ids=[CASES[i][0] for i in _CHECKED])
def test_each_method_equals_whole_sequence_attention(four_ranks, index):
    results, _ = four_ranks
    name, case = CASES[index]
    expected_output, expected_grads = _reference(case)
    groups = _groups(results, index)
    assert sorted(len(members) for members in groups) == sorted(
        [4] if case.subgroups is None else [len(g) for g in case.subgroups])
    for members in groups:
        world_size = len(members)
        assert all(result.error is None for result in members), members[0].error
        for result in members:
            assert torch.equal(result.positions,
                               shard_positions(T, world_size, result.rank, case.layout))
        output = unshard([result.output for result in members], case.layout)
        assert (output - expected_output).abs().max() < TOLERANCE, name
        for which in range(3):
            grad = unshard([result.grads[which] for result in members], case.layout)
            assert (grad - expected_grads[which]).abs().max() < TOLERANCE, (name, which)


@pytest.mark.parametrize("index", _CHECKED, ids=[CASES[i][0] for i in _CHECKED])
def test_bytes_and_work_per_rank_follow_the_formulas(four_ranks, index):
    results, _ = four_ranks
    _, case = CASES[index]
    for members in _groups(results, index):
        world_size = len(members)
        forward, backward = _expected_bytes(case.method, world_size,
                                            *_shard_bytes(case, world_size))
        for result in members:
            assert result.forward.bytes_sent == result.forward.bytes_received == forward
            assert result.backward.bytes_sent == result.backward.bytes_received == backward
        if case.method == "ulysses":
            heads, local = B * H // world_size, T // world_size
            tiles = world_size * (world_size + 1) // 2 if case.is_causal else world_size**2
            assert [r.forward.score_pairs for r in members] == [heads * local**2 * tiles] * world_size
            continue
        per_position_pairs = [r.forward.score_pairs for r in members]
        if not case.is_causal:
            assert per_position_pairs == [B * H * (T // world_size) * T] * world_size
        elif case.layout == "contiguous":  # rank r computes r + 1 blocks of (T/P)^2
            block = B * H * (T // world_size) ** 2
            assert per_position_pairs == [(r + 1) * block for r in range(world_size)]
        else:  # zigzag: 2P + 1 tiles of (T/2P)^2 on every rank
            tile = B * H * (T // (2 * world_size)) ** 2
            assert per_position_pairs == [(2 * world_size + 1) * tile] * world_size
        if case.method == "ring":
            steps = [r.forward.pairs_per_step for r in members]
            assert all(len(s) == world_size for s in steps)
            assert [sum(s) for s in steps] == per_position_pairs
            if case.is_causal and case.layout == "zigzag":  # the same work at every step
                tile = B * H * (T // (2 * world_size)) ** 2
                assert steps == [[3 * tile] + [2 * tile] * (world_size - 1)] * world_size
            if case.is_causal and case.layout == "contiguous":  # idle once the block is ahead
                block = B * H * (T // world_size) ** 2
                assert steps == [[block if s <= r else 0 for s in range(world_size)]
                                 for r in range(world_size)]


@pytest.mark.parametrize("name", list(ERRORS))
def test_bad_inputs_are_reported_on_every_rank(four_ranks, name):
    results, _ = four_ranks
    index = next(i for i, (case_name, _) in enumerate(CASES) if case_name == name)
    errors = [rank_results[index].error for rank_results in results]
    assert len(set(errors)) == 1 and ERRORS[name] in errors[0], errors


def _fused_error(query, key, value):
    """The error of PyTorch's fused kernel in the inputs' dtype against float64 attention."""
    reference = F.scaled_dot_product_attention(query.double(), key.double(), value.double(),
                                               is_causal=True)
    fused = F.scaled_dot_product_attention(query, key, value, is_causal=True)
    return reference, (fused.double() - reference).abs().max()


@pytest.mark.parametrize("name", [name for name, _ in CASES if name.startswith("bf16")])
def test_the_ring_on_real_ranks_keeps_its_bfloat16_error_near_the_fused_kernels(four_ranks,
                                                                                  name):
    """Issue 35: the running output and log-sum-exp stay float32, so the ring's bfloat16 error
    does not grow with the ranks: within twice that of F.scaled_dot_product_attention."""
    results, _ = four_ranks
    index = next(i for i, (case_name, _) in enumerate(CASES) if case_name == name)
    case = CASES[index][1]
    reference, fused_error = _fused_error(case.query, case.key, case.value)
    for members in _groups(results, index):
        output = unshard([result.output for result in members], case.layout)
        assert output.dtype == torch.bfloat16
        assert (output.double() - reference).abs().max() <= 2 * fused_error, name


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_simulated_ring_keeps_its_bfloat16_error_near_the_fused_kernels(world_size, layout):
    query, key, value = _low_precision_inputs()
    reference, fused_error = _fused_error(query, key, value)
    output = simulate_ring_attention(query, key, value, world_size, is_causal=True, layout=layout)
    assert output.dtype == torch.bfloat16
    assert (output.double() - reference).abs().max() <= 2 * fused_error


def test_the_simulated_ring_takes_grouped_key_value_heads_or_says_why_not():
    query, key, value, _ = _inputs()
    for kv_heads in (1, 4, 6):
        expected = F.scaled_dot_product_attention(query, key[:, :kv_heads], value[:, :kv_heads],
                                                  is_causal=True, enable_gqa=True)
        output = simulate_ring_attention(query, key[:, :kv_heads], value[:, :kv_heads], 4,
                                         is_causal=True, layout="zigzag")
        assert (output - expected).abs().max() < TOLERANCE
    with pytest.raises(ValueError, match=ERRORS["error-kv-heads"]):
        simulate_ring_attention(query, key[:, :5], value[:, :5], 2)


def test_one_start_of_four_ranks_is_fast_enough(four_ranks):
    _, seconds = four_ranks
    print(f"4 ranks, {len(CASES)} cases: {seconds:.1f} s")
    assert seconds < 120


# ---------------------------------------------------------------- without processes


def test_shard_positions_partition_the_sequence():
    for world_size in (1, 2, 3, 4):
        for layout in LAYOUTS:
            everything = torch.cat([shard_positions(T, world_size, r, layout)
                                    for r in range(world_size)])
            assert sorted(everything.tolist()) == list(range(T))
    assert shard_positions(16, 4, 1, "contiguous").tolist() == [4, 5, 6, 7]
    assert shard_positions(16, 4, 1, "zigzag").tolist() == [2, 3, 12, 13]
    assert shard_positions(16, 4, 3, "zigzag").tolist() == [6, 7, 8, 9]


@pytest.mark.parametrize(("args", "message"), [
    ((10, 4, 0, "contiguous"), "T = 10 is not divisible by world_size = 4"),
    ((12, 4, 0, "zigzag"), "2 * world_size = 8 chunks, but T = 12"),
    ((16, 4, 4, "contiguous"), "rank must be < world_size = 4"),
    ((16, 4, 0, "striped"), "layout must be one of"),
])
def test_shard_positions_errors(args, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        shard_positions(*args)


def test_shard_then_unshard_is_the_identity():
    query, *_ = _inputs()
    for layout in LAYOUTS:
        pieces = [shard(query, 4, rank, layout) for rank in range(4)]
        assert torch.equal(unshard(pieces, layout), query)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_simulated_ring_equals_whole_sequence_attention(world_size, layout, is_causal):
    query, key, value, _ = _inputs()
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=is_causal)
    with count_traffic() as traffic:
        output = simulate_ring_attention(query, key, value, world_size, is_causal=is_causal,
                                         layout=layout)
    assert (output - expected).abs().max() < TOLERANCE
    assert traffic.bytes_sent == 0  # one process: nothing is sent
    full = B * H * T * T
    if not is_causal:
        assert traffic.score_pairs == full


@pytest.mark.parametrize("method", [allgather_kv_attention, ring_attention, ulysses_attention])
def test_without_a_process_group_the_error_says_so(method):
    query, key, value, _ = _inputs()
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        method(query, key, value, is_causal=True)


def test_functions_the_ranks_cannot_import_are_refused_before_anything_starts():
    with pytest.raises(TypeError, match="lambda or a nested function"):
        run_on_ranks(lambda rank, world_size: rank, 2)

    def nested(rank, world_size):
        return rank

    with pytest.raises(TypeError, match="lambda or a nested function"):
        run_on_ranks(nested, 2)
    nested.__module__ = "__main__"
    nested.__qualname__ = "nested"
    with pytest.raises(TypeError, match="defined in __main__"):
        run_on_ranks(nested, 2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        run_on_ranks(_record_pid_then_hang, 0)


# ---------------------------------------------------------------- run_on_ranks itself


def test_a_result_that_cannot_be_pickled_becomes_an_error_outcome():
    from attention_book.distributed.launch import _outcome_bytes

    data, ok = _outcome_bytes(("ok", lambda: None))
    status = pickle.loads(data)
    assert not ok and status[0] == "error"
    assert status[1].startswith("the result of fn could not be pickled")
    data, ok = _outcome_bytes(("ok", torch.ones(2)))
    assert ok and torch.equal(pickle.loads(data)[1], torch.ones(2))


def _record_pid(folder: str, rank: int) -> None:
    path = os.path.join(folder, f"rank{rank}.pid")
    with open(path + ".part", "w") as file:
        file.write(str(os.getpid()))
    os.replace(path + ".part", path)  # whole or absent: another rank may be waiting for it


def _fail_on_rank_one(rank: int, world_size: int, folder: str) -> int:
    """Rank 1 raises; rank 0 waits in a barrier that rank 1 never reaches."""
    import torch.distributed as dist

    _record_pid(folder, rank)
    if rank == 1:
        # Rank 0 must be inside the function (its pid recorded, on its way to the barrier)
        # when rank 1 fails; on a busy machine it could still be joining the group.
        other = os.path.join(folder, "rank0.pid")
        deadline = time.monotonic() + 300
        while not os.path.exists(other) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise ValueError("boom from rank 1")
    dist.barrier()
    return rank


def _record_pid_then_hang(rank: int, world_size: int, folder: str) -> None:
    _record_pid(folder, rank)
    time.sleep(3600)


def _assert_all_gone(folder, world_size: int) -> None:
    for rank in range(world_size):
        pid = int((folder / f"rank{rank}.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # signal 0 only asks whether the process exists


def test_a_failing_rank_raises_in_the_caller_with_its_traceback(tmp_path):
    with pytest.raises(RankFailed) as caught:
        run_on_ranks(_fail_on_rank_one, 2, str(tmp_path))
    assert caught.value.rank == 1
    message = str(caught.value)
    assert message.startswith("rank 1 of 2 failed in _fail_on_rank_one")
    assert "ValueError: boom from rank 1" in message
    assert 'in _fail_on_rank_one\n    raise ValueError("boom from rank 1")' in message
    _assert_all_gone(tmp_path, 2)


def test_a_timeout_stops_every_rank(tmp_path):
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"did not finish within timeout=2 s .* ranks \[0, 1\]"):
        run_on_ranks(_record_pid_then_hang, 2, str(tmp_path), timeout=2)
    assert time.perf_counter() - start < 120
    _assert_all_gone(tmp_path, 2)
