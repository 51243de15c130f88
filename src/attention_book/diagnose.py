"""Property checks for attention implementations: ``diagnose(fn_or_module)``.

``diagnose`` runs a fixed list of property checks against an attention
*function* ``(query, key, value[, mask]) -> output`` or an attention *module*
``x -> output`` (the book's calling conventions) and returns a
:class:`DiagnosisReport`. The report prints as a table (check, result,
evidence, hint) and code can read it: ``report.ok`` and ``report.failed``.

Design rules, so that one bug makes exactly one check fail:

* every check tests one property on inputs chosen so that the other
  properties do not matter (the scale check fits the scale, the mask checks
  use masks built so that a wrong scale cannot hide them, ...);
* a check that would only fail *because* a more basic check failed is not
  judged: it is reported as ``n/a`` with "fix ``<check>`` first"
  (``matches_reference``, the catch-all, is judged only when every other
  check passed or did not apply);
* a check that does not apply (no weights returned, a function has no
  train/eval mode, a module takes no mask, a non-causal module has no
  causality to check) is reported as ``n/a`` and is not in ``report.failed``.

Every random draw uses a fixed seed inside ``diagnose`` and the global random
state is restored afterwards, so the printed report is the same on every run.
An exception raised by the code under test becomes a failed row that quotes
the error; ``diagnose`` itself never raises because of a broken implementation.

Taught in chapter 11.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .attention import causal_mask, scaled_dot_product_attention, softmax

__all__ = [
    "CHECKS",
    "CheckResult",
    "DiagnosisReport",
    "diagnose",
    "additive_mask_adapter",
    "blocked_mask_adapter",
    "torch_multihead_adapter",
]

PASS, FAIL, NA = "pass", "FAIL", "n/a"

# Outputs of the small test inputs are of order 1: differences below ATOL are
# float32 rounding, differences above it are real.
ATOL = 1e-5

#: Every check, in the order of the report, with the property it tests.
CHECKS: dict[str, str] = {
    "returns_output": "returns the attention output (not the values or the weights)",
    "dropout_eval": "no randomness in eval mode (dropout off)",
    "softmax_dim": "softmax taken over the keys (the last dim)",
    "head_mixing": "heads split with view + transpose, not a bare view",
    "scale": "scores scaled by 1/sqrt(head_dim)",
    "mask_argument": "the output follows the mask that is passed",
    "mask_polarity": "mask True means 'may attend'",
    "padding": "masked (padding) tokens get exactly zero weight",
    "fully_masked_rows": "a fully masked row gives no NaN",
    "causality": "changing token j leaves the outputs before j unchanged",
    "weights_sum": "each row of the attention weights sums to 1",
    "dropout_train": "dropout active in training, expectation preserved",
    "batch": "batch size 1 and >1 agree; batch items stay independent",
    "lengths": "short inputs work; a clear error past context_length",
    "matches_reference": "output equals a reference recomputation",
}

# A check is judged only if none of the checks it needs failed.
_NEEDS: dict[str, tuple[str, ...]] = {
    "dropout_eval": ("returns_output",),
    "softmax_dim": ("returns_output", "dropout_eval"),
    "head_mixing": ("returns_output", "dropout_eval"),
    "scale": ("returns_output", "dropout_eval", "softmax_dim", "head_mixing"),
    "mask_argument": ("returns_output", "dropout_eval"),
    "mask_polarity": ("returns_output", "dropout_eval", "mask_argument", "head_mixing"),
    "padding": ("returns_output", "dropout_eval", "mask_argument", "mask_polarity", "head_mixing"),
    "fully_masked_rows": ("returns_output", "dropout_eval", "mask_argument", "mask_polarity"),
    "causality": ("returns_output", "dropout_eval", "mask_polarity", "head_mixing"),
    "weights_sum": (
        "returns_output", "dropout_eval", "softmax_dim", "mask_argument", "mask_polarity",
        "head_mixing",
    ),
    "dropout_train": ("returns_output", "dropout_eval"),
    "batch": ("returns_output", "dropout_eval", "softmax_dim", "head_mixing", "scale"),
    "lengths": ("returns_output", "dropout_eval"),
}

_HINTS: dict[str, str] = {
    "returns_output": (
        "return softmax(scores) @ value (and optionally the weights); not value, "
        "not the weights, not the projected values"
    ),
    "dropout_eval": (
        "apply dropout only in training: nn.Dropout follows module.eval(), but "
        "F.dropout(x, p) defaults to training=True; pass training=self.training"
    ),
    "softmax_dim": (
        "normalise over the keys: softmax(scores, dim=-1), so that each query's "
        "weights sum to 1"
    ),
    "head_mixing": (
        "split heads with x.view(B, T, num_heads, head_dim).transpose(1, 2); a bare "
        "view(B, num_heads, T, head_dim) mixes tokens and features"
    ),
    "scale": (
        "divide the scores by sqrt(head_dim), the size of one query vector "
        "(query.size(-1) after the head split)"
    ),
    "mask_argument": (
        "use the mask passed as an argument; a mask taken from an outer variable "
        "only works for the example it was built for"
    ),
    "mask_polarity": (
        "True must mean 'may attend': scores.masked_fill(~mask, float('-inf')); for "
        "a causal mask use torch.tril (allowed) and fill where it is False"
    ),
    "padding": (
        "fill masked scores with float('-inf') *before* the softmax; 0 is an "
        "ordinary score and still gets weight"
    ),
    "fully_masked_rows": (
        "a row of only -inf makes torch.softmax return NaN: use a softmax that returns "
        "zeros there (attention_book.softmax) or replace NaN rows with 0"
    ),
    "causality": (
        "mask every key j > i for query i before the softmax, with -inf, using a mask "
        "sliced to the current length"
    ),
    "weights_sum": (
        "mask by setting scores to -inf *before* the softmax; zeroing weights after "
        "it leaves rows that no longer sum to 1"
    ),
    "dropout_train": (
        "apply dropout to the weights *after* the softmax (nn.Dropout rescales the "
        "survivors by 1/(1-p), which keeps the expectation)"
    ),
    "batch": "keep the batch dim separate: never mix or squeeze it",
    "lengths": (
        "slice the mask buffer to the input length (mask[:T, :T]), build it with "
        "context_length, and raise ValueError naming T and context_length past it"
    ),
    "matches_reference": (
        "compare your code line by line with attention_book.scaled_dot_product_attention"
    ),
}


@dataclass
class CheckResult:
    """One row of a :class:`DiagnosisReport`.

    Args:
        name: the check's name (a key of :data:`CHECKS`).
        status: ``"pass"``, ``"FAIL"`` or ``"n/a"``.
        evidence: what was measured (max error, shapes, the offending row).
        hint: how to fix a failure (empty unless the check failed).

    Taught in chapter 11.
    """

    name: str
    status: str
    evidence: str
    hint: str = ""

    @property
    def property(self) -> str:
        """The property this check tests, in words."""
        return CHECKS[self.name]


@dataclass
class DiagnosisReport:
    """The result of :func:`diagnose`: one :class:`CheckResult` per check.

    Prints as a table: check, result, evidence, and for a failed check the
    property it expected and a hint. ``ok`` is True only when no check failed, ``failed``
    lists the failed checks' names and ``not_applicable`` the skipped ones.

    Args:
        subject: what was diagnosed, in words (the table's first line).
        results: one row per check, in the order of :data:`CHECKS`.

    Returns:
        ``str(report)`` is the table; ``report[name]`` is one :class:`CheckResult`.

    Taught in chapter 11.
    """

    subject: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check passed or did not apply."""
        return not self.failed

    @property
    def failed(self) -> list[str]:
        """Names of the failed checks, in report order."""
        return [r.name for r in self.results if r.status == FAIL]

    @property
    def passed(self) -> list[str]:
        """Names of the passed checks, in report order."""
        return [r.name for r in self.results if r.status == PASS]

    @property
    def not_applicable(self) -> list[str]:
        """Names of the checks that did not apply or were not judged."""
        return [r.name for r in self.results if r.status == NA]

    def __getitem__(self, name: str) -> CheckResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"no check named {name!r}; the checks are {list(CHECKS)}")

    def __str__(self) -> str:
        name_width = max(len(n) for n in CHECKS)
        evidence_width = 64
        lines = [
            f"diagnose: {self.subject}",
            f"{'check':<{name_width}}  result  evidence",
            f"{'-' * name_width}  ------  {'-' * evidence_width}",
        ]
        indent = " " * (name_width + 10)
        for r in self.results:
            body = textwrap.wrap(r.evidence, evidence_width) or [""]
            lines.append(f"{r.name:<{name_width}}  {r.status:<6}  {body[0]}")
            lines.extend(indent + line for line in body[1:])
            if r.status == FAIL:
                for label, text in (("expected", r.property), ("hint", r.hint)):
                    wrapped = textwrap.wrap(f"{label}: {text}", evidence_width)
                    lines.extend(indent + line for line in wrapped)
        summary = f"{len(self.passed)} passed, {len(self.failed)} failed"
        summary += f", {len(self.not_applicable)} n/a (not applicable or not judged)"
        if self.failed:
            summary += " -- failed: " + ", ".join(self.failed)
        lines.append(summary)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


class _UserError(Exception):
    """An exception raised inside the code under test."""


class _NotApplicable(Exception):
    """The check does not apply to this implementation."""


class _Failed(Exception):
    """The property does not hold; the message is the evidence."""


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference; NaN anywhere counts as infinitely different."""
    diff = (a.detach().double() - b.detach().double()).abs()
    if torch.isnan(diff).any():
        return math.inf
    return diff.max().item() if diff.numel() else 0.0


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and _max_diff(a, b) <= ATOL


def _describe_error(error: Exception) -> str:
    message = str(error).strip().splitlines()
    first = message[0] if message else ""
    return f"{type(error).__name__}: {first}"[:200]


def _unpack(result) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split a return value into (output, weights or None)."""
    weights = None
    if isinstance(result, (tuple, list)):
        if not result:
            raise _Failed("returned an empty tuple")
        if len(result) > 1 and isinstance(result[1], torch.Tensor):
            weights = result[1]
        result = result[0]
    if not isinstance(result, torch.Tensor):
        raise _Failed(f"returned {type(result).__name__}, not a tensor")
    return result, weights


# ----------------------------------------------------------------------------
# The two calling conventions.
# ----------------------------------------------------------------------------


def _accepts(fn: Callable, names: tuple[str, ...], position: int) -> bool | None:
    """Whether ``fn`` has a parameter named in ``names`` or a positional one at ``position``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.name in names for p in params):
        return True
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) > position


class _FunctionSubject:
    """Calls ``fn(query, key, value[, mask])``."""

    kind = "function"

    def __init__(self, fn: Callable, head_dim: int, batch_size: int, num_tokens: int):
        self.fn = fn
        self.head_dim = head_dim
        self.batch_size = batch_size
        self.num_tokens = num_tokens
        takes_mask = _accepts(fn, ("mask", "attn_mask", "attention_mask"), 3)
        # A builtin such as torch's scaled_dot_product_attention has no signature;
        # it takes the mask as its fourth positional argument.
        self.takes_mask = True if takes_mask is None else takes_mask
        self.causal = False
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def describe(self) -> str:
        return f"{self.name}, a function (query, key, value[, mask]) -> output"

    def call(self, q, k, v, mask=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        try:
            result = self.fn(q, k, v) if mask is None else self.fn(q, k, v, mask)
        except Exception as error:  # noqa: BLE001 - the user's error becomes evidence
            raise _UserError(_describe_error(error)) from None
        return _unpack(result)

    def inputs(self, batch_size=None, num_queries=None, num_keys=None, seed=0):
        batch_size = batch_size or self.batch_size
        num_queries = num_queries or self.num_tokens
        num_keys = num_keys or num_queries
        gen = torch.Generator().manual_seed(seed)
        shape_q = (batch_size, num_queries, self.head_dim)
        shape_k = (batch_size, num_keys, self.head_dim)
        q = torch.randn(shape_q, generator=gen)  # (B, T_q, head_dim)
        k = torch.randn(shape_k, generator=gen)  # (B, T_k, head_dim)
        v = torch.randn(shape_k, generator=gen)  # (B, T_k, head_dim)
        return q, k, v


class _ModuleSubject:
    """Calls ``module(x[, mask])`` in eval mode unless a check asks for training."""

    kind = "module"

    def __init__(self, module: nn.Module, causal, context_length, d_in, batch_size, num_tokens):
        self.module = module
        self.name = type(module).__name__
        self.batch_size = batch_size
        self.causal = _find_causal(module) if causal is None else bool(causal)
        self.context_length = (
            _find_attr(module, "context_length") if context_length is None else context_length
        )
        self.d_in = _find_d_in(module) if d_in is None else d_in
        if self.context_length is not None:
            num_tokens = max(2, min(num_tokens, int(self.context_length)))
        self.num_tokens = num_tokens
        forward = module.forward
        self.takes_mask = bool(_accepts(forward, ("mask", "attn_mask", "attention_mask"), 1))
        self.takes_return_weights = bool(_accepts(forward, ("return_weights",), 99))
        self.dropout_p = _find_dropout(module)

    def describe(self) -> str:
        kind = "a causal module" if self.causal else "a non-causal module"
        extra = f", context_length={self.context_length}" if self.context_length else ""
        return f"{self.name}, {kind} x -> output (d_in={self.d_in}{extra})"

    def call(self, x, mask=None, return_weights=False):
        kwargs = {"return_weights": True} if return_weights else {}
        try:
            result = self.module(x, **kwargs) if mask is None else self.module(x, mask, **kwargs)
        except Exception as error:  # noqa: BLE001 - the user's error becomes evidence
            raise _UserError(_describe_error(error)) from None
        return _unpack(result)

    def inputs(self, batch_size=None, num_tokens=None, seed=0):
        batch_size = batch_size or self.batch_size
        num_tokens = num_tokens or self.num_tokens
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, num_tokens, self.d_in, generator=gen)  # (B, T, d_in)


def _find_attr(module: nn.Module, name: str):
    for sub in module.modules():
        value = getattr(sub, name, None)
        if value is not None and not isinstance(value, (nn.Module, torch.Tensor)):
            return value
    return None


def _find_causal(module: nn.Module) -> bool:
    declared = getattr(module, "causal", None)
    if isinstance(declared, bool):
        return declared
    return any(isinstance(getattr(sub, "mask", None), torch.Tensor) for sub in module.modules())


def _find_d_in(module: nn.Module) -> int:
    d_in = _find_attr(module, "d_in")
    if isinstance(d_in, int):
        return d_in
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            return sub.in_features
    raise ValueError(
        f"cannot tell the input size of {type(module).__name__}: pass diagnose(..., d_in=...)"
    )


def _find_dropout(module: nn.Module) -> float:
    for sub in module.modules():
        if isinstance(sub, nn.Dropout) and sub.p > 0:
            return float(sub.p)
        for name in ("dropout_p", "dropout"):
            value = getattr(sub, name, None)
            if isinstance(value, float) and value > 0:
                return value
    return 0.0


# ----------------------------------------------------------------------------
# References: the book's attention under hypotheses (scale, softmax dim, split).
# ----------------------------------------------------------------------------


def _attend(q, k, v, allowed, scales, dim: int):
    """Attention for several scales at once: returns ``(S, ..., T_q, d_v)``."""
    scores = q @ k.transpose(-2, -1)  # (..., T_q, T_k)
    scores = scores.unsqueeze(0) * scales.view(-1, *([1] * scores.dim()))  # (S, ..., T_q, T_k)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    dim = dim if dim >= 0 else scores.dim() + dim
    if dim == 0:  # the batch dim of the inputs sits after the scales dim
        dim = 1
    weights = softmax(scores, dim=dim)  # (S, ..., T_q, T_k)
    return weights @ v  # (S, ..., T_q, d_v)


class _Hypothesis:
    """A way to compute attention: ``outputs(scales) -> (S, *output shape)``."""

    def __init__(self, label: str, outputs: Callable, split: str, dim: int):
        self.label = label
        self.outputs = outputs
        self.split = split
        self.dim = dim


def _fit_scale(hypothesis: _Hypothesis, target: torch.Tensor) -> tuple[float, float]:
    """The scale that makes ``hypothesis`` closest to ``target`` and the residual there."""
    target = target.detach().double()
    low, high = math.log(1e-4), math.log(1e2)
    best = 0.0
    for _ in range(4):
        log_scales = torch.linspace(low, high, 161, dtype=torch.float64)
        outs = hypothesis.outputs(log_scales.exp())
        resid = (outs - target).abs().flatten(1).amax(dim=1)
        resid = torch.nan_to_num(resid, nan=math.inf)
        i = int(resid.argmin())
        best = log_scales[i].item()
        step = (high - low) / 160
        low, high = best - step, best + step
    final = hypothesis.outputs(torch.tensor([math.exp(best)], dtype=torch.float64))
    return math.exp(best), _max_diff(final[0], target)


def _fit(hypotheses: list[_Hypothesis], target: torch.Tensor) -> list[tuple[_Hypothesis, float]]:
    """The hypotheses that reproduce ``target`` at some scale, with that scale."""
    fitting = []
    tol = 1e-4 * (1.0 + target.detach().abs().max().item())
    for hypothesis in hypotheses:
        scale, resid = _fit_scale(hypothesis, target)
        if resid <= tol:
            fitting.append((hypothesis, scale))
    return fitting


def _function_hypotheses(q, k, v) -> list[_Hypothesis]:
    qd, kd, vd = q.double(), k.double(), v.double()
    dims = {-1: "the keys (dim -1)", -2: "the queries (dim -2)", 0: "the batch (dim 0)"}
    return [
        _Hypothesis(f"softmax over {label}", lambda s, d=d: _attend(qd, kd, vd, None, s, d),
                    "transpose", d)
        for d, label in dims.items()
    ]


class _ModuleReference:
    """Recomputes a book-style module from its ``W_query``/``W_key``/``W_value``.

    Supports single-head modules, multi-head modules with ``num_heads`` (and
    ``num_kv_heads``, ``out_proj``), and wrappers holding a ``heads`` list.
    """

    def __init__(self, module: nn.Module, causal: bool):
        self.causal = causal
        heads = getattr(module, "heads", None)
        if isinstance(heads, nn.ModuleList) and len(heads) > 0:
            self.parts = [_ModuleReference(head, causal) for head in heads]
            self.num_heads = len(self.parts)
            self.head_dim = self.parts[0].head_dim
            return
        self.parts = None
        for name in ("W_query", "W_key", "W_value"):
            if not isinstance(getattr(module, name, None), nn.Linear):
                raise _NotApplicable(
                    f"cannot recompute a reference: {type(module).__name__} has no nn.Linear "
                    "W_query, W_key and W_value (the book's names)"
                )
        self.module = module
        self.num_heads = int(getattr(module, "num_heads", 1))
        self.num_kv_heads = int(getattr(module, "num_kv_heads", self.num_heads))
        self.d_out = module.W_query.out_features
        self.head_dim = int(getattr(module, "head_dim", self.d_out // self.num_heads))
        out_proj = getattr(module, "out_proj", None)
        self.out_proj = out_proj if isinstance(out_proj, nn.Linear) else None

    @torch.no_grad()
    def outputs(self, x, scales, dim=-1, split="transpose", mask=None):
        """Output ``(S, B, T, d_out)`` for each scale in ``scales``."""
        if self.parts is not None:
            outs = [part.outputs(x, scales, dim, split, mask) for part in self.parts]
            return torch.cat(outs, dim=-1)  # (S, B, T, num_heads * d_out)
        m = self.module
        xd = x.double()
        batch, num_tokens = x.shape[0], x.shape[1]

        def project(linear, heads):
            weight = linear.weight.double()
            bias = None if linear.bias is None else linear.bias.double()
            y = nn.functional.linear(xd, weight, bias)  # (B, T, heads * head_dim)
            if split == "view":
                return y.reshape(batch, heads, num_tokens, self.head_dim)  # (B, heads, T, head_dim)
            y = y.view(batch, num_tokens, heads, self.head_dim)  # (B, T, heads, head_dim)
            return y.transpose(1, 2)  # (B, heads, T, head_dim)

        q = project(m.W_query, self.num_heads)  # (B, num_heads, T, head_dim)
        k = project(m.W_key, self.num_kv_heads)  # (B, num_kv_heads, T, head_dim)
        v = project(m.W_value, self.num_kv_heads)  # (B, num_kv_heads, T, head_dim)
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)  # (B, num_heads, T, head_dim)
            v = v.repeat_interleave(group, dim=1)  # (B, num_heads, T, head_dim)
        allowed = causal_mask(num_tokens) if self.causal else None  # (T, T)
        if mask is not None:
            allowed = mask if allowed is None else allowed & mask
        context = _attend(q, k, v, allowed, scales, dim)  # (S, B, num_heads, T, head_dim)
        if split == "view":
            context = context.reshape(len(scales), batch, num_tokens, -1)  # (S, B, T, d_out)
        else:
            context = context.transpose(2, 3)  # (S, B, T, num_heads, head_dim)
            context = context.reshape(len(scales), batch, num_tokens, -1)  # (S, B, T, d_out)
        if self.out_proj is not None:
            weight = self.out_proj.weight.double()
            bias = None if self.out_proj.bias is None else self.out_proj.bias.double()
            context = nn.functional.linear(context, weight, bias)  # (S, B, T, d_out)
        return context

    def hypotheses(self, x) -> list[_Hypothesis]:
        splits = ["transpose", "view"] if self.num_heads > 1 else ["transpose"]
        dims = {-1: "the keys (dim -1)", -2: "the queries (dim -2)"}
        return [
            _Hypothesis(
                f"softmax over {label}, heads split by {split}",
                lambda s, d=d, sp=split: self.outputs(x, s, d, sp),
                split,
                d,
            )
            for split in splits
            for d, label in dims.items()
        ]


# ----------------------------------------------------------------------------
# The checks.
# ----------------------------------------------------------------------------


class _Diagnosis:
    def __init__(self, subject):
        self.subject = subject
        self.is_module = subject.kind == "module"
        self.cache: dict[str, object] = {}

    # Shared measurements -----------------------------------------------------

    def standard(self):
        """The standard call: inputs, output and weights (cached)."""
        if "standard" not in self.cache:
            s = self.subject
            if self.is_module:
                x = s.inputs()
                out, weights = s.call(x)
                self.cache["standard"] = (x, out, weights)
            else:
                q, k, v = s.inputs()
                out, weights = s.call(q, k, v)
                self.cache["standard"] = ((q, k, v), out, weights)
        return self.cache["standard"]

    def reference(self) -> _ModuleReference:
        if "reference" not in self.cache:
            try:
                self.cache["reference"] = _ModuleReference(self.subject.module, self.subject.causal)
            except _NotApplicable as error:
                self.cache["reference"] = error
        ref = self.cache["reference"]
        if isinstance(ref, _NotApplicable):
            raise ref
        return ref

    def fits(self):
        """The hypotheses (softmax dim, head split) that reproduce the output, with scales."""
        if "fits" not in self.cache:
            inputs, out, _ = self.standard()
            if self.is_module:
                hypotheses = self.reference().hypotheses(inputs)
            else:
                hypotheses = _function_hypotheses(*inputs)
            self.cache["fits"] = _fit(hypotheses, out)
        return self.cache["fits"]

    def expected_scale(self) -> tuple[float, int]:
        if self.is_module:
            head_dim = self.reference().head_dim
        else:
            head_dim = self.subject.head_dim
        return 1.0 / math.sqrt(head_dim), head_dim

    def influence(self, mask=None, num_tokens=None, seed=1, values_only=False) -> torch.Tensor:
        """``I[i, j]``: how much output row i moves when token j changes ``(T, T)``.

        For a function, token j is key j and value j (only value j with
        ``values_only``, which measures the weight itself); for a module it is
        input row j.
        """
        s = self.subject
        if self.is_module:
            x = s.inputs(batch_size=1, num_tokens=num_tokens, seed=seed)  # (1, T, d_in)
            base, _ = s.call(x, mask)
            num = x.shape[1]
            gen = torch.Generator().manual_seed(seed + 100)
            rows = []
            for j in range(num):
                x2 = x.clone()
                x2[:, j] += 2.0 * torch.randn(x.shape[-1], generator=gen)
                out, _ = s.call(x2, mask)
                rows.append(_row_change(out, base))
            return torch.stack(rows, dim=1)  # (T, T): column j = effect of token j
        q, k, v = s.inputs(batch_size=1, num_queries=num_tokens, seed=seed)
        base, _ = s.call(q, k, v, mask)
        num = k.shape[1]
        gen = torch.Generator().manual_seed(seed + 100)
        cols = []
        for j in range(num):
            k2, v2 = k.clone(), v.clone()
            k_shift = 2.0 * torch.randn(k.shape[-1], generator=gen)
            if not values_only:
                k2[:, j] += k_shift
            v2[:, j] += 2.0 * torch.randn(v.shape[-1], generator=gen)
            out, _ = s.call(q, k2, v2, mask)
            cols.append(_row_change(out, base))
        return torch.stack(cols, dim=1)  # (T_q, T_k)

    # The checks --------------------------------------------------------------

    def check_returns_output(self) -> str:
        inputs, out, weights = self.standard()
        s = self.subject
        if self.is_module:
            batch, num_tokens = inputs.shape[0], inputs.shape[1]
            if out.dim() != 3 or tuple(out.shape[:2]) != (batch, num_tokens):
                raise _Failed(
                    f"x of shape {tuple(inputs.shape)} gave an output of shape "
                    f"{tuple(out.shape)}; expected ({batch}, {num_tokens}, d_out)"
                )
            d_out = getattr(s.module, "d_out", None)
            heads = getattr(s.module, "heads", None)
            if isinstance(heads, nn.ModuleList):
                d_out = None
            if isinstance(d_out, int) and out.shape[-1] != d_out:
                raise _Failed(
                    f"output shape {tuple(out.shape)}; expected ({batch}, {num_tokens}, {d_out})"
                )
            mixing = self.influence(num_tokens=num_tokens)
            off_diagonal = mixing.masked_fill(torch.eye(num_tokens, dtype=torch.bool), 0.0)
            if off_diagonal.max().item() <= ATOL:
                raise _Failed(
                    "each output row depends only on its own token (no token mixes with "
                    "another): this is a per-token projection such as the values, "
                    "not attention"
                )
            return f"output {tuple(out.shape)}; rows mix information from other tokens"
        q, k, v = inputs
        expected = (q.shape[0], q.shape[1], v.shape[-1])
        if tuple(out.shape) != expected:
            weights_shape = (q.shape[0], q.shape[1], k.shape[1])
            what = " (the shape of the weights)" if tuple(out.shape) == weights_shape else ""
            raise _Failed(
                f"returned shape {tuple(out.shape)}{what}; expected {expected} = "
                "(B, T_q, d_v)"
            )
        gen = torch.Generator().manual_seed(7)
        q2 = q + 2.0 * torch.randn(q.shape, generator=gen)
        out2, _ = s.call(q2, k, v)
        if _max_diff(out, out2) <= ATOL:
            same_as_value = " and equals the value tensor" if _close(out, v) else ""
            raise _Failed(
                f"the output {tuple(out.shape)} does not change when the queries "
                f"change{same_as_value}: it is not attention"
            )
        return f"output {tuple(out.shape)} depends on the queries"

    def check_dropout_eval(self) -> str:
        if not self.is_module:
            raise _NotApplicable("a function has no train/eval mode")
        x = self.subject.inputs()
        first, _ = self.subject.call(x)
        second, _ = self.subject.call(x)
        if _max_diff(first, second) > ATOL:
            raise _Failed(
                "in eval mode two calls on the same input give different outputs: "
                "something random (dropout) is still on"
            )
        return "two eval-mode calls on the same input agree exactly"

    def check_softmax_dim(self) -> str:
        fits = self.fits()
        if not fits:
            raise _NotApplicable("the output matches no softmax of the scores at any scale")
        if any(h.dim == -1 for h, _ in fits):
            return "output matches a softmax over the keys (dim -1)"
        label = fits[0][0].label
        raise _Failed(f"output matches {label}: weights are normalised over the wrong dim")

    def check_head_mixing(self) -> str:
        if not self.is_module:
            raise _NotApplicable("a function receives heads already split")
        ref = self.reference()
        if ref.parts is not None:
            raise _NotApplicable("the heads are separate modules: nothing is split")
        if ref.num_heads < 2:
            raise _NotApplicable("a single head: nothing to split")
        fits = self.fits()
        if not fits:
            raise _NotApplicable("the output matches no recomputation, with either split")
        if any(h.split == "transpose" for h, _ in fits):
            return f"output matches heads split by view + transpose ({ref.num_heads} heads)"
        raise _Failed(
            f"output matches heads split by a bare view(B, {ref.num_heads}, T, "
            f"{ref.head_dim}): each head sees a mix of several tokens' features"
        )

    def check_scale(self) -> str:
        fits = [(h, s) for h, s in self.fits() if h.dim == -1 and h.split == "transpose"]
        if not fits:
            raise _NotApplicable("the output matches no softmax over the keys at any scale")
        fitted = fits[0][1]
        expected, head_dim = self.expected_scale()
        implied = 1.0 / fitted**2
        shown = f"{implied:.0f}" if abs(implied - round(implied)) < 1e-2 * implied else _fmt(implied)
        if abs(fitted / expected - 1.0) < 1e-3:
            return f"fitted scale {_fmt(fitted)} = 1/sqrt({shown}); head_dim = {head_dim}"
        meaning = self._name_size(round(implied), head_dim)
        raise _Failed(
            f"fitted scale {_fmt(fitted)} = 1/sqrt({shown}){meaning}; expected "
            f"1/sqrt(head_dim) = 1/sqrt({head_dim}) = {_fmt(expected)}"
        )

    def _name_size(self, size: int, head_dim: int) -> str:
        names = {head_dim**2: "head_dim squared: divided by head_dim, not its sqrt"}
        if self.is_module:
            ref = self.reference()
            if ref.parts is None:
                names.setdefault(ref.d_out, "the model width d_out")
        else:
            q, k, _ = self.standard()[0]
            names.setdefault(k.numel(), f"the number of elements of key {tuple(k.shape)}")
            names.setdefault(k.shape[-2], "the number of keys")
        return f" ({size} = {names[size]})" if size in names else ""

    def _probe_masks(self, num_tokens):
        only_first = torch.zeros(num_tokens, num_tokens, dtype=torch.bool)  # (T, T)
        only_first[:, 0] = True
        return only_first, ~only_first

    def check_mask_argument(self) -> str:
        if not self.subject.takes_mask:
            raise _NotApplicable("takes no mask argument")
        num_tokens = self.subject.num_tokens
        only_first, all_but_first = self._probe_masks(num_tokens)
        if self.is_module:
            x = self.subject.inputs(batch_size=1)
            out_a, _ = self.subject.call(x, only_first)
            out_b, _ = self.subject.call(x, all_but_first)
        else:
            q, k, v = self.subject.inputs(batch_size=1)
            out_a, _ = self.subject.call(q, k, v, only_first)
            out_b, _ = self.subject.call(q, k, v, all_but_first)
        rows = slice(1, None)  # row 0 is fully masked by a causal layer under the second mask
        if _max_diff(out_a[:, rows], out_b[:, rows]) <= ATOL:
            raise _Failed(
                "two opposite masks (only key 0 allowed / all but key 0 allowed) give the "
                "same output: the mask argument is not used"
            )
        return "opposite masks give different outputs"

    def check_mask_polarity(self) -> str:
        s = self.subject
        messages = []
        num_tokens = s.num_tokens
        if s.takes_mask:
            only_first, all_but_first = self._probe_masks(num_tokens)
            rows = slice(1, None)  # for a module, token 0 also moves its own row
            effect_a = self.influence(only_first)[rows, 0].max().item()
            effect_b = self.influence(all_but_first)[rows, 0].max().item()
            if effect_a <= ATOL and effect_b > ATOL:
                raise _Failed(
                    "key 0 has no effect when the mask allows only key 0 and moves the "
                    f"output by {_fmt(effect_b)} when the mask blocks it: True is treated "
                    "as 'blocked'"
                )
            messages.append("key 0 counts only when the mask allows it")
        if self.is_module and s.causal:
            effect = self.influence()  # (T, T)
            first_on_later = effect[1:, 0].max().item()
            last_on_earlier = effect[:-1, -1].max().item()
            if first_on_later <= ATOL and last_on_earlier > ATOL:
                raise _Failed(
                    "token 0 affects no later output while the last token moves earlier "
                    f"outputs by {_fmt(last_on_earlier)}: the causal mask is inverted "
                    "(each token sees only the future)"
                )
            messages.append("the causal mask hides the future, not the past")
        if not messages:
            raise _NotApplicable("takes no mask argument and is not causal")
        return "; ".join(messages)

    def check_padding(self) -> str:
        if not self.subject.takes_mask:
            raise _NotApplicable("takes no mask argument")
        num_tokens = self.subject.num_tokens
        keep = torch.ones(1, num_tokens, dtype=torch.bool)  # (1, T): padding-style key mask
        keep[:, -2:] = False
        # A function's padding is judged by the values alone: a key that is zeroed
        # after the softmax still shifts the other weights, but gets no weight itself.
        effect = self.influence(keep, values_only=not self.is_module)  # (T, T)
        if self.is_module:
            effect = effect.masked_fill(torch.eye(num_tokens, dtype=torch.bool), 0.0)
        leak = effect[:, -2:]
        if leak.max().item() > ATOL:
            row = int(leak.max(dim=1).values.argmax())
            raise _Failed(
                f"padding tokens {num_tokens - 2} and {num_tokens - 1} are masked but move "
                f"output row {row} by {_fmt(leak.max().item())}: they still get weight"
            )
        return f"the 2 masked padding tokens of {num_tokens} move no other output"

    def check_fully_masked_rows(self) -> str:
        if not self.subject.takes_mask:
            raise _NotApplicable("takes no mask argument")
        num_tokens = self.subject.num_tokens
        mask = torch.ones(num_tokens, num_tokens, dtype=torch.bool)  # (T, T)
        mask[2] = False
        if self.is_module:
            out, _ = self.subject.call(self.subject.inputs(), mask)
        else:
            out, _ = self.subject.call(*self.subject.inputs(), mask)
        bad = ~torch.isfinite(out)
        if bad.any():
            rows = sorted({int(i) for i in bad.nonzero()[:, -2]})
            raise _Failed(f"query row 2 fully masked: NaN/inf in output rows {rows}")
        return "query row 2 fully masked: the output stays finite"

    def check_causality(self) -> str:
        if not (self.is_module and self.subject.causal):
            what = "a function is causal only through the mask it is given" if not self.is_module \
                else "a non-causal module"
            raise _NotApplicable(what)
        effect = self.influence()  # (T, T)
        future = torch.triu(torch.ones_like(effect, dtype=torch.bool), diagonal=1)
        leak = effect.masked_fill(~future, 0.0)
        if leak.max().item() > ATOL:
            i, j = divmod(int(leak.argmax()), leak.shape[1])
            raise _Failed(
                f"changing token {j} moves the output at position {i} by "
                f"{_fmt(leak.max().item())}: the future leaks into the past"
            )
        return f"changing token j leaves outputs 0..j-1 unchanged (T={effect.shape[0]})"

    def check_weights_sum(self) -> str:
        s = self.subject
        if self.is_module:
            if not s.takes_return_weights:
                raise _NotApplicable("the module returns no weights")
            try:
                _, weights = s.call(s.inputs(), return_weights=True)
            except _UserError as error:
                raise _NotApplicable(f"no weights: return_weights=True raised {error}") from None
            if weights is None:
                raise _NotApplicable("the module returns no weights")
            return _rows_sum_to_one(weights, "no mask")
        q, k, v = s.inputs()
        mask = None
        if s.takes_mask:
            gen = torch.Generator().manual_seed(3)
            mask = torch.rand(q.shape[1], k.shape[1], generator=gen) < 0.5  # (T, T)
            mask[:, 0], mask[:, 1] = True, False  # no row fully masked or fully open
        out, weights = s.call(q, k, v, mask)
        where = "a random mask" if mask is not None else "no mask"
        if weights is not None:
            return _rows_sum_to_one(weights, where)
        # Without weights: rows sum to 1 exactly when shifting every value by c
        # shifts every output by c.
        shift = torch.linspace(-1.0, 1.0, v.shape[-1])  # (d_v,)
        out2, _ = s.call(q, k, v + shift, mask)
        moved = (out2 - out) / shift  # (B, T, d_v): each row's weight sum
        diff = (moved - 1.0).abs().max().item()
        if diff > 1e-3:
            raise _Failed(
                f"with {where}, shifting every value by c shifts the output by "
                f"{_fmt(moved.min().item())}*c to {_fmt(moved.max().item())}*c, not c: "
                "the hidden weights do not sum to 1"
            )
        return f"with {where}: shifting every value by c shifts every output by c"

    def check_dropout_train(self) -> str:
        if not self.is_module:
            raise _NotApplicable("a function has no train/eval mode")
        s = self.subject
        if s.dropout_p == 0.0:
            raise _NotApplicable("built without dropout (p = 0)")
        num_samples = 4000
        x = s.inputs(batch_size=1)  # (1, T, d_in)
        expected, _ = s.call(x)
        many = x.expand(num_samples, -1, -1).contiguous()  # (N, T, d_in)
        s.module.train()
        try:
            torch.manual_seed(0)
            samples, _ = s.call(many)  # (N, T, d_out)
        finally:
            s.module.eval()
        spread = (samples - samples[:1]).abs().max().item()
        if spread <= ATOL:
            raise _Failed(f"p={s.dropout_p}, yet {num_samples} training calls all agree: "
                          "dropout is never applied")
        mean = samples.double().mean(dim=0)  # (T, d_out)
        std_err = samples.double().std(dim=0) / math.sqrt(num_samples)
        z = ((mean - expected[0].double()).abs() / (std_err + 1e-12)).max().item()
        if z > 6.0:
            raise _Failed(
                f"p={s.dropout_p}: the mean of {num_samples} training outputs is more than "
                "6 standard errors away from the eval output: dropout changes the "
                "expected output"
            )
        return (f"p={s.dropout_p}: training outputs vary; their mean over {num_samples} "
                "calls matches the eval output")

    def check_batch(self) -> str:
        s = self.subject
        if self.is_module:
            x = s.inputs(batch_size=3)
            out, _ = s.call(x)
            singles = [s.call(x[b : b + 1])[0] for b in range(3)]
            x2 = x.clone()
            x2[0] += 1.0
            out2, _ = s.call(x2)
        else:
            q, k, v = s.inputs(batch_size=3)
            out, _ = s.call(q, k, v)
            singles = [s.call(q[b : b + 1], k[b : b + 1], v[b : b + 1])[0] for b in range(3)]
            v2 = v.clone()
            v2[0] += 1.0
            out2, _ = s.call(q, k, v2)
        for b, single in enumerate(singles):
            if single.shape[0] != 1 or single.shape[1:] != out.shape[1:]:
                raise _Failed(
                    f"batch size 1 gave shape {tuple(single.shape)}; batch size 3 gave "
                    f"{tuple(out.shape)}"
                )
            diff = _max_diff(single[0], out[b])
            if diff > ATOL:
                raise _Failed(
                    f"item {b} alone (B=1) and in a batch (B=3) differ by {_fmt(diff)}"
                )
        leak = _max_diff(out2[1:], out[1:])
        if leak > ATOL:
            raise _Failed(f"changing batch item 0 moves items 1-2 by {_fmt(leak)}")
        return "B=1 and B=3 agree; changing item 0 leaves items 1-2 unchanged"

    def check_lengths(self) -> str:
        s = self.subject
        if not self.is_module:
            q, k, v = s.inputs(num_queries=1)
            out, _ = s.call(q, k, v)
            _expect_shape(out, (q.shape[0], 1, v.shape[-1]), "T=1")
            q, k, v = s.inputs(num_queries=3, num_keys=7)
            out, _ = s.call(q, k, v)
            _expect_shape(out, (q.shape[0], 3, v.shape[-1]), "T_q=3, T_k=7")
            return "works for T=1 and for 3 queries over 7 keys"
        context_length = s.context_length
        lengths = [1, context_length] if context_length else [1, 2 * s.num_tokens]
        for num_tokens in lengths:
            x = s.inputs(num_tokens=num_tokens)
            try:
                out, _ = s.call(x)
            except _UserError as error:
                raise _Failed(f"T={num_tokens} (context_length={context_length}) raised "
                              f"{error}") from None
            _expect_shape(out, (x.shape[0], num_tokens), f"T={num_tokens}", prefix=True)
            if not torch.isfinite(out).all():
                raise _Failed(f"T={num_tokens}: NaN/inf in the output")
        if not context_length:
            return f"works for T={lengths[0]} and T={lengths[1]} (no context_length)"
        too_long = context_length + 1
        try:
            s.call(s.inputs(num_tokens=too_long))
        except _UserError as error:
            message = str(error)
            if str(context_length) not in message.split(":", 1)[-1]:
                raise _Failed(
                    f"T={too_long} > context_length={context_length} raised an error that "
                    f"does not name context_length: {message}"
                ) from None
            return (f"works for T=1 and T={context_length}; T={too_long} raises "
                    f"{message.split(':', 1)[0]} naming context_length={context_length}")
        raise _Failed(f"T={too_long} > context_length={context_length} ran without an error")

    def check_matches_reference(self) -> str:
        s = self.subject
        if self.is_module:
            ref = self.reference()
            x = s.inputs()
            out, _ = s.call(x)
            expected = ref.outputs(x, torch.tensor([self.expected_scale()[0]]).double())[0]
            where = "the causal mask" if s.causal else "no mask"
        else:
            q, k, v = s.inputs()
            mask = None
            if s.takes_mask:
                gen = torch.Generator().manual_seed(4)
                mask = torch.rand(q.shape[0], q.shape[1], k.shape[1], generator=gen) < 0.6
                mask[..., 0] = True  # (B, T, T), no row fully masked
            out, _ = s.call(q, k, v, mask)
            expected, _ = scaled_dot_product_attention(q.double(), k.double(), v.double(), mask)
            where = "a random mask" if mask is not None else "no mask"
        if out.shape != expected.shape:
            raise _Failed(f"shape {tuple(out.shape)}; the reference has {tuple(expected.shape)}")
        diff = _max_diff(out, expected)
        if diff > 1e-4:
            raise _Failed(f"with {where}, differs from the reference by up to {_fmt(diff)}")
        return f"with {where}, agrees with the reference (max error < 1e-4)"


def _row_change(out: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Per-row largest change ``(T,)``; a NaN counts as a large change."""
    diff = (out.detach().double() - base.detach().double()).abs()  # (1, T, d)
    diff = torch.nan_to_num(diff, nan=1e9)
    both_nan = torch.isnan(out) & torch.isnan(base)
    diff = diff.masked_fill(both_nan, 0.0)
    return diff[0].amax(dim=-1)  # (T,)


def _expect_shape(out, expected, what, prefix=False):
    got = tuple(out.shape[: len(expected)]) if prefix else tuple(out.shape)
    if got != tuple(expected):
        shown = tuple(expected) + (("d_out",) if prefix else ())
        raise _Failed(f"{what}: output shape {tuple(out.shape)}, expected {shown}")


def _rows_sum_to_one(weights: torch.Tensor, where: str) -> str:
    sums = weights.detach().double().sum(dim=-1)  # (..., T_q)
    diff = (sums - 1.0).abs()
    if torch.isnan(diff).any() or diff.max().item() > 1e-4:
        flat = torch.nan_to_num(diff, nan=math.inf).flatten()
        worst = int(flat.argmax())
        value = sums.flatten()[worst].item()
        row = worst % sums.shape[-1]
        raise _Failed(f"with {where}, weights row {row} sums to {_fmt(value)}, not 1")
    return f"with {where}, every row of the weights {tuple(weights.shape)} sums to 1"


# ----------------------------------------------------------------------------
# The entry point.
# ----------------------------------------------------------------------------


def diagnose(
    fn_or_module,
    *,
    causal: bool | None = None,
    context_length: int | None = None,
    d_in: int | None = None,
    head_dim: int = 8,
    batch_size: int = 2,
    num_tokens: int = 5,
) -> DiagnosisReport:
    """Run property checks against an attention function or module.

    A *function* is called as ``fn(query, key, value)`` and, when it takes a
    mask, ``fn(query, key, value, mask)`` with a boolean mask, True = may attend.
    A *module* (any ``nn.Module``) is called as ``module(x)`` and, when its
    ``forward`` takes a mask, ``module(x, mask)``; weights are read with
    ``return_weights=True`` when ``forward`` has that parameter. Either may
    return the output alone or ``(output, weights)``. For other conventions
    wrap the implementation first: :func:`blocked_mask_adapter` (True =
    blocked), :func:`additive_mask_adapter` (a float mask added to the scores),
    :func:`torch_multihead_adapter` (``torch.nn.MultiheadAttention``).

    A module is put in eval mode for every check except ``dropout_train`` and
    left in the mode it came in. Checks that do not apply, or that cannot be
    judged because a more basic check failed, are reported as ``n/a``.

    Args:
        fn_or_module: the attention function or module to check.
        causal: whether a module is causal (default: its ``causal`` attribute, or
            True when it, or a submodule, has a ``mask`` buffer).
        context_length: the longest input a module accepts (default: its
            ``context_length`` attribute; None: no limit).
        d_in: a module's input size (default: its ``d_in`` attribute or the
            ``in_features`` of its first ``nn.Linear``).
        head_dim: feature size of the queries and keys given to a function.
        batch_size: batch size of the standard inputs.
        num_tokens: sequence length of the standard inputs (at most
            ``context_length``).

    Shapes:
        a function gets query, key, value ``(B, T, head_dim)``; a module gets
        x ``(B, T, d_in)``; masks are ``(T, T)`` or ``(1, T)`` and broadcast.

    Returns:
        A :class:`DiagnosisReport`; ``print(report)`` shows the table.

    Taught in chapter 11.
    """
    for name, value in (("head_dim", head_dim), ("batch_size", batch_size),
                        ("num_tokens", num_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_tokens < 3:
        raise ValueError(f"num_tokens must be >= 3 for the mask probes, got {num_tokens}")
    if isinstance(fn_or_module, nn.Module):
        subject = _ModuleSubject(fn_or_module, causal, context_length, d_in, batch_size,
                                 num_tokens)
    elif callable(fn_or_module):
        subject = _FunctionSubject(fn_or_module, head_dim, batch_size, num_tokens)
    else:
        raise TypeError(
            f"diagnose expects an attention function or an nn.Module, got "
            f"{type(fn_or_module).__name__}"
        )

    report = DiagnosisReport(subject.describe())
    diagnosis = _Diagnosis(subject)
    was_training = subject.module.training if subject.kind == "module" else None
    num_threads = torch.get_num_threads()
    # The inputs are tiny: one thread avoids the cost of waking a thread pool per op.
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if subject.kind == "module":
            subject.module.eval()
        try:
            with torch.no_grad():
                for name in CHECKS:
                    report.results.append(_run_check(diagnosis, name, report))
        finally:
            torch.set_num_threads(num_threads)
            if was_training is not None:
                subject.module.train(was_training)
    return report


def _run_check(diagnosis: _Diagnosis, name: str, report: DiagnosisReport) -> CheckResult:
    failed = set(report.failed)
    needs = _NEEDS.get(name, ())
    if name == "matches_reference":
        needs = tuple(n for n in CHECKS if n != name)
    blocking = [n for n in needs if n in failed]
    if blocking:
        return CheckResult(name, NA, f"not judged: fix {', '.join(blocking)} first")
    try:
        evidence = getattr(diagnosis, f"check_{name}")()
    except _NotApplicable as reason:
        return CheckResult(name, NA, str(reason))
    except _Failed as evidence:
        return CheckResult(name, FAIL, str(evidence), _HINTS[name])
    except _UserError as error:
        return CheckResult(name, FAIL, f"raised {error}", _HINTS[name])
    except Exception as error:  # noqa: BLE001 - a broken implementation must not crash diagnose
        return CheckResult(name, FAIL, f"raised {_describe_error(error)}", _HINTS[name])
    return CheckResult(name, PASS, evidence)


# ----------------------------------------------------------------------------
# Adapters for other calling conventions.
# ----------------------------------------------------------------------------


def blocked_mask_adapter(fn: Callable) -> Callable:
    """Wrap ``fn(q, k, v, mask)`` whose boolean mask means True = *blocked*.

    ``diagnose`` passes masks with True = may attend; the adapter inverts them.

    Args:
        fn: an attention function whose mask marks the positions to hide.

    Returns:
        A function ``(query, key, value, mask=None)`` in the book's convention.

    Taught in chapter 11.
    """

    def adapted(query, key, value, mask=None):
        return fn(query, key, value) if mask is None else fn(query, key, value, ~mask)

    adapted.__name__ = f"blocked_mask_adapter({getattr(fn, '__name__', 'fn')})"
    return adapted


def additive_mask_adapter(fn: Callable) -> Callable:
    """Wrap ``fn(q, k, v, mask)`` whose mask is a float *added* to the scores.

    A boolean mask (True = may attend) becomes 0 where allowed and ``-inf``
    where blocked, the convention of Hugging Face models and of a float
    ``attn_mask`` in ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        fn: an attention function that adds its mask to the scores.

    Returns:
        A function ``(query, key, value, mask=None)`` in the book's convention.

    Taught in chapter 11.
    """

    def adapted(query, key, value, mask=None):
        if mask is None:
            return fn(query, key, value)
        additive = torch.zeros(mask.shape, dtype=query.dtype)
        return fn(query, key, value, additive.masked_fill(~mask, float("-inf")))

    adapted.__name__ = f"additive_mask_adapter({getattr(fn, '__name__', 'fn')})"
    return adapted


class MultiheadAttentionAdapter(nn.Module):
    """``torch.nn.MultiheadAttention`` as a self-attention module ``x -> output``."""

    def __init__(self, attention: nn.MultiheadAttention, causal: bool):
        super().__init__()
        self.attention = attention
        self.causal = causal
        self.d_in = attention.embed_dim

    def forward(self, x, mask=None, return_weights=False):
        num_tokens = x.shape[-2]
        allowed = causal_mask(num_tokens) if self.causal else None  # (T, T)
        if mask is not None:
            mask = mask.expand(num_tokens, num_tokens) if mask.dim() <= 2 else mask
            allowed = mask if allowed is None else allowed & mask
        blocked = None if allowed is None else ~allowed  # PyTorch: True = blocked
        if not self.attention.batch_first:
            x = x.transpose(0, 1)  # (T, B, d_in)
        output, weights = self.attention(x, x, x, attn_mask=blocked, need_weights=True,
                                         average_attn_weights=False)
        if not self.attention.batch_first:
            output = output.transpose(0, 1)  # (B, T, d_out)
        return (output, weights) if return_weights else output


def torch_multihead_adapter(attention: nn.MultiheadAttention, causal: bool = False) -> nn.Module:
    """Wrap ``torch.nn.MultiheadAttention`` as a self-attention module for :func:`diagnose`.

    The wrapper calls ``attention(x, x, x)``, turns the book's mask (True = may
    attend) into PyTorch's ``attn_mask`` (True = blocked), adds the causal mask
    when ``causal`` is True and returns the per-head weights on request.

    Args:
        attention: the PyTorch layer.
        causal: apply a causal mask.

    Shapes:
        x ``(B, T, embed_dim)`` -> output ``(B, T, embed_dim)``.

    Returns:
        An ``nn.Module`` with ``forward(x, mask=None, return_weights=False)``.

    Taught in chapter 11.
    """
    if not isinstance(attention, nn.MultiheadAttention):
        raise TypeError(
            f"expected torch.nn.MultiheadAttention, got {type(attention).__name__}"
        )
    return MultiheadAttentionAdapter(attention, causal)
