"""Checkers for chapter 7's exercises."""

from __future__ import annotations

__all__: list[str] = []
