"""Checkers for chapter 5's exercises."""

from __future__ import annotations

__all__: list[str] = []
