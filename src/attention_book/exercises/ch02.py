"""Checkers for chapter 2's exercises."""

from __future__ import annotations

__all__: list[str] = []
