"""The two ways a check can end other than passing: :class:`Failed` and :class:`NotApplicable`.

They live apart from the registry so that the subjects, the reference implementations and the
context can raise them without importing the registry, which names the context in its types.
"""

from __future__ import annotations

__all__ = ["Failed", "NotApplicable"]


class Failed(Exception):
    """The property does not hold; the message is the evidence."""


class NotApplicable(Exception):
    """The check does not apply to this implementation; the message says why."""
