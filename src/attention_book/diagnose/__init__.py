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
Every probe is built on the subject's device and in its floating dtype, and the
tolerances follow that dtype. An exception raised by the code under test
becomes a failed row that quotes the error; ``diagnose`` itself never raises
because of a broken implementation.

The package, one module per idea:

* ``core``: :func:`diagnose`, the entry point; runs the registered checks in
  order, each only if the checks it needs did not fail;
* ``registry``: what a check is (:class:`~.registry.Check`), ``register_check``
  and :data:`CHECKS`, the report order;
* ``report``: :class:`CheckResult` and :class:`DiagnosisReport`, the table;
* ``subjects``: functions and modules behind one calling convention, where
  they live (device, dtype) and the probe inputs they are fed;
* ``context``: :class:`~.context.DiagnosisContext`, what every check receives:
  the subject, probe factories, tolerances, shared measurements;
* ``numerics``: tolerances per dtype and the shared comparisons;
* ``reference``: the reference recomputation and the scale fit;
* ``adapters``: other calling conventions (True = blocked, additive masks,
  ``torch.nn.MultiheadAttention``);
* the check families: ``checks_output`` (returns_output, batch, lengths,
  matches_reference), ``checks_dropout`` (dropout_eval, dropout_train),
  ``checks_scaling`` (softmax_dim, scale, weights_sum), ``checks_heads``
  (head_mixing), ``checks_masks`` (mask_argument, mask_polarity, padding,
  fully_masked_rows, causality), ``checks_positions`` (cache_positions: decoding
  with a KV cache equals the full forward pass, chapter 12), ``checks_sinks``
  (sink_denominator: an attention sink is one more term in the softmax's
  denominator, chapter 13).

Adding a family of checks (induction heads, ...):

1. write ``checks_<family>.py`` with one function per check, taking the
   context and returning the evidence, or raising ``Failed(evidence)`` or
   ``NotApplicable(reason)``; build every probe with the context (``ctx.randn``,
   ``ctx.full_mask``, ``subject.inputs``) so that it lands on the subject's
   device and dtype, and compare with ``ctx.tol``;
2. register each with ``@register_check(name, property=..., hint=...,
   order=..., needs=(...))``: ``order`` places it in the report (new families
   take 1700-8999, before the catch-all ``matches_reference``), ``needs``
   names the earlier checks whose failure would make this one meaningless;
3. import the module in ``core`` beside the other families.

No existing module changes; ``CHECKS`` and the report gain the new rows, and
``matches_reference`` is then judged only when the new checks pass as well.

Taught in chapter 11 (the positions family in chapter 12, the sinks family in chapter 13).
"""

import torch

# MultiheadAttentionAdapter, PASS, FAIL, NA and ATOL stay importable from here, as before the split.
from .adapters import (  # noqa: F401
    MultiheadAttentionAdapter,
    additive_mask_adapter,
    blocked_mask_adapter,
    torch_multihead_adapter,
)
from .core import diagnose
from .numerics import TOLERANCES
from .registry import CHECKS
from .report import FAIL, NA, PASS, CheckResult, DiagnosisReport  # noqa: F401

#: The float32 tolerance for "unchanged"; ``numerics.TOLERANCES`` has every dtype's.
ATOL = TOLERANCES[torch.float32].atol

__all__ = [
    "CHECKS",
    "CheckResult",
    "DiagnosisReport",
    "diagnose",
    "additive_mask_adapter",
    "blocked_mask_adapter",
    "torch_multihead_adapter",
]
