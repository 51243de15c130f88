"""Chapter 15's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, assert_rejected, unwritten
from hidden_tests import passes_hidden_tests

from attention_book import ablate_heads, find_heads, induction_scores
from attention_book.exercises import (
    check_block_parameter_count,
    check_generates_like_full_pass,
    check_induction_score,
    check_is_induction_head,
    check_mean_ablated_logits,
)
from attention_book.repeat_task import induction_accuracy, repeated_segments

# --- block_parameter_count --------------------------------------------------------------------


def count_right(d, r, qkv_bias):
    return (4 + 2 * r) * d * d + (6 + r) * d + 3 * d * qkv_bias


def test_count_right(capsys):
    assert check_block_parameter_count(count_right)
    assert capsys.readouterr().out.startswith("Correct:")


def test_count_without_qkv_bias(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, r, False), capsys,
                 "counts the query, key and value biases")


def test_count_without_layernorms(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, r, b) - 4 * d,
                 capsys, "counts the LayerNorms")


def test_count_without_the_layernorm_biases_or_the_output_bias(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, r, b) - 2 * d,
                 capsys, "counts both parts of each LayerNorm")
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, r, b) - d,
                 capsys, "counts the output projection's bias")


def test_count_with_a_fixed_ratio(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, 4, b), capsys,
                 "follows mlp_ratio")


def test_count_without_biases_at_all(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: (4 + 2 * r) * d * d, capsys,
                 "has the right value", "two LayerNorms")


def test_count_as_float_and_not_written(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: float(count_right(d, r, b)), capsys,
                 "is an int")
    assert_fails(check_block_parameter_count, unwritten, capsys, "You have not written",
                 sections=())


# --- induction score ----------------------------------------------------------------------------


def induction_score(weights, tokens):
    num_tokens = tokens.size(1)
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T)
    targets = torch.zeros_like(same)
    targets[:, :, 1:] = same[:, :, :-1]  # key s follows a copy of the query's token
    targets &= torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    has_target = targets.any(dim=-1)  # (B, T)
    return (weights * targets).sum(dim=-1)[has_target].mean().item()


def test_induction_score_right(capsys):
    assert_passes(check_induction_score, induction_score, capsys)
    assert_passes(check_induction_score, lambda w, t: torch.tensor(induction_score(w, t)), capsys)


def test_induction_score_equals_the_package_on_a_trained_like_model():
    """The learner's definition is the package's: equal on the hand-built model's weights."""
    from attention_book.heads import hand_built_induction_model, induction_scores

    model = hand_built_induction_model(8, 16, dtype=torch.float64)
    with torch.no_grad():
        model.blocks[1].attention.W_query.weight.mul_(0.1)  # blur the heads: scores in (0, 1)
    tokens = torch.randint(0, 8, (16, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, all_weights = model(tokens, return_weights=True)
    package = induction_scores(model, tokens)
    for layer in range(2):
        for head in range(2):
            assert abs(induction_score(all_weights[layer][:, head], tokens)
                       - package[layer, head].item()) < 1e-12


def _targets(tokens, shift=1, strict=False, causal=True):
    num_tokens = tokens.size(1)
    same = tokens[:, :, None] == tokens[:, None, :]
    targets = torch.zeros_like(same)
    if shift:
        targets[:, :, 1:] = same[:, :, :-1]
    else:
        targets = same.clone()
        strict = True
    if causal:
        targets &= torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril(-1 if strict else 0)
    return targets


def _weak_score(**options):
    def score(weights, tokens):
        targets = _targets(tokens, **{k: v for k, v in options.items() if k != "reduce"})
        has = targets.any(dim=-1)
        summed = (weights * targets).sum(dim=-1)
        reduce = options.get("reduce", "counted")
        if reduce == "all":
            return summed.mean().item()
        if reduce == "per sequence":
            means = [summed[b][has[b]].mean() for b in range(tokens.size(0)) if has[b].any()]
            return torch.stack(means).mean().item()
        if reduce == "max":
            return (weights * targets).amax(dim=-1)[has].mean().item()
        return summed[has].mean().item()

    return score


@pytest.mark.parametrize(("answer", "phrase"), [
    (_weak_score(shift=0), "duplicate-token score"),
    (_weak_score(strict=True), "the key s = t counts too"),
    (_weak_score(reduce="all"), "average only over the queries that have at least one target"),
    (_weak_score(causal=False), "a target must lie at or before the query"),
    (_weak_score(reduce="per sequence"), "not a mean per sequence"),
    (_weak_score(reduce="max"), "sum the weight over all of a query's targets"),
    (lambda w, t: 0.5, "for each query t, sum its weight"),
])
def test_induction_score_typical_mistakes(answer, phrase, capsys):
    assert_fails(check_induction_score, answer, capsys, "the induction score follows its definition",
                 phrase)


def test_induction_score_returning_a_tensor_of_scores_or_nothing(capsys):
    assert_fails(check_induction_score, lambda w, t: w.sum(-1), capsys, "is a number")
    assert_fails(check_induction_score, unwritten, capsys, "You have not written", sections=())


# --- mean ablation --------------------------------------------------------------------------------


def mean_ablated_logits(model, tokens, layer, head):
    attention = model.blocks[layer].attention
    features = slice(head * attention.head_dim, (head + 1) * attention.head_dim)
    seen = []
    handle = attention.out_proj.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    mean = seen[0][..., features].mean(dim=(0, 1))  # (head_dim,)

    def replace(module, inputs):
        context = inputs[0].clone()
        context[..., features] = mean
        return (context,)

    handle = attention.out_proj.register_forward_pre_hook(replace)
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()


def mean_ablated_through_the_bias(model, tokens, layer, head):
    """Another right answer: fold the mean into the output projection's bias for one call."""
    attention = model.blocks[layer].attention
    features = slice(head * attention.head_dim, (head + 1) * attention.head_dim)
    seen = []
    handle = attention.out_proj.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    with torch.no_grad():
        model(tokens)
    handle.remove()
    mean = seen[0][..., features].mean(dim=(0, 1))
    weight, bias = attention.out_proj.weight, attention.out_proj.bias
    saved_weight, saved_bias = weight.detach().clone(), bias.detach().clone()
    with torch.no_grad():
        bias += weight[:, features] @ mean
        weight[:, features] = 0
        logits = model(tokens)
        weight.copy_(saved_weight)
        bias.copy_(saved_bias)
    return logits


def test_mean_ablation_right(capsys):
    assert_passes(check_mean_ablated_logits, mean_ablated_logits, capsys)
    assert_passes(check_mean_ablated_logits, mean_ablated_through_the_bias, capsys)


def _ablated_with(mean_over, layer_wide=False, head_shift=0):
    def answer(model, tokens, layer, head):
        attention = model.blocks[layer].attention
        head = (head + head_shift) % attention.num_heads
        features = (slice(None) if layer_wide else
                    slice(head * attention.head_dim, (head + 1) * attention.head_dim))

        def replace(module, inputs):
            context = inputs[0].clone()
            context[..., features] = mean_over(context[..., features])
            return (context,)

        handle = attention.out_proj.register_forward_pre_hook(replace)
        try:
            with torch.no_grad():
                return model(tokens)
        finally:
            handle.remove()

    return answer


@pytest.mark.parametrize(("answer", "phrase"), [
    (_ablated_with(torch.zeros_like), "you zeroed the head"),
    (_ablated_with(lambda c: c.mean(dim=0, keepdim=True)), "not one mean per position"),
    (_ablated_with(lambda c: c.mean()), "not one number"),
    (_ablated_with(lambda c: c.mean(dim=(0, 1)), layer_wide=True), "replace only this head's slice"),
    (_ablated_with(lambda c: c.mean(dim=(0, 1)), head_shift=1), "belongs to another head"),
    (lambda model, tokens, layer, head: model(tokens), "the head is not replaced at all"),
])
def test_mean_ablation_typical_mistakes(answer, phrase, capsys):
    assert_fails(check_mean_ablated_logits, answer, capsys, "mean-ablates that head", phrase)


def test_mean_ablation_that_leaves_the_model_changed(capsys):
    def hook_left_behind(model, tokens, layer, head):
        attention = model.blocks[layer].attention
        columns = torch.arange(head * attention.head_dim, (head + 1) * attention.head_dim)
        attention.out_proj.register_forward_pre_hook(
            lambda module, inputs: (inputs[0].index_fill(-1, columns, 0.0),))
        with torch.no_grad():
            return model(tokens)

    def weight_left_zeroed(model, tokens, layer, head):
        attention = model.blocks[layer].attention
        with torch.no_grad():
            attention.out_proj.weight[:, head * attention.head_dim:(head + 1) * attention.head_dim] = 0
            return model(tokens)

    assert_fails(check_mean_ablated_logits, hook_left_behind, capsys, "the model is left as it was",
                 "a hook is still registered", "handle.remove()")
    assert_fails(check_mean_ablated_logits, weight_left_zeroed, capsys, "the model is left as it was",
                 "other logits")


def test_mean_ablation_blank_and_shapes(capsys):
    assert_fails(check_mean_ablated_logits, unwritten, capsys, "You have not written", sections=())
    def first_sequence_only(model, tokens, layer, head):
        return mean_ablated_logits(model, tokens, layer, head)[0]

    assert_fails(check_mean_ablated_logits, first_sequence_only, capsys,
                 "the shape of mean_ablated_logits")


# --- is it an induction head? -------------------------------------------------------------------


def is_induction_head(model, layer, head):
    batch = repeated_segments(64, model.context_length, 8, model.vocab_size,
                              generator=torch.Generator().manual_seed(0))
    return bool(find_heads(model, batch.tokens).induction[layer, head] >= 0.5)


def is_induction_head_with_own_score(model, layer, head):
    """A right answer that uses the learner's score of exercise 15.2 and the global generator."""
    batch = repeated_segments(128, model.context_length, 6, model.vocab_size)
    with torch.no_grad():
        _, all_weights = model(batch.tokens, return_weights=True)
    return induction_score(all_weights[layer][:, head], batch.tokens) >= 0.5


NOTEBOOK = "15_attention_in_a_model.ipynb"


def test_is_induction_head_right(capsys):
    out = assert_passes(check_is_induction_head, is_induction_head, capsys)
    assert "the definition's 0.5" in out
    assert_passes(check_is_induction_head, is_induction_head_with_own_score, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch15-ex4-check", is_induction_head=is_induction_head)


def with_threshold(threshold):
    """The right test with another threshold than the definition's 0.5 (review M5)."""
    def answer(model, layer, head):
        batch = repeated_segments(64, model.context_length, 8, model.vocab_size,
                                  generator=torch.Generator().manual_seed(0))
        return bool(find_heads(model, batch.tokens).induction[layer, head] >= threshold)

    return answer


# The review measured that any threshold from 0.14 to 0.77 passed; its ends and middle now fail,
# and so do 0.45 and 0.55, which passed the heads at 0.41 and 0.58 (the recheck's D9).
@pytest.mark.parametrize(("threshold", "phrase"), [
    (0.15, "compare the score with 0.5"), (0.3, "also calls a head at 0.46"),
    (0.45, "rejects a head with about 0.46"), (0.55, "accepts a head with about 0.54"),
    (0.75, "accepts a head with about 0.54"), (0.77, "0.5, the threshold of the definition"),
])
def test_a_threshold_other_than_the_definitions_fails_the_checker_and_the_hidden_tests(
        threshold, phrase, capsys):
    assert_fails(check_is_induction_head, with_threshold(threshold), capsys, phrase)
    assert not passes_hidden_tests(NOTEBOOK, "ch15-ex4-check",
                                   is_induction_head=with_threshold(threshold))


def at_a_fixed_offset(offset):
    """The chapter's control probe, misused: the copy always lies `offset` tokens on."""
    def weak(model, layer, head):
        batch = repeated_segments(64, model.context_length, 8, model.vocab_size, offset=offset,
                                  generator=torch.Generator().manual_seed(0))
        return bool(find_heads(model, batch.tokens).induction[layer, head] >= 0.5)

    return weak


def bos_and_two_copies(model, layer, head):
    """ARENA's probe: [BOS, r, r], so the offset is always len(r)."""
    generator = torch.Generator().manual_seed(0)
    half = (model.context_length - 1) // 2
    segments = torch.stack([torch.randperm(model.vocab_size - 1, generator=generator)[:half] + 1
                            for _ in range(64)])
    tokens = torch.cat([torch.zeros(64, 1, dtype=torch.long), segments, segments], dim=1)
    return bool(find_heads(model, tokens).induction[layer, head] >= 0.5)


def too_strict(model, layer, head):
    batch = repeated_segments(64, model.context_length, 8, model.vocab_size,
                              generator=torch.Generator().manual_seed(0))
    return bool(find_heads(model, batch.tokens).induction[layer, head] >= 0.9)


def needed_for_copying(model, layer, head):
    """'A head the copying needs is an induction head': ablation alone cannot say what it does."""
    batch = repeated_segments(64, model.context_length, 8, model.vocab_size,
                              generator=torch.Generator().manual_seed(0))
    before = induction_accuracy(model, batch)
    with ablate_heads(model, [(layer, head)]):
        after = induction_accuracy(model, batch)
    return after < before - 0.2


def at_fixed_offsets(*offsets):
    """The recheck's D1: the control probe at a few fixed offsets, the scores averaged."""
    def weak(model, layer, head):
        scores = [find_heads(model, repeated_segments(
            64, model.context_length, 8, model.vocab_size, offset=offset,
            generator=torch.Generator().manual_seed(0)).tokens).induction[layer, head]
            for offset in offsets]
        return bool(sum(scores) / len(scores) >= 0.5)

    return weak


@pytest.mark.parametrize(("weak_test", "phrase"), [
    (at_a_fixed_offset(8), "mostly positional head"),
    (at_a_fixed_offset(13), "mostly positional head"),  # passed at 8, 9, 10, 13 and 14 (D1)
    (at_a_fixed_offset(16), "mostly positional head"),  # the last that fits 24 tokens too
    (at_fixed_offsets(13, 14), "mostly positional head"),
    (bos_and_two_copies, "mostly positional head"),
    (too_strict, "accepts a blurrier induction head"),
    (needed_for_copying, "rejects the previous-token head L0H0"),
])
def test_is_induction_head_weak_tests_are_rejected(weak_test, phrase, capsys):
    out = assert_rejected(check_is_induction_head, weak_test, capsys, phrase)
    if "positional" in phrase:
        assert "whatever fixed offset a test uses" in out


def _fresh_positional_score(tokens, queries=None):
    """The induction score of the checker's mostly positional head, built afresh, on tokens."""
    from attention_book.exercises.ch15 import _positional

    with torch.random.fork_rng():
        model = _positional()
    return float(induction_scores(model, tokens, queries=queries)[1, 0])


def _copies_at(offset, batch_size=32, seed=0):
    return repeated_segments(batch_size, 32, 8, 32, offset=offset,
                             generator=torch.Generator().manual_seed(seed))


def test_the_positional_subject_passes_for_an_induction_head_at_every_fixed_offset():
    """D1, at every usable offset at once and without running the checker 17 times: on copies
    at any one fixed offset from 8 to 24 (all that fit 32 tokens with segments of 8) the
    subject scores at least 0.6, and on two neighbouring offsets averaged above 0.5, so a test
    of fixed offsets calls it an induction head and fails the checker; at random offsets it
    stays below 0.47, so a right test rejects it. (Three offsets averaged score 0.55 or more:
    measured when the subject was built, not repeated here.)"""
    offsets = range(8, 25)
    for offset in offsets:
        assert _fresh_positional_score(_copies_at(offset).tokens) >= 0.6, offset
    from attention_book.exercises.ch15 import _positional

    for count in (2,):
        for start in range(8, 26 - count):
            with torch.random.fork_rng():
                model = _positional()
            scores = [float(induction_scores(model, _copies_at(start + i).tokens)[1, 0])
                      for i in range(count)]
            assert sum(scores) / count > 0.5, (start, count, scores)
    for seed in range(3):
        for batch_size, segment_len in ((32, 8), (64, 4)) + (((256, 8),) if seed == 0 else ()):
            batch = repeated_segments(batch_size, 32, segment_len, 32,
                                      generator=torch.Generator().manual_seed(seed))
            assert _fresh_positional_score(batch.tokens) < 0.47, (seed, batch_size)


def test_is_induction_head_blank_or_not_a_bool(capsys):
    assert_fails(check_is_induction_head, unwritten, capsys, "You have not written", sections=())
    assert_fails(check_is_induction_head, lambda model, layer, head: 0.7, capsys, "returns True or False")


# --- generating with a cache ------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models generate fastest on one thread (on a busy machine, by a factor of ten)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def generates_like_full_pass(model):
    generator = torch.Generator().manual_seed(0)
    for prompt_length in (1, 2, model.context_length // 2):
        prompts = torch.randint(0, model.vocab_size, (4, prompt_length), generator=generator)
        new_tokens = model.context_length - prompt_length
        if not torch.equal(model.generate(prompts, new_tokens),
                           model.generate(prompts, new_tokens, use_cache=False)):
            return False
    return True


def by_the_forward_pass(model):
    """Another right answer: each cached choice is the argmax of the full forward pass."""
    generator = torch.Generator().manual_seed(3)
    for prompt_length in (1, 5):
        prompts = torch.randint(0, model.vocab_size, (3, prompt_length), generator=generator)
        generated = model.generate(prompts, model.context_length - prompt_length)
        with torch.no_grad():
            chosen = model(generated[:, :-1]).argmax(dim=-1)[:, prompt_length - 1:]
        if not torch.equal(chosen, generated[:, prompt_length:]):
            return False
    return True


def test_generation_test_right(capsys):
    out = assert_passes(check_generates_like_full_pass, generates_like_full_pass, capsys)
    assert "catches all four broken caches" in out
    assert_passes(check_generates_like_full_pass, by_the_forward_pass, capsys)
    for answer in (generates_like_full_pass, by_the_forward_pass):
        assert passes_hidden_tests(NOTEBOOK, "ch15-ex5-check", generates_like_full_pass=answer)


def _compare(prompt_length, new_tokens, batch=4):
    """A weak test: one prompt length, a fixed number of new tokens."""
    def weak(model):
        prompts = torch.randint(0, model.vocab_size, (batch, prompt_length),
                                generator=torch.Generator().manual_seed(0))
        count = new_tokens or model.context_length - prompt_length
        return torch.equal(model.generate(prompts, count),
                           model.generate(prompts, count, use_cache=False))

    return weak


@pytest.mark.parametrize(("weak_test", "missed", "hint"), [
    (_compare(3, 1), "positions restart at 0", "generate at least two new tokens"),
    (_compare(2, 3), "position 10 or later", "generate until the context is full"),
    # the recheck's D5: three new tokens after a prompt of half the context reach position 8
    (_compare(6, 3), "position 10 or later", "generate until the context is full"),
    (_compare(1, None), "caches only the prompt's last token", "prompts of several tokens"),
    (lambda model: True, "positions restart at 0", "at least two new tokens"),
])
def test_weak_generation_tests_fail_the_checker_and_the_hidden_tests(weak_test, missed, hint,
                                                                   capsys):
    assert_fails(check_generates_like_full_pass, weak_test, capsys, "your test catches", missed,
                 hint)
    assert not passes_hidden_tests(NOTEBOOK, "ch15-ex5-check", generates_like_full_pass=weak_test)


def test_one_prompt_of_half_the_context_gets_one_verdict_from_the_checker_and_the_hidden_tests(
        capsys):
    """The recheck's D5: this test passed the checker and failed the hidden tests, whose
    non-causal model differed from the checker's. They grade the same models now."""
    half_to_the_end = _compare(6, None)
    assert_passes(check_generates_like_full_pass, half_to_the_end, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch15-ex5-check",
                               generates_like_full_pass=half_to_the_end)


def test_a_generation_test_that_compares_the_cache_with_itself(capsys):
    def same_path(model):
        prompts = torch.randint(0, model.vocab_size, (4, 3), generator=torch.Generator().manual_seed(0))
        return torch.equal(model.generate(prompts, 9), model.generate(prompts, 9))

    assert_fails(check_generates_like_full_pass, same_path, capsys, "positions restart at 0")


def test_a_generation_test_that_always_fails_or_returns_a_number(capsys):
    assert_fails(check_generates_like_full_pass, lambda model: False, capsys,
                 "your test accepts a TinyGPT with learned positions")
    assert_fails(check_generates_like_full_pass, lambda model: 1.0, capsys, "returns a bool")


def test_checkers_leave_the_global_random_state_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    check_mean_ablated_logits(mean_ablated_logits)
    check_is_induction_head(is_induction_head_with_own_score)
    check_generates_like_full_pass(generates_like_full_pass)
    assert torch.equal(torch.rand(3), expected)
