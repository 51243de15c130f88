"""Checkers for chapter 1's exercises."""

from __future__ import annotations

__all__: list[str] = []
