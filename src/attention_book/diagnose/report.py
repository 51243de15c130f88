"""The report: one :class:`CheckResult` per check, printed as a table."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from .registry import CHECKS

PASS, FAIL, NA = "pass", "FAIL", "n/a"


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
