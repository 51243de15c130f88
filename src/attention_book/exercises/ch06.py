"""Checkers for chapter 6's exercises."""

from __future__ import annotations

__all__: list[str] = []
