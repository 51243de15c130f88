"""The ordered registry of checks: what a check is, and how a family of checks registers one.

A check is a function ``run(ctx) -> evidence`` that receives the
:class:`~attention_book.diagnose.context.DiagnosisContext` (the subject, its
probes, shared measurements, tolerances) and either returns the evidence that
its property holds, or raises :class:`Failed` (the message is the evidence) or
:class:`NotApplicable` (the message says why). :func:`register_check` records
it with the property it tests, the hint shown when it fails, its place in the
report (``order``) and the checks it ``needs``.

The report lists the checks by ``order``; the bands in use are:

====  ==========================================================================
100   ``returns_output`` (checks_output)
200   ``dropout_eval`` (checks_dropout)
300   ``softmax_dim`` (checks_scaling)
400   ``head_mixing`` (checks_heads)
500   ``scale`` (checks_scaling)
600   ``mask_argument`` … 1000 ``causality`` (checks_masks)
1100  ``weights_sum`` (checks_scaling)
1200  ``dropout_train`` (checks_dropout)
1300  ``batch``, 1400 ``lengths`` (checks_output)
1500  ``cache_positions`` (checks_positions)
1600  ``sink_denominator`` (checks_sinks)
9000  ``matches_reference`` (checks_output), the catch-all, always last
====  ==========================================================================

New families take numbers between 1700 and 8999, so that the report of every
existing check keeps its place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .outcomes import Failed, NotApplicable

if TYPE_CHECKING:
    from .context import DiagnosisContext

__all__ = ["CHECKS", "Check", "Failed", "NotApplicable", "register_check", "ordered_checks"]

#: Every check, in the order of the report, with the property it tests.
#: Kept in step with the registry by :func:`register_check` (the same dict object throughout).
CHECKS: dict[str, str] = {}

_REGISTRY: dict[str, Check] = {}


@dataclass(frozen=True)
class Check:
    """One registered check.

    Attributes:
        name: the check's name, a row of the report.
        property: the property it tests, in words (shown as "expected" on failure).
        hint: how to fix a failure.
        run: ``run(ctx) -> evidence``; raises :class:`Failed` or :class:`NotApplicable`.
        order: its place in the report (smaller first).
        needs: checks that must not have failed for this one to be judged, in the
            order the "fix ... first" message names them.
        catch_all: judged only when every other check passed or did not apply.
    """

    name: str
    property: str
    hint: str
    run: Callable[[DiagnosisContext], str]
    order: int
    needs: tuple[str, ...] = ()
    catch_all: bool = False


def register_check(
    name: str,
    *,
    property: str,
    hint: str,
    order: int,
    needs: tuple[str, ...] = (),
    catch_all: bool = False,
) -> Callable[[Callable[[DiagnosisContext], str]], Callable[[DiagnosisContext], str]]:
    """Decorator: register ``run(ctx) -> evidence`` as the check ``name``.

    Args:
        name: the check's name (unique).
        property: the property it tests, in words.
        hint: how to fix a failure.
        order: its place in the report (unique; see the bands in this module's docstring).
        needs: checks that must not have failed for this one to be judged.
        catch_all: judged only when every other check passed or did not apply.

    Returns:
        The decorator; it returns the function unchanged.
    """

    def decorator(run: Callable[[DiagnosisContext], str]) -> Callable[[DiagnosisContext], str]:
        if name in _REGISTRY:
            raise ValueError(f"a check named {name!r} is already registered")
        taken = {check.order: check.name for check in _REGISTRY.values()}
        if order in taken:
            raise ValueError(f"check {name!r}: order {order} is taken by {taken[order]!r}")
        _REGISTRY[name] = Check(name, property, hint, run, order, tuple(needs), catch_all)
        CHECKS.clear()
        CHECKS.update((check.name, check.property) for check in ordered_checks(validate=False))
        return run

    return decorator


def ordered_checks(validate: bool = True) -> list[Check]:
    """Every registered check in report order, after checking that the order is sound.

    Args:
        validate: check that every ``needs`` names an earlier check and that a
            catch-all check comes last.

    Returns:
        The checks, sorted by ``order``.
    """
    checks = sorted(_REGISTRY.values(), key=lambda check: check.order)
    if validate:
        position = {check.name: i for i, check in enumerate(checks)}
        for i, check in enumerate(checks):
            for need in check.needs:
                if position.get(need, len(checks)) >= i:
                    raise RuntimeError(
                        f"check {check.name!r} needs {need!r}, which is not registered before it"
                    )
            if check.catch_all and i != len(checks) - 1:
                raise RuntimeError(f"the catch-all check {check.name!r} must come last")
    return checks
