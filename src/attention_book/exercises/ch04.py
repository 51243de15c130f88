"""Checkers for chapter 4's exercises."""

from __future__ import annotations

__all__: list[str] = []
