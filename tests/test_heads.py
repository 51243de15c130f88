"""Head scores, ablation and the head report, on a model whose heads were set by hand to copy."""

from __future__ import annotations

import pytest
import torch

from attention_book.heads import (
    HeadReport,
    ablate_heads,
    find_heads,
    hand_built_induction_model,
    head_name,
    induction_scores,
    induction_targets,
    previous_token_scores,
)
from attention_book.model import TinyGPT
from attention_book.repeat_task import repeated_segments, train_on_repeats


def _repeated(batch: int = 16, vocab_size: int = 8, seed: int = 0) -> torch.Tensor:
    """``[0, s, s]``: a start token that never recurs, then a permutation of 1..V-1, twice."""
    generator = torch.Generator().manual_seed(seed)
    segments = torch.stack([torch.randperm(vocab_size - 1, generator=generator) + 1
                            for _ in range(batch)])  # (B, V - 1)
    start = torch.zeros(batch, 1, dtype=torch.long)  # (B, 1)
    return torch.cat([start, segments, segments], dim=1)  # (B, 2 V - 1)


def _copy_accuracy(model, tokens: torch.Tensor) -> float:
    """How often the second copy's tokens 2, 3, ... are predicted (the induction task)."""
    half = (tokens.size(1) - 1) // 2
    with torch.no_grad():
        predicted = model(tokens).argmax(-1)  # (B, T)
    return (predicted[:, half + 1:-1] == tokens[:, half + 2:]).double().mean().item()


@pytest.fixture(scope="module")
def copier() -> TinyGPT:
    return hand_built_induction_model(8, 16, dtype=torch.float64)


def test_induction_targets_mark_the_token_after_each_earlier_copy():
    tokens = torch.tensor([[5, 1, 2, 5, 1, 5]])
    targets = induction_targets(tokens)[0]
    expected = {3: [1], 4: [2], 5: [1, 4]}  # query -> keys after an earlier copy
    for query in range(6):
        assert targets[query].nonzero().flatten().tolist() == expected.get(query, []), query
    assert targets.dtype == torch.bool and targets.shape == (6, 6)
    # A repeated token right after itself: the key may be the query itself (j = t - 1).
    assert induction_targets(torch.tensor([[3, 3]]))[0].tolist() == [[False, False], [False, True]]


def test_hand_built_model_has_one_previous_token_head_and_one_induction_head(copier):
    tokens = _repeated()
    previous = previous_token_scores(copier, tokens)
    induction = induction_scores(copier, tokens)
    assert previous.shape == induction.shape == (2, 2)
    # L0H0 and its decoy L0H1 look one token back; L1H0 looks where the copy continues.
    assert previous[0, 0] > 0.99 and previous[0, 1] > 0.99
    assert induction[1, 0] > 0.99
    assert induction[0].max() < 0.2 and induction[1, 1] < 0.2 and previous[1].max() < 0.2
    assert _copy_accuracy(copier, tokens) == 1.0


def test_scores_match_a_direct_count_on_uniform_attention():
    """A model whose heads attend uniformly: previous-token score is the mean of 1 / (t + 1)."""
    torch.manual_seed(0)
    model = TinyGPT(8, 8, 2, 1, 16, dtype=torch.float64)
    with torch.no_grad():
        model.blocks[0].attention.W_query.weight.zero_()  # equal scores: uniform weights
    tokens = _repeated()
    num_tokens = tokens.size(1)
    expected_previous = sum(1 / (t + 1) for t in range(1, num_tokens)) / (num_tokens - 1)
    torch.testing.assert_close(previous_token_scores(model, tokens),
                               torch.full((1, 2), expected_previous, dtype=torch.float64))
    # Each query of the second copy has one target among t + 1 keys.
    half = (num_tokens - 1) // 2
    expected_induction = sum(1 / (t + 1) for t in range(half + 1, num_tokens)) / half
    torch.testing.assert_close(induction_scores(model, tokens),
                               torch.full((1, 2), expected_induction, dtype=torch.float64))


def test_previous_token_score_at_targets_counts_only_the_keys_an_induction_head_reads():
    """A head that looks back one token only at some positions: the two averages differ."""
    torch.manual_seed(0)
    model = TinyGPT(8, 8, 2, 1, 16, dtype=torch.float64).eval()
    tokens = torch.tensor([[1, 2, 3, 4, 1, 5, 6, 7], [5, 5, 6, 7, 5, 2, 3, 4]])
    targets = induction_targets(tokens)
    keys = targets.any(dim=1)  # (B, T): the keys some query targets
    assert keys.nonzero().tolist() == [[0, 1], [1, 1], [1, 2]]  # the keys after a 1 or a 5
    with torch.no_grad():
        _, (weights,) = model(tokens, return_weights=True)  # (B, H, T, T)
    previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, H, T - 1): query t >= 1
    expected = (previous[0, :, 0] + previous[1, :, 0] + previous[1, :, 1]) / 3  # (H,)
    at_targets = previous_token_scores(model, tokens, at_targets=True)
    torch.testing.assert_close(at_targets, expected[None])
    torch.testing.assert_close(previous_token_scores(model, tokens),
                               previous.mean(dim=(0, 2))[None])
    assert not torch.allclose(at_targets, previous_token_scores(model, tokens))
    with pytest.raises(ValueError, match="no key is an induction target"):
        previous_token_scores(model, torch.arange(8)[None], at_targets=True)
    with pytest.raises(TypeError, match="at_targets must be a bool"):
        previous_token_scores(model, tokens, at_targets="yes")


# The chapter's run with other seeds (and with MLPs): every one learns the copy task (accuracy
# near 0.8), but averaged over every position the previous-token head stays below 0.5, because
# it idles at the late positions where no first copy ever lies. Scored where the induction head
# reads it, it is found every time. (Measured: at-targets scores 0.60-0.78 for these seeds.)
@pytest.mark.parametrize(("attention_only", "seed"), [(True, 1), (True, 3), (False, 1)])
def test_find_heads_finds_the_circuit_whatever_the_seed(attention_only, seed):
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(seed)
        model = TinyGPT(32, 32, 2, 2, 32, attention_only=attention_only)
        probe = repeated_segments(256, 32, 8, 32, generator=torch.Generator().manual_seed(1))
        history = train_on_repeats(model, steps=300, batch_size=64, segment_len=8, lr=1e-2,
                                   seed=seed, probe=probe)
    finally:
        torch.set_default_dtype(torch.float32)
    assert history["accuracy"][-1] > 0.75
    everywhere = previous_token_scores(model, probe.tokens)
    assert everywhere[0].max() < 0.5  # the old score would have named no previous-token head
    report = find_heads(model, probe.tokens)
    assert report.has_induction_circuit, report
    assert report.induction_heads == ["L1H0", "L1H1"], report
    torch.testing.assert_close(report.previous_token, history["previous_token"][-1])


def test_induction_scores_need_repeats():
    with pytest.raises(ValueError, match="occurs twice"):
        induction_scores(hand_built_induction_model(), torch.arange(8)[None])
    with pytest.raises(ValueError, match=r"shape \(B, T\) with T >= 2"):
        previous_token_scores(hand_built_induction_model(), torch.zeros(4, dtype=torch.long))


def test_induction_scores_at_chosen_queries(copier):
    """Scored only at the queries of a second copy, the hand-built head still scores 1; a mask
    that keeps no query with a target is refused; a bad mask is named."""
    tokens = _repeated()  # (B, 15): [0, s, s]
    second_copy = torch.zeros_like(tokens, dtype=torch.bool)
    second_copy[:, 8:] = True
    torch.testing.assert_close(induction_scores(copier, tokens, queries=second_copy),
                               induction_scores(copier, tokens))  # only the copy repeats here
    assert induction_scores(copier, tokens, queries=second_copy)[1, 0] > 0.99
    with pytest.raises(ValueError, match="occurs twice"):
        induction_scores(copier, tokens, queries=torch.zeros_like(second_copy))
    with pytest.raises(ValueError, match="the shape of tokens"):
        induction_scores(copier, tokens, queries=second_copy[:, :4])
    with pytest.raises(TypeError, match="bool tensor"):
        induction_scores(copier, tokens, queries=second_copy.long())


def test_scores_leave_training_mode_as_it_was(copier):
    copier.train()
    previous_token_scores(copier, _repeated())
    assert copier.training
    copier.eval()


@pytest.mark.parametrize(("heads", "breaks"), [
    (["L0H0"], True), ([(1, 0)], True), (["L0H1"], False), ([(1, 1)], False),
    (["L0H1", "L1H1"], False),
])
def test_ablating_a_head_of_the_circuit_breaks_copying(copier, heads, breaks):
    tokens = _repeated()
    with ablate_heads(copier, heads):
        accuracy = _copy_accuracy(copier, tokens)
    assert (accuracy < 0.5) == breaks, accuracy
    assert _copy_accuracy(copier, tokens) == 1.0  # the hooks are gone


def test_ablation_zeroes_only_the_named_heads_output():
    torch.manual_seed(0)
    model = TinyGPT(8, 8, 2, 1, 8, dtype=torch.float64).eval()
    attention = model.blocks[0].attention
    seen = []
    # A forward hook sees the input that forward received, after every pre-hook.
    handle = attention.out_proj.register_forward_hook(
        lambda module, inputs, output: seen.append(inputs[0]))
    tokens = _repeated(2, 4)
    with torch.no_grad():
        model(tokens)
        with ablate_heads(model, ["L0H1"]):
            model(tokens)
    handle.remove()
    plain, ablated = seen
    assert torch.equal(ablated[..., :4], plain[..., :4])
    assert torch.all(ablated[..., 4:] == 0) and not torch.all(plain[..., 4:] == 0)


@pytest.mark.parametrize(("heads", "match"), [
    (["L2H0"], "layer 2 does not exist"), ([(0, 5)], "head 5 does not exist"),
    (["layer0"], "looks like 'L1H2'"),
])
def test_ablation_names_heads_that_do_not_exist(copier, heads, match):
    with pytest.raises(ValueError, match=match), ablate_heads(copier, heads):
        pass


def test_find_heads_reports_the_circuit_by_name(copier):
    report = find_heads(copier, _repeated())
    assert isinstance(report, HeadReport)
    assert report.previous_token_heads == ["L0H0", "L0H1"]
    assert report.induction_heads == ["L1H0"]
    assert report.has_induction_circuit
    table = str(report)
    assert "L1H0" in table and "induction head" in table
    assert table.splitlines()[-1] == "previous-token heads: L0H0, L0H1; induction heads: L1H0"


def test_a_report_without_a_layer_order_has_no_circuit():
    report = HeadReport(torch.tensor([[0.1, 0.1], [0.9, 0.1]]),
                        torch.tensor([[0.8, 0.1], [0.1, 0.1]]))
    assert report.previous_token_heads == ["L1H0"] and report.induction_heads == ["L0H0"]
    assert not report.has_induction_circuit
    assert "induction heads: L0H0" in str(report)
    with pytest.raises(ValueError, match="threshold"):
        find_heads(hand_built_induction_model(), _repeated(), threshold=0)


def test_head_names():
    assert head_name(1, 2) == "L1H2"


def test_hand_built_model_checks_its_sizes():
    with pytest.raises(ValueError, match=r"context_length \(30\) must be at most 3 \* vocab_size"):
        hand_built_induction_model(8, 30)
    model = hand_built_induction_model(5, 10)
    assert model.d_model == 26 and model.num_heads == 2  # 3 * 5 + 10 = 25, made even
