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


@pytest.mark.parametrize(("value", "phrase"), [
    ((False, 5, 17), "raises OutOfBlocksError"),
    ((True, 2, 7), "copy made on b's first"),
    ((True, 4, 7), "a's append copies nothing"),
    ((True, 5, 7), "fails changes nothing"),
    ((True, 3, 17), "fails changes nothing"),
    ((True, 3, 8), "right blocks in use"),
])
def test_pool_prediction_typical_mistakes(value, phrase, capsys):
    assert_fails(check_predicted_pool, lambda: value, capsys, phrase)
    assert not passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex1-check",
                                   predicted_pool=lambda: value)


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
    def floor_prompt(p, replies, b):
        return p // b + sum(_ceil(p + r, b) - p // b for r in replies if r > 0)

    def as_float(p, replies, b):
        return float(shared_right(p, replies, b))

    assert_fails(check_shared_prompt_blocks, as_float, capsys, "is an int")
    # The review's wrong answers (no copy, copy and own blocks, floor of the prompt's blocks,
    # a copy of a full block, a float) fail the hidden tests too.
    assert_fails(check_shared_prompt_blocks, floor_prompt, capsys, "has the right value")
    for answer in (unshared, no_copy, copy_always, floor_prompt, as_float):
        assert not passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex2-check",
                                       shared_prompt_blocks=answer), answer.__name__
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
    for answer in (gather_buggy, gather_pool_order, gather_untrimmed):
        assert not passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex3-check",
                                       gather_keys=answer), answer.__name__


# --- 16.4 copy-on-write property test --------------------------------------------------------


def _random_test(make_cache, *, check_counts=True, check_every_sequence=True, steps=200,
                 check_between=True, seed=0, forks=True, frees=True, catch_full=True):
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
                    if not catch_full:
                        raise
                    continue
                expected[seq_id] = torch.cat([expected[seq_id], keys], dim=1)
            elif action < 8:
                if not forks:
                    continue
                cache.fork(seq_id, next_id)
                expected[next_id] = expected[seq_id].clone()
                next_id += 1
            else:
                if not frees:
                    continue
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


def _five_case_test(make_cache):
    """The review's targeted test: one scenario per broken cache the prompt describes, each
    with one fork, every live sequence read after every operation, the count checked at the end."""
    def run(operations):
        cache, expected, counter = make_cache(16, 4, 1, 2), {}, 0.0
        for operation, *args in operations:
            if operation == "add":
                cache.add_sequence(args[0])
                expected[args[0]] = torch.zeros(1, 0, 2)
            elif operation == "append":
                keys = counter + torch.arange(2.0 * args[1]).view(1, args[1], 2)
                counter += 2 * args[1]
                cache.append(args[0], keys, -keys)
                expected[args[0]] = torch.cat([expected[args[0]], keys], dim=1)
            elif operation == "fork":
                cache.fork(*args)
                expected[args[1]] = expected[args[0]].clone()
            else:
                cache.free(args[0])
                del expected[args[0]]
            if any(not torch.equal(cache.gather(seq)[0], keys) for seq, keys in expected.items()):
                return False
        for seq in list(expected):
            cache.free(seq)
        return cache.blocks_in_use == 0

    start = [("add", "p"), ("append", "p", 6), ("fork", "p", "c")]
    return all(run(start + rest) for rest in (
        [("append", "c", 1)],  # a single append to the fork
        [("append", "c", 1), ("append", "p", 1)],  # the fork and its parent both write
        [("free", "p"), ("add", "n"), ("append", "n", 8)],  # a block freed too early, reused
        [("append", "p", 3), ("free", "p"), ("free", "c")],  # the block count
    ))


def test_cow_right(capsys):
    assert_passes(check_cow_is_safe, _random_test, capsys)


def test_cow_shallow_tests_are_caught_at_their_depth(capsys):
    assert_fails(check_cow_is_safe, _one_fork_test, capsys, "leaks the old block")
    assert_fails(check_cow_is_safe, lambda make: _random_test(make, check_counts=False), capsys,
                 "leaks the old block", "blocks_in_use == 0")
    assert_fails(check_cow_is_safe,
                 lambda make: _random_test(make, check_every_sequence=False, steps=20), capsys,
                 "rejects a cache")


def test_cow_a_test_of_the_final_state_only_is_caught(capsys):
    """The review's weak test (N3): 200 random operations, then only the final state checked."""
    def final_state_only(make_cache):
        return _random_test(make_cache, check_between=False)

    assert_fails(check_cow_is_safe, final_state_only, capsys, "queues its copy-on-write copies",
                 "after each one")
    assert not passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex4-check",
                                   cow_is_safe=final_state_only)


def test_cow_hidden_tests_pass_the_solution():
    assert passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex4-check",
                               cow_is_safe=_random_test)


# The wrong answers the review of chapters 16-17 submitted for 16.4, each rejected by the
# checker; the hidden tests must reject them too.
REVIEW_WRONG_TESTS = {
    "no final count": (lambda make: _random_test(make, check_counts=False), "leaks the old block"),
    "never forks": (lambda make: _random_test(make, forks=False), "copies nothing"),
    "never frees": (lambda make: _random_test(make, frees=False), "free gives back blocks"),
    "expects the lowest free ids": (_block_ids_test, "takes the highest free block"),
    "one fork and one write": (_one_fork_test, "leaks the old block"),
    "a small pool without catching OutOfBlocksError": (
        lambda make: _random_test(make, catch_full=False), "OutOfBlocksError"),
    "a targeted test of the cases the prompt describes": (_five_case_test, "exactly two"),
}


@pytest.mark.parametrize("name", list(REVIEW_WRONG_TESTS))
def test_cow_the_reviews_wrong_tests_fail_checker_and_hidden_tests(name, capsys):
    answer, phrase = REVIEW_WRONG_TESTS[name]
    assert_fails(check_cow_is_safe, answer, capsys, phrase)
    assert not passes_hidden_tests("16_serving_many_requests.ipynb", "ch16-ex4-check",
                                   cow_is_safe=answer), name


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
