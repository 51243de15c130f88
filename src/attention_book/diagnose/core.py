"""The entry point :func:`diagnose`: build the subject, run every registered check in order.

A check is judged only if none of the checks it ``needs`` failed; otherwise
its row says "not judged: fix ... first". The catch-all check is judged only
when every other check passed or did not apply.
"""

from __future__ import annotations

import torch
from torch import nn

# Importing a family registers its checks (see the package docstring).
from . import (  # noqa: F401
    checks_dropout,
    checks_heads,
    checks_masks,
    checks_output,
    checks_positions,
    checks_scaling,
    checks_sinks,
)
from .context import DiagnosisContext
from .registry import CHECKS, Check, Failed, NotApplicable, ordered_checks
from .report import FAIL, NA, PASS, CheckResult, DiagnosisReport
from .subjects import (
    FunctionSubject,
    ModuleSubject,
    UserError,
    describe_error,
    function_placement,
    module_placement,
)


def diagnose(
    fn_or_module,
    *,
    causal: bool | None = None,
    context_length: int | None = None,
    d_in: int | None = None,
    head_dim: int = 8,
    batch_size: int = 2,
    num_tokens: int = 5,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
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

    Every probe (inputs, masks, references) is built on the subject's device and
    in its floating dtype: a module's are those of its parameters, a function's
    are ``device`` and ``dtype`` (CPU and float32 by default). The tolerances
    follow the dtype (tight in float64, loose in bfloat16 and float16).

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
        device: where a function's probes live (default CPU); for a module it
            must be its parameters' device, which is the default.
        dtype: the floating dtype of a function's probes (default float32); for a
            module it must be its parameters' dtype, which is the default.

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
        device, dtype = module_placement(fn_or_module, device, dtype)
        subject = ModuleSubject(fn_or_module, causal, context_length, d_in, batch_size,
                                num_tokens, device, dtype)
    elif callable(fn_or_module):
        device, dtype = function_placement(device, dtype)
        subject = FunctionSubject(fn_or_module, head_dim, batch_size, num_tokens, device, dtype)
    else:
        raise TypeError(
            f"diagnose expects an attention function or an nn.Module, got "
            f"{type(fn_or_module).__name__}"
        )

    checks = ordered_checks()
    report = DiagnosisReport(subject.describe())
    context = DiagnosisContext(subject)
    was_training = subject.module.training if subject.kind == "module" else None
    num_threads = torch.get_num_threads()
    # The inputs are tiny: one thread avoids the cost of waking a thread pool per op.
    torch.set_num_threads(1)
    with _forked_rng(subject.device):
        torch.manual_seed(0)
        if subject.kind == "module":
            subject.module.eval()
        try:
            with torch.no_grad():
                for check in checks:
                    report.results.append(run_check(check, context, report))
        finally:
            torch.set_num_threads(num_threads)
            if was_training is not None:
                subject.module.train(was_training)
    return report


def _forked_rng(device: torch.device):
    """Restore the global random state of the CPU, and of ``device`` if it is an accelerator."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    module = torch.get_device_module(device.type)
    index = device.index
    if index is None:  # "cuda" means the current device; MPS has only one
        index = module.current_device() if hasattr(module, "current_device") else 0
    return torch.random.fork_rng(devices=[index], device_type=device.type)


def run_check(check: Check, context: DiagnosisContext, report: DiagnosisReport) -> CheckResult:
    """Run one check against the results so far: its row of the report.

    Args:
        check: the registered check.
        context: the diagnosis context passed to ``check.run``.
        report: the rows of the earlier checks (their failures block this one).

    Returns:
        The check's :class:`CheckResult`: pass, FAIL (with the hint) or n/a.
    """
    failed = set(report.failed)
    needs = check.needs
    if check.catch_all:
        needs = tuple(n for n in CHECKS if n != check.name)
    blocking = [n for n in needs if n in failed]
    if blocking:
        return CheckResult(check.name, NA, f"not judged: fix {', '.join(blocking)} first")
    try:
        evidence = check.run(context)
    except NotApplicable as reason:
        return CheckResult(check.name, NA, str(reason))
    except Failed as evidence:
        return CheckResult(check.name, FAIL, str(evidence), check.hint)
    except UserError as error:
        return CheckResult(check.name, FAIL, f"raised {error}", check.hint)
    except Exception as error:  # noqa: BLE001 - a broken implementation must not crash diagnose
        return CheckResult(check.name, FAIL, f"raised {describe_error(error)}", check.hint)
    return CheckResult(check.name, PASS, evidence)

