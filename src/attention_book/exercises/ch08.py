"""Checkers for chapter 8's exercises."""

from __future__ import annotations

__all__: list[str] = []
