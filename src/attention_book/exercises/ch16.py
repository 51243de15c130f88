"""Checkers for chapter 16's exercises (serving many requests at once): what an exhausted pool
does (a prediction), the blocks of requests that share a prompt (a variant), a gather through a
block table (a bug hunt) and a property test of copy-on-write against broken caches.

Taught in chapter 16.
"""

from __future__ import annotations

import heapq
import numbers
from functools import partial

import torch

from ..serving import OutOfBlocksError, PagedKVCache
from .feedback import call, call_in_private_order, checker, expect_shape, expect_true, fail, passed

__all__ = [
    "check_predicted_pool",
    "check_shared_prompt_blocks",
    "check_gather_keys",
    "check_cow_is_safe",
]


def _tokens(count: int, start: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    keys = start + torch.arange(2.0 * count).view(1, count, 2)  # (1, count, 2)
    return keys, -keys


# --------------------------------------------------------------------------- 16.1 prediction


def _run_prediction_scenario() -> tuple[bool, int, int]:
    cache = PagedKVCache(num_blocks=5, block_size=4, num_kv_heads=1, head_dim=2)
    cache.add_sequence("a")
    cache.append("a", *_tokens(6))
    cache.fork("a", "b")
    cache.append("b", *_tokens(1))
    cache.append("a", *_tokens(2))
    try:
        cache.append("b", *_tokens(10))
        raised = False
    except OutOfBlocksError:
        raised = True
    return raised, cache.blocks_in_use, cache.length("b")


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_pool(fn) -> None:
    """Check ``fn()`` predicts ``(raised, blocks_in_use, length of b)`` for the exercise's code.

    The checker runs the code of the exercise on a :class:`~attention_book.PagedKVCache`
    and compares.

    Args:
        fn: the learner's ``predicted_pool``.

    Returns:
        True when the prediction is right (the decorator prints the feedback).

    Taught in chapter 16.
    """
    raised, in_use, length_b = _run_prediction_scenario()
    predicted = call(fn)
    if not isinstance(predicted, (tuple, list)) or len(predicted) != 3:
        fail("the prediction is a tuple (raised, blocks_in_use, length of b)",
             expected="a tuple of three values, such as (False, 4, 17)",
             actual=repr(predicted)[:60],
             hint="return the three values the last line prints, in that order")
    guess_raised, guess_in_use, guess_length = predicted
    if not isinstance(guess_raised, bool):
        fail("the first value says whether the last append raised", expected="True or False",
             actual=repr(guess_raised), hint="return a bool first")
    for name, value in (("blocks_in_use", guess_in_use), ("length of b", guess_length)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            fail(f"{name} is an int", expected="an int", actual=type(value).__name__,
                 hint="count blocks and tokens: whole numbers")
    expect_true("the prediction says whether the last append raises OutOfBlocksError",
                guess_raised == raised, expected=raised, actual=guess_raised,
                hint="count the blocks b would hold after 10 more tokens, and how many of them "
                     "it already has; compare what it lacks with the free blocks")
    if guess_in_use == 2:
        fail("the blocks in use count the copy made on b's first append", expected=in_use,
             actual=guess_in_use,
             hint="b's first token goes into a block it shares with a, half full: that write "
                  "copies the block first (copy-on-write)")
    if guess_in_use == 4:
        fail("a's append copies nothing", expected=in_use, actual=guess_in_use,
             hint="after b took its own copy, a is the only sequence left in its old block "
                  "(reference count 1), so a writes in place")
    if guess_in_use == 5 or guess_length in (15, 17):
        fail("an append that fails changes nothing", expected=f"{in_use} blocks, b of "
             f"{length_b} tokens", actual=f"{guess_in_use} blocks, b of {guess_length} tokens",
             hint="the cache checks that every block it needs is free before it takes any, so "
                  "a failed append leaves the pool and the sequence as they were")
    expect_true("the prediction has the right blocks in use and length of b",
                (guess_in_use, guess_length) == (in_use, length_b),
                expected=(in_use, length_b), actual=(guess_in_use, guess_length),
                hint="follow the block table of a and of b after each line, and the reference "
                     "count of each block")
    passed("b's first token copied the shared half-full block; a then wrote in place; b's "
           "last append needed 3 blocks with 2 free, and failed without changing anything.")


# --------------------------------------------------------------------------- 16.2 shared prompt


def _measured_shared_blocks(prompt_len: int, reply_lens: list[int], block_size: int) -> int:
    total = prompt_len + sum(reply_lens)
    cache = PagedKVCache(2 * total // block_size + len(reply_lens) + 2, block_size, 1, 1)
    cache.add_sequence("prompt")
    cache.append("prompt", torch.zeros(1, prompt_len, 1), torch.zeros(1, prompt_len, 1))
    for index, reply in enumerate(reply_lens):
        cache.fork("prompt", index)
        cache.append(index, torch.zeros(1, reply, 1), torch.zeros(1, reply, 1))
    return cache.blocks_in_use


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@checker
def check_shared_prompt_blocks(fn) -> None:
    """Check ``fn(prompt_len, reply_lens, block_size)`` counts the blocks of a shared prompt.

    The checker builds the requests on a :class:`~attention_book.PagedKVCache` (the prompt as
    one sequence, each request forked from it and given its reply) and reads
    ``blocks_in_use``.

    Args:
        fn: the learner's ``shared_prompt_blocks``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 16.
    """
    hint = ("count the prompt's blocks once; then, for each reply, the blocks the request "
            "holds that the prompt does not: its full prompt blocks stay shared, but the first "
            "write into a half-full one copies it")
    cases = ((10, [3, 5, 0], 4), (8, [1, 2, 6], 4), (5, [0, 0], 4), (30, [1] * 10, 16),
             (3, [20], 4), (7, [1, 1, 1], 1), (33, [7, 40, 2, 0, 31], 16), (16, [16, 17], 16))
    for prompt_len, reply_lens, block_size in cases:
        expected = _measured_shared_blocks(prompt_len, reply_lens, block_size)
        actual = call(fn, prompt_len, list(reply_lens), block_size)
        label = f"shared_prompt_blocks({prompt_len}, {reply_lens}, {block_size})"
        if isinstance(actual, bool) or not isinstance(actual, numbers.Integral):
            fail(f"{label} is an int", expected="an int", actual=type(actual).__name__,
                 hint="count whole blocks; use // (and -(-a // b) to round up), not /")
        if actual == expected:
            continue
        full, prompt_blocks = prompt_len // block_size, _ceil(prompt_len, block_size)
        unshared = prompt_blocks + sum(_ceil(prompt_len + r, block_size) for r in reply_lens)
        no_copy = prompt_blocks + sum(_ceil(prompt_len + r, block_size) - prompt_blocks
                                      for r in reply_lens)
        copy_always = prompt_blocks + sum(max(_ceil(prompt_len + r, block_size) - full,
                                              int(prompt_len % block_size != 0))
                                          for r in reply_lens)
        if actual == unshared:
            fail(f"{label} shares the prompt's blocks", expected=expected, actual=actual,
                 hint="a fork holds the very blocks of the prompt (their reference counts go "
                      "up); the requests do not each store the prompt again")
        if actual == no_copy:
            fail(f"{label} counts the copy of the half-full prompt block", expected=expected,
                 actual=actual,
                 hint="a reply's first token lands in the prompt's last block when that block "
                      "is not full; since other sequences read it, it is copied first")
        if actual == copy_always:
            fail(f"{label} copies only when a request writes", expected=expected, actual=actual,
                 hint="a request with an empty reply never writes, so it copies nothing")
        fail(f"{label} has the right value", expected=expected, actual=actual, hint=hint)
    passed("the prompt's blocks are stored once; a request adds the blocks of its reply, and "
           "one copy of the prompt's last block when that block was half full and it wrote.")


# --------------------------------------------------------------------------- 16.3 gather


def _gather_reference(key_pool: torch.Tensor, table: list[int], length: int) -> torch.Tensor:
    block_size = key_pool.size(1)
    rows = [key_pool[table[t // block_size], t % block_size] for t in range(length)]  # (H, D) each
    return torch.stack(rows, dim=1)  # (H, length, D)


@checker
def check_gather_keys(fn) -> None:
    """Check ``fn(key_pool, block_table, length)`` reads a sequence's keys through its table.

    Args:
        fn: the learner's ``gather_keys``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 16.
    """
    hint = ("token t of the sequence lives in block block_table[t // block_size] at slot "
            "t % block_size: take the blocks in table order, keep (block, slot) together as "
            "the token axis, then put the heads first")
    generator = torch.Generator().manual_seed(16)
    num_blocks, block_size, num_heads, head_dim = 9, 4, 3, 2
    key_pool = torch.randn(num_blocks, block_size, num_heads, head_dim, generator=generator)
    for table, length in (([0], 3), ([5, 2, 7], 10), ([1, 0], 8), ([8, 3, 6, 4], 13)):
        expected = _gather_reference(key_pool, table, length)
        actual = call(fn, key_pool.clone(), list(table), length)
        name = f"gather_keys(key_pool, {table}, {length})"
        expect_shape(name, actual, expected.shape,
                     hint="return (num_heads, length, head_dim): only the sequence's length "
                          "tokens, heads first")
        actual = actual.detach().to(expected.dtype)
        if torch.equal(actual, expected):
            continue
        blocks = key_pool[table].permute(2, 1, 0, 3)  # (H, block_size, n, D): the bug
        slot_major = blocks.reshape(num_heads, -1, head_dim)[:, :length]
        in_pool_order = _gather_reference(key_pool, list(range(len(table))), length)
        if torch.equal(actual, slot_major):
            fail(f"{name} keeps each block's tokens together", expected=expected[0, :, 0].tolist(),
                 actual=actual[0, :, 0].tolist(),
                 hint="permute(2, 1, 0, 3) puts the slot axis before the block axis, so the "
                      "flattened tokens go slot 0 of every block, then slot 1, …; it only "
                      "works while the sequence fits in one block. Keep the block axis before "
                      "the slot axis")
        if torch.equal(actual, in_pool_order):
            fail(f"{name} reads the blocks the table names", expected=table,
                 actual=list(range(len(table))),
                 hint="the sequence's blocks are wherever its block table says, not the first "
                      "blocks of the pool")
        fail(f"the values of {name} match the sequence's keys",
             expected=expected[0, :, 0].tolist(), actual=actual[0, :, 0].tolist(), hint=hint)
    passed("the blocks in table order, block before slot, the heads moved first and the "
           "sequence cut to its length: the same keys as a contiguous cache.")


# --------------------------------------------------------------------------- 16.4 property test


# The caches handed to the learner's test have neutral names (a test must not tell them apart
# by name); what each one does is said in the comment above it and in _HEALTHY and _BROKEN.


# Healthy, but takes the highest free block first: a test must not expect block ids.
class _CacheA(PagedKVCache):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._free = [-block for block in self._free]
        heapq.heapify(self._free)

    def _allocate(self) -> int:
        block = -heapq.heappop(self._free)
        self._ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            heapq.heappush(self._free, -block)


# Copy-on-write takes a new block but copies nothing: the fork's half block is lost.
class _CacheB(PagedKVCache):
    def _copy_block(self, source: int, target: int) -> None:
        self.key_blocks[:, target] = 0.0
        self.value_blocks[:, target] = 0.0


# No copy-on-write: a fork writes into the shared block; the next writer overwrites it.
class _CacheC(PagedKVCache):
    def _make_room(self, seq_id, num_new, layer) -> None:
        table, count = self._tables[seq_id], self._lengths[seq_id][layer]
        while len(table) * self.block_size < count + num_new:
            table.append(self._allocate())

    def _blocks_needed(self, seq_ids, num_new, layer) -> int:
        return sum(max(0, -(-(self._lengths[s][layer] + num_new) // self.block_size)
                       - len(self._tables[s])) for s in seq_ids)


# free returns every block of the sequence to the pool, even blocks another still holds.
class _CacheD(PagedKVCache):
    def free(self, seq_id) -> None:
        seq_id = self._check_seq(seq_id)
        for block in self._tables.pop(seq_id):
            if self._ref_counts[block] > 0:
                self._ref_counts[block] = 0
                heapq.heappush(self._free, block)
        del self._lengths[seq_id]
        self._freed.add(seq_id)


# Copy-on-write never lowers the shared block's count: blocks leak when all are freed.
class _CacheE(PagedKVCache):
    def _make_room(self, seq_id, num_new, layer) -> None:
        table, count = self._tables[seq_id], self._lengths[seq_id][layer]
        blocks_after = -(-(count + num_new) // self.block_size)
        for index in range(count // self.block_size, min(len(table), blocks_after)):
            shared = table[index]
            if self._ref_counts[shared] > 1:
                private = self._allocate()
                self._copy_block(shared, private)
                table[index] = private
        while len(table) < blocks_after:
            table.append(self._allocate())


# Copy-on-write takes the private block at once but queues the copy of the shared tokens, as
# an engine batches its block copies, and runs the queue at the next add, append, fork or free
# instead of before the next read: a sequence read right after the write that copied lacks
# its shared tokens, and any later change repairs it. Only a test that reads the sequences
# between operations sees it; the state after the last operation usually looks right.
class _CacheF(PagedKVCache):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._queued: list[tuple[int, int, int]] = []
        self._filled = 0

    def _make_room(self, seq_id, num_new, layer) -> None:
        self._filled = self._lengths[seq_id][layer] % self.block_size
        super()._make_room(seq_id, num_new, layer)

    def _copy_block(self, source: int, target: int) -> None:
        self._queued.append((source, target, self._filled))

    def _run_queue(self) -> None:
        for source, target, filled in self._queued:
            self.key_blocks[:, target, :filled] = self.key_blocks[:, source, :filled]
            self.value_blocks[:, target, :filled] = self.value_blocks[:, source, :filled]
        self._queued.clear()

    def add_sequence(self, seq_id) -> None:
        self._run_queue()
        super().add_sequence(seq_id)

    def append(self, seq_id, keys, values, layer: int = 0) -> None:
        self._run_queue()
        super().append(seq_id, keys, values, layer)

    def fork(self, parent_id, child_id) -> None:
        self._run_queue()
        super().fork(parent_id, child_id)

    def free(self, seq_id) -> None:
        self._run_queue()
        super().free(seq_id)


# Copy-on-write only when exactly two sequences hold the block: with three or more (a prompt
# forked twice, a fork of a fork), the first to write writes into the block the others read.
# The prompt does not describe this one: a test aimed at the five cases it describes, each
# with one fork, misses it; random operations that fork again and again find it.
class _CacheG(PagedKVCache):
    def _make_room(self, seq_id, num_new, layer) -> None:
        table, count = self._tables[seq_id], self._lengths[seq_id][layer]
        blocks_after = -(-(count + num_new) // self.block_size)
        for index in range(count // self.block_size, min(len(table), blocks_after)):
            shared = table[index]
            if self._ref_counts[shared] == 2:
                private = self._allocate()
                self._copy_block(shared, private)
                self._release(shared)
                table[index] = private
        while len(table) < blocks_after:
            table.append(self._allocate())


_HEALTHY = {"PagedKVCache": PagedKVCache,
            "a healthy cache that takes the highest free block first": _CacheA}
# The simplest bug comes first, for the feedback a first attempt gets; then the broken caches
# that only some tests catch, and the healthy ones last, so that a weak test meets the bug it
# misses early; the order changes nothing else.
_BROKEN = {
    "a cache whose copy-on-write copies nothing into the new block (caught once a fork "
    "appends to a half-full shared block and is read back)": _CacheB,
    "a cache that queues its copy-on-write copies and runs them at the next change instead "
    "of before the next read (caught only by reading the sequences right after such a "
    "write: any later operation repairs them)": _CacheF,
    "a cache whose copy-on-write leaks the old block (caught only by the block count once "
    "every sequence is freed)": _CacheE,
    "a cache whose free gives back blocks another sequence still holds (caught only when a "
    "freed block is taken by a new append while the fork still reads it)": _CacheD,
    "a cache without copy-on-write (caught only when a fork and its parent both append "
    "after the fork, and the first one to write is read back)": _CacheC,
    "a cache whose copy-on-write copies only blocks that exactly two sequences share (caught "
    "only when three or more sequences share a half-full block, as after two forks of one "
    "prompt, and one of them writes)": _CacheG,
}


@checker
def check_cow_is_safe(fn) -> None:
    """Check the property test ``fn(make_cache) -> bool`` on healthy and broken paged caches.

    ``make_cache(num_blocks, block_size, num_kv_heads, head_dim)`` builds a cache with the
    API of :class:`~attention_book.PagedKVCache`. Two healthy caches must pass; six broken
    ones, each failing only after a different sequence of operations (one of them only
    between operations, one only with three sequences on a block), must not.

    Args:
        fn: the learner's ``cow_is_safe``.

    Returns:
        True when the test tells every cache apart (the decorator prints the feedback).

    Taught in chapter 16.
    """
    subjects = [*_BROKEN.items(), *_HEALTHY.items()]
    outcomes = call_in_private_order([partial(call, fn, cache) for _, cache in subjects])
    for (name, _), outcome in zip(subjects, outcomes, strict=True):  # the simplest bug first
        verdict = outcome.get()
        if not isinstance(verdict, bool):
            fail(f"cow_is_safe returns a bool for {name}", expected="True or False",
                 actual=type(verdict).__name__,
                 hint="return True when every check held and False at the first that fails")
        if name in _HEALTHY:
            expect_true(f"cow_is_safe accepts {name}", verdict, expected=True, actual=verdict,
                        hint="compare what each sequence gathers with what was appended to it "
                             "(and to its parent before the fork), and the block count with 0 "
                             "once every sequence is freed; never expect particular block ids, "
                             "and catch OutOfBlocksError if your pool can run out")
            continue
        expect_true(f"cow_is_safe rejects {name}", verdict is False, expected=False,
                    actual=verdict,
                    hint="run many random operations (add, append of 1 to 6 tokens, fork, free) "
                         "on a small pool, check every live sequence after each one (not only "
                         "at the end: some damage is repaired by later operations, or leaves "
                         "with a sequence that is freed), and check blocks_in_use == 0 after "
                         "freeing them all")
    passed("your test keeps both healthy caches and catches all six broken ones, from the "
           "copy that copies nothing to the copy that comes one operation too late, the leak "
           "only the block count reveals and the copy-on-write that counts to two only.")
