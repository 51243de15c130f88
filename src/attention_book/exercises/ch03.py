"""Checkers for chapter 3's exercises."""

from __future__ import annotations

__all__: list[str] = []
