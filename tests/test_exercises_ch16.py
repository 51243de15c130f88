"""Chapter 16's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten
from hidden_tests import passes_hidden_tests

from attention_book.exercises import (
    check_cow_is_safe,
    check_gather_keys,
    check_predicted_pool,
    check_shared_prompt_blocks,
)
from attention_book.serving import OutOfBlocksError

# --- 16.1 predicted pool --------------------------------------------------------------------


def test_pool_prediction_right(capsys):
    assert_passes(check_predicted_pool, lambda: (True, 3, 7), capsys)


def test_pool_prediction_typical_mistakes(capsys):
    assert_fails(check_predicted_pool, lambda: (False, 5, 17), capsys, "raises OutOfBlocksError")
    assert_fails(check_predicted_pool, lambda: (True, 2, 7), capsys, "copy made on b's first")
    assert_fails(check_predicted_pool, lambda: (True, 4, 7), capsys, "a's append copies nothing")
    assert_fails(check_predicted_pool, lambda: (True, 5, 7), capsys, "fails changes nothing")
    assert_fails(check_predicted_pool, lambda: (True, 3, 17), capsys, "fails changes nothing")
    assert_fails(check_predicted_pool, lambda: (True, 3, 8), capsys, "right blocks in use")


def test_pool_prediction_odd_answers(capsys):
    assert_fails(check_predicted_pool, lambda: 3, capsys, "a tuple (raised")
    assert_fails(check_predicted_pool, lambda: ("yes", 3, 7), capsys, "whether the last append")
    assert_fails(check_predicted_pool, lambda: (True, 3.0, 7), capsys, "is an int")
    assert_fails(check_predicted_pool, unwritten, capsys, "You have not written", sections=())


# --- 16.2 shared prompt blocks --------------------------------------------------------------


def _ceil(a, b):
    return -(-a // b)


def shared_right(prompt_len, reply_lens, block_size):
    full = prompt_len // block_size
    return _ceil(prompt_len, block_size) + sum(
        _ceil(prompt_len + reply, block_size) - full for reply in reply_lens if reply > 0)


def test_shared_right(capsys):
    assert_passes(check_shared_prompt_blocks, shared_right, capsys)


def test_shared_typical_mistakes(capsys):
    def unshared(p, replies, b):
        return _ceil(p, b) + sum(_ceil(p + r, b) for r in replies)

    def no_copy(p, replies, b):
        return _ceil(p, b) + sum(_ceil(p + r, b) - _ceil(p, b) for r in replies)

    def copy_always(p, replies, b):
        return _ceil(p, b) + sum(max(_ceil(p + r, b) - p // b, int(p % b != 0)) for r in replies)

    assert_fails(check_shared_prompt_blocks, unshared, capsys, "shares the prompt's blocks")
    assert_fails(check_shared_prompt_blocks, no_copy, capsys, "counts the copy of the half-full")
    assert_fails(check_shared_prompt_blocks, copy_always, capsys, "copies only when a request")
    assert_fails(check_shared_prompt_blocks, lambda p, r, b: shared_right(p, r, b) + 3, capsys,
                 "has the right value")
    assert_fails(check_shared_prompt_blocks, lambda p, r, b: float(shared_right(p, r, b)),
                 capsys, "is an int")
    assert_fails(check_shared_prompt_blocks, unwritten, capsys, "You have not written",
                 sections=())


# --- 16.3 gather through a block table -------------------------------------------------------


def gather_right(key_pool, block_table, length):
    blocks = key_pool[block_table]  # (n, block_size, H, D)
    return blocks.permute(2, 0, 1, 3).reshape(key_pool.size(2), -1, key_pool.size(3))[:, :length]


def gather_buggy(key_pool, block_table, length):
    blocks = key_pool[block_table]
    keys = blocks.permute(2, 1, 0, 3)
    return keys.reshape(keys.size(0), -1, keys.size(-1))[:, :length]


def gather_pool_order(key_pool, block_table, length):
    return gather_right(key_pool, list(range(len(block_table))), length)


def gather_untrimmed(key_pool, block_table, length):
    blocks = key_pool[block_table]
    return blocks.permute(2, 0, 1, 3).reshape(key_pool.size(2), -1, key_pool.size(3))


def test_gather_right(capsys):
    assert_passes(check_gather_keys, gather_right, capsys)


def test_gather_typical_bugs(capsys):
    assert_fails(check_gather_keys, gather_buggy, capsys, "keeps each block's tokens together",
                 "one block")
    assert_fails(check_gather_keys, gather_pool_order, capsys, "reads the blocks the table names")
    assert_fails(check_gather_keys, gather_untrimmed, capsys, "the shape of", "length")
    assert_fails(check_gather_keys, lambda pool, table, length: gather_right(pool, table, length)
                 * 2, capsys, "match the sequence's keys")
    assert_fails(check_gather_keys, unwritten, capsys, "You have not written", sections=())


# --- 16.4 copy-on-write property test --------------------------------------------------------


def _random_test(make_cache, *, check_counts=True, check_every_sequence=True, steps=200,
                 check_between=True, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(n):
        return int(torch.randint(n, (1,), generator=generator))

    for block_size in (2, 3, 4):
        cache = make_cache(24, block_size, 1, 2)
        expected, next_id, counter = {}, 0, 0.0
        for _ in range(steps):
            action, live = draw(10), list(expected)
            if action < 2 or not live:
                cache.add_sequence(next_id)
                expected[next_id] = torch.zeros(1, 0, 2)
                next_id += 1
                continue
            seq_id = live[draw(len(live))]
            if action < 6:
                size = 1 + draw(6)
                keys = counter + torch.arange(2.0 * size).view(1, size, 2)
                counter += 2 * size
                try:
                    cache.append(seq_id, keys, -keys)
                except OutOfBlocksError:
                    continue
                expected[seq_id] = torch.cat([expected[seq_id], keys], dim=1)
            elif action < 8:
                cache.fork(seq_id, next_id)
                expected[next_id] = expected[seq_id].clone()
                next_id += 1
            else:
                cache.free(seq_id)
                del expected[seq_id]
            if not check_between:
                continue
            checked = expected if check_every_sequence else {seq_id: expected.get(seq_id)}
            for other, keys in checked.items():
                if keys is not None and not torch.equal(cache.gather(other)[0], keys):
                    return False
        for other, keys in expected.items():  # the state after the last operation
            if not torch.equal(cache.gather(other)[0], keys):
                return False
        for seq_id in list(expected):
            cache.free(seq_id)
        if check_counts and cache.blocks_in_use != 0:
            return False
    return True


def _one_fork_test(make_cache):
    """The shallowest test: one fork, one append to it, read it back."""
    cache = make_cache(8, 4, 1, 2)
    cache.add_sequence("p")
    keys = torch.arange(12.0).view(1, 6, 2)
    cache.append("p", keys, keys)
    cache.fork("p", "c")
    more = torch.full((1, 1, 2), 99.0)
    cache.append("c", more, more)
    return torch.equal(cache.gather("c")[0], torch.cat([keys, more], dim=1))


def _block_ids_test(make_cache):
    """Healthy data, but expects the lowest free block to be taken first."""
    cache = make_cache(8, 4, 1, 2)
    cache.add_sequence(0)
    cache.append(0, torch.zeros(1, 5, 2), torch.zeros(1, 5, 2))
    return _random_test(make_cache) and cache.block_table(0) == [0, 1]


def test_cow_right(capsys):
    assert_passes(check_cow_is_safe, _random_test, capsys)


def test_cow_shallow_tests_are_caught_at_their_depth(capsys):
    assert_fails(check_cow_is_safe, _one_fork_test, capsys, "rejects a cache without copy-on-write")
    assert_fails(check_cow_is_safe, lambda make: _random_test(make, check_counts=False), capsys,
                 "leaks the old block", "blocks_in_use == 0")
    assert_fails(check_cow_is_safe,
                 lambda make: _random_test(make, check_every_sequence=False, steps=20), capsys,
                 "rejects a cache")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cow_a_test_of_the_final_state_only_is_caught(seed, capsys):
    """The review's weak test (N3): 200 random operations, then only the final state checked."""
    def final_state_only(make_cache):
        return _random_test(make_cache, check_between=False, seed=seed)

    assert_fails(check_cow_is_safe, final_state_only, capsys, "queues its copy-on-write copies",
                 "after each one")
    assert not passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex4-check",
                                   cow_is_safe=final_state_only)


def test_cow_hidden_tests_pass_the_solution_and_reject_shallow_tests():
    assert passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex4-check",
                               cow_is_safe=_random_test)
    assert not passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex4-check",
                                   cow_is_safe=_one_fork_test)


def test_cow_test_doubles_have_neutral_names():
    """A learner's test must not tell the caches apart by their names."""
    from attention_book.exercises.ch16 import _BROKEN, _HEALTHY

    for cache_class in [*_HEALTHY.values(), *_BROKEN.values()]:
        for word in ("broken", "leak", "blank", "free", "copy", "place", "queue", "wrong"):
            assert word not in repr(cache_class).lower(), (cache_class, word)


def test_cow_unfair_or_odd_tests(capsys):
    assert_fails(check_cow_is_safe, _block_ids_test, capsys,
                 "accepts a healthy cache that takes the highest", "block ids")
    assert_fails(check_cow_is_safe, lambda make: False, capsys, "accepts PagedKVCache")
    assert_fails(check_cow_is_safe, lambda make: 1, capsys, "returns a bool")
    assert_fails(check_cow_is_safe, unwritten, capsys, "You have not written", sections=())
