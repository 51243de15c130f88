"""``attention_book.diagnose``: every bug of the zoo fails exactly its check; the book passes.

Also: the report's API and table, determinism, robustness to crashing code, the adapters,
and chapter 11's exercise checkers (a right answer passes, typical wrong ones explain).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attention_book
from attention_book import bug_zoo
from attention_book.diagnose import (
    CHECKS,
    additive_mask_adapter,
    blocked_mask_adapter,
    diagnose,
    torch_multihead_adapter,
)
from attention_book.fused import fused_attention

# ----------------------------------------------------------------------------- the bug zoo


def test_the_zoo_covers_every_bug_of_the_chapter():
    assert len(bug_zoo.BUGS) >= 10
    exposed = {bug.check for bug in bug_zoo.BUGS.values()}
    assert exposed <= set(CHECKS)
    # Ten different properties expose the zoo's thirteen bugs.
    assert len(exposed) >= 10


@pytest.mark.parametrize("name", list(bug_zoo.BUGS))
def test_each_bug_fails_exactly_its_check(name):
    bug = bug_zoo.BUGS[name]
    report = diagnose(bug.build())
    assert report.failed == [bug.check], str(report)
    assert not report.ok
    result = report[bug.check]
    assert result.status == "FAIL" and result.evidence and result.hint


def test_a_failed_basic_check_leaves_dependent_checks_unjudged():
    report = diagnose(bug_zoo.attention_softmax_over_queries)
    for name in ("scale", "weights_sum", "matches_reference"):
        assert report[name].status == "n/a"
        assert "fix softmax_dim first" in report[name].evidence


# ----------------------------------------------------------------------------- healthy code


def _seeded(factory):
    torch.manual_seed(0)
    return factory()


HEALTHY = {
    "book function": lambda: attention_book.scaled_dot_product_attention,
    "torch sdpa": lambda: F.scaled_dot_product_attention,
    "zoo function": lambda: bug_zoo.healthy_attention,
    "SelfAttention": lambda: attention_book.SelfAttention(6, 8),
    "CausalSelfAttention": lambda: attention_book.CausalSelfAttention(6, 8, 8),
    "CausalSelfAttention dropout": lambda: attention_book.CausalSelfAttention(6, 8, 8, 0.3),
    "MHA naive": lambda: attention_book.MultiHeadAttention(6, 8, 2, context_length=8),
    "MHA sdpa": lambda: attention_book.MultiHeadAttention(6, 8, 2, context_length=8,
                                                          backend="sdpa"),
    "MHA naive dropout": lambda: attention_book.MultiHeadAttention(
        6, 8, 2, context_length=8, dropout=0.2),
    "MHA sdpa dropout": lambda: attention_book.MultiHeadAttention(
        6, 8, 2, context_length=8, dropout=0.2, backend="sdpa"),
    "MHA non-causal": lambda: attention_book.MultiHeadAttention(6, 8, 2, causal=False),
    "MHA sdpa non-causal": lambda: attention_book.MultiHeadAttention(
        6, 8, 2, causal=False, backend="sdpa"),
    "GQA naive": lambda: attention_book.GroupedQueryAttention(6, 8, 4, 2, context_length=8),
    "GQA sdpa": lambda: attention_book.GroupedQueryAttention(6, 8, 4, 2, context_length=8,
                                                             backend="sdpa"),
    "MQA": lambda: attention_book.GroupedQueryAttention(6, 8, 4, 1, context_length=8),
    "wrapper": lambda: attention_book.MultiHeadAttentionWrapper(6, 4, 8, 0.0, 2),
    "zoo causal": lambda: bug_zoo.HealthyCausalAttention(6, 8, 8, 0.5),
    "zoo multi-head": lambda: bug_zoo.HealthyMultiHeadAttention(6, 8, 8, 2),
    # Chapter 13: layers with a learned sink, and multi-head latent attention.
    "MHA sink": lambda: attention_book.MultiHeadAttention(6, 8, 2, context_length=8, sink=True),
    "MHA sdpa sink dropout": lambda: attention_book.MultiHeadAttention(
        6, 8, 2, context_length=8, dropout=0.2, backend="sdpa", sink=True),
    "GQA sink": lambda: attention_book.GroupedQueryAttention(6, 8, 4, 2, context_length=8,
                                                             sink=True),
    "MQA sdpa sink non-causal": lambda: attention_book.GroupedQueryAttention(
        6, 8, 4, 1, causal=False, backend="sdpa", sink=True),
    "MLA": lambda: attention_book.MultiHeadLatentAttention(6, 8, 2, 4, context_length=8),
    "MLA sdpa": lambda: attention_book.MultiHeadLatentAttention(6, 8, 2, 4, context_length=8,
                                                                backend="sdpa"),
    "MLA sink dropout": lambda: attention_book.MultiHeadLatentAttention(
        6, 8, 2, 4, context_length=8, dropout=0.2, sink=True),
}


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_implementations_pass_every_applicable_check(name):
    report = diagnose(_seeded(HEALTHY[name]))
    assert report.ok, str(report)
    assert report.failed == []
    # The core properties are judged, not skipped, for every one of them.
    for check in ("returns_output", "softmax_dim", "scale", "batch", "lengths"):
        assert report[check].status == "pass", str(report)
    assert len(report.passed) + len(report.not_applicable) == len(CHECKS)


@pytest.mark.parametrize("name", ["book function", "torch sdpa"])
def test_functions_have_every_mask_check_judged(name):
    report = diagnose(HEALTHY[name]())
    for check in ("mask_argument", "mask_polarity", "padding", "fully_masked_rows",
                  "weights_sum", "matches_reference"):
        assert report[check].status == "pass", str(report)
    for check in ("causality", "dropout_eval", "dropout_train", "head_mixing"):
        assert report[check].status == "n/a"
        assert check not in report.failed


@pytest.mark.parametrize("name", ["MHA naive dropout", "MHA sdpa dropout", "GQA sdpa"])
def test_causal_multi_head_modules_have_structure_checks_judged(name):
    report = diagnose(_seeded(HEALTHY[name]))
    for check in ("causality", "head_mixing", "mask_polarity", "padding", "matches_reference"):
        assert report[check].status == "pass", str(report)
    if "dropout" in name:
        assert report["dropout_train"].status == "pass"


def test_non_causal_module_reports_causality_as_not_applicable():
    report = diagnose(_seeded(HEALTHY["SelfAttention"]))
    assert report["causality"].status == "n/a"
    assert "causality" in report.not_applicable and "causality" not in report.failed


def test_causal_flag_can_be_overridden():
    # Declared causal, SelfAttention is caught seeing the future.
    report = diagnose(_seeded(HEALTHY["SelfAttention"]), causal=True)
    assert report.failed == ["causality"]


# ----------------------------------------------------------------------------- the report


def test_report_prints_a_deterministic_table():
    first = str(diagnose(bug_zoo.attention_masked_with_zero))
    second = str(diagnose(bug_zoo.attention_masked_with_zero))
    assert first == second
    lines = first.splitlines()
    assert lines[0].startswith("diagnose: attention_masked_with_zero")
    assert lines[1].split() == ["check", "result", "evidence"]
    assert "hint:" in first
    assert lines[-1].endswith("failed: padding")
    assert repr(diagnose(bug_zoo.attention_masked_with_zero)) == first


def test_report_rows_follow_the_check_list():
    report = diagnose(attention_book.scaled_dot_product_attention)
    assert [r.name for r in report.results] == list(CHECKS)
    assert report["scale"].property == CHECKS["scale"]
    with pytest.raises(KeyError, match="no check named"):
        report["no_such_check"]


def test_diagnose_leaves_global_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    layer = bug_zoo.HealthyCausalAttention(6, 8, 8, 0.5)
    layer.train()
    torch.manual_seed(123)
    diagnose(layer)
    assert torch.equal(torch.rand(3), expected)
    assert layer.training
    assert torch.get_num_threads() == threads


def test_diagnose_is_fast():
    layer = _seeded(HEALTHY["MHA naive dropout"])
    start = time.perf_counter()
    diagnose(layer)
    diagnose(attention_book.scaled_dot_product_attention)
    assert time.perf_counter() - start < 4.0


# ----------------------------------------------------------------------------- robustness


def test_an_exception_in_user_code_becomes_a_failed_row():
    def crashes(query, key, value, mask=None):
        raise RuntimeError("shapes do not match in my code")

    report = diagnose(crashes)
    assert report.failed == ["returns_output"]
    assert "RuntimeError: shapes do not match in my code" in report["returns_output"].evidence


def test_an_exception_only_with_a_mask_fails_only_the_mask_argument_check():
    def no_mask_support(query, key, value, mask=None):
        if mask is not None:
            raise TypeError("mask not supported")
        return F.scaled_dot_product_attention(query, key, value)

    report = diagnose(no_mask_support)
    assert report.failed == ["mask_argument"]
    assert "TypeError: mask not supported" in report["mask_argument"].evidence


def test_a_crashing_module_is_reported_not_raised():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.W_query = nn.Linear(6, 8)

        def forward(self, x):
            return x @ torch.ones(3, 3)

    report = diagnose(Broken())
    assert report.failed == ["returns_output"]
    assert "RuntimeError" in report["returns_output"].evidence


def test_returning_the_weights_is_caught_by_the_shape():
    def returns_weights(query, key, value, mask=None):
        return attention_book.scaled_dot_product_attention(query, key, value, mask)[1]

    report = diagnose(returns_weights)
    assert report.failed == ["returns_output"]
    assert "the shape of the weights" in report["returns_output"].evidence


def test_a_function_without_mask_support_skips_the_mask_checks():
    report = diagnose(lambda query, key, value: F.scaled_dot_product_attention(query, key, value))
    assert report.ok
    for check in ("mask_argument", "mask_polarity", "padding", "fully_masked_rows"):
        assert report[check].status == "n/a"


def test_scale_by_head_dim_instead_of_its_root_is_named():
    def scaled_by_head_dim(query, key, value, mask=None):
        return F.scaled_dot_product_attention(query, key, value, mask,
                                              scale=1 / query.size(-1))

    report = diagnose(scaled_by_head_dim)
    assert report.failed == ["scale"]
    assert "1/sqrt(64)" in report["scale"].evidence
    assert "head_dim squared" in report["scale"].evidence


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="attention function or an nn.Module"):
        diagnose(42)
    with pytest.raises(ValueError, match="num_tokens must be >= 3"):
        diagnose(F.scaled_dot_product_attention, num_tokens=2)
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        diagnose(F.scaled_dot_product_attention, head_dim=0)


# ----------------------------------------------------------------------------- adapters


def test_additive_mask_adapter_with_torch_sdpa_passes():
    report = diagnose(additive_mask_adapter(F.scaled_dot_product_attention))
    assert report.ok and report["padding"].status == "pass"


def test_blocked_mask_adapter_turns_polarity_around():
    def blocked_is_true(query, key, value, mask=None):
        allowed = None if mask is None else ~mask
        return F.scaled_dot_product_attention(query, key, value, allowed)

    assert diagnose(blocked_is_true).failed == ["mask_polarity"]
    assert diagnose(blocked_mask_adapter(blocked_is_true)).ok


def test_torch_multihead_adapter_finds_nan_on_fully_masked_rows():
    torch.manual_seed(0)
    layer = nn.MultiheadAttention(8, 2, batch_first=True)
    report = diagnose(torch_multihead_adapter(layer, causal=True))
    for check in ("returns_output", "mask_polarity", "padding", "causality", "weights_sum"):
        assert report[check].status == "pass", str(report)
    # PyTorch's layer returns NaN for a query whose every key is masked.
    assert report.failed == ["fully_masked_rows"]
    with pytest.raises(TypeError, match="MultiheadAttention"):
        torch_multihead_adapter(nn.Linear(2, 2))


def test_zoo_source_keeps_code_and_cuts_docstrings():
    text = bug_zoo.source(bug_zoo.attention_inverted_mask)
    assert text.startswith("def attention_inverted_mask(")
    assert "masked_fill(mask, float(\"-inf\"))  # BUG" in text
    assert "Args:" not in text and "Broken attention" in text
    method = bug_zoo.source(bug_zoo.CausalDropoutInEval.forward)
    assert method.startswith("def forward(self, x):") and "# BUG" in method


def test_dropout_train_fails_a_layer_whose_training_outputs_are_nan():
    """A NaN never compares above a threshold: the check must look for it explicitly."""

    class NaNInTraining(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = attention_book.MultiHeadAttention(6, 8, 2, context_length=8, dropout=0.5)

        def forward(self, x):
            out = self.inner(x)
            return out * float("nan") if self.training else out

    torch.manual_seed(0)
    report = diagnose(NaNInTraining())
    assert report.failed == ["dropout_train"], str(report)
    assert "NaN" in report["dropout_train"].evidence


# ----------------------------------------------------------------------------- attention sinks


@pytest.mark.parametrize("name", list(HEALTHY))
def test_the_sink_check_is_judged_exactly_for_code_with_a_sink(name):
    subject = _seeded(HEALTHY[name])
    report = diagnose(subject)
    has_sink = "sink" in name or subject is attention_book.scaled_dot_product_attention
    assert report["sink_denominator"].status == ("pass" if has_sink else "n/a"), str(report)
    if "sink" in name:
        # Its rows sum to less than 1 by design: the sink check judges them instead.
        assert report["weights_sum"].status == "n/a"
        assert "sink_denominator judges the rows" in report["weights_sum"].evidence


def _sink_renormalised(query, key, value, mask=None, sink_logit=None):
    """Broken: the sink joins the softmax, then the weights are renormalised to sum to 1."""
    output, weights = attention_book.scaled_dot_product_attention(
        query, key, value, mask, sink_logit=sink_logit)
    if sink_logit is not None:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights @ value, weights


def _fused_with_sink(query, key, value, mask=None, sink_logit=None):
    """Healthy, and returns no weights: the sink as one more key of zeros, biased by the sink."""
    if sink_logit is None:
        return F.scaled_dot_product_attention(query, key, value, mask)
    return fused_attention(query, key, value, mask, sink_logit=sink_logit)


def _sigmoid_without_weights(query, key, value, mask=None, sink_logit=None):
    return bug_zoo.attention_sink_as_sigmoid(query, key, value, mask, sink_logit)[0]


def test_sink_bugs_are_named_by_what_the_rows_sum_to():
    renormalised = diagnose(_sink_renormalised)
    assert renormalised.failed == ["sink_denominator"], str(renormalised)
    assert "still sum to 1" in renormalised["sink_denominator"].evidence
    gated = diagnose(bug_zoo.attention_sink_as_sigmoid)["sink_denominator"]
    assert "whatever its scores" in gated.evidence and "sigmoid gate" in gated.evidence
    # A function that returns no weights is judged by shifting its values.
    assert diagnose(_fused_with_sink).ok
    assert "shifting" not in diagnose(_fused_with_sink)["sink_denominator"].evidence
    hidden = diagnose(_sigmoid_without_weights)
    assert hidden.failed == ["sink_denominator"], str(hidden)
    assert "whatever its scores" in hidden["sink_denominator"].evidence


class _SigmoidSinkLayer(nn.Module):
    """Broken two-head causal layer with a learned sink applied as a sigmoid gate."""

    def __init__(self):
        super().__init__()
        self.d_in, self.d_out, self.num_heads, self.head_dim = 6, 8, 2, 4
        self.context_length, self.causal = 8, True
        self.W_query, self.W_key, self.W_value = (nn.Linear(6, 8, bias=False) for _ in range(3))
        self.out_proj = nn.Linear(8, 8)
        self.sink_logit = nn.Parameter(torch.tensor([0.5, -0.5]))

    def forward(self, x, mask=None, return_weights=False):
        batch, num_tokens, _ = x.shape
        if num_tokens > self.context_length:
            raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")

        def heads(linear):
            return linear(x).view(batch, num_tokens, 2, 4).transpose(1, 2)  # (B, 2, T, 4)

        scores = heads(self.W_query) @ heads(self.W_key).transpose(-2, -1) / 2.0  # (B, 2, T, T)
        allowed = attention_book.causal_mask(num_tokens)
        if mask is not None:
            allowed = allowed & mask
        weights = attention_book.softmax(scores.masked_fill(~allowed, float("-inf")))
        weights = weights * torch.sigmoid(-self.sink_logit)[:, None, None]  # the bug
        context = (weights @ heads(self.W_value)).transpose(1, 2).reshape(batch, num_tokens, 8)
        output = self.out_proj(context)
        return (output, weights) if return_weights else output


def test_a_layer_whose_sink_is_a_sigmoid_gate_fails_only_the_sink_check():
    report = diagnose(_seeded(_SigmoidSinkLayer))
    assert report.failed == ["sink_denominator"], str(report)
    assert "whatever its scores" in report["sink_denominator"].evidence
    assert report["matches_reference"].evidence == "not judged: fix sink_denominator first"
