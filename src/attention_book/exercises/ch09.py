"""Checkers for chapter 9's exercises."""

from __future__ import annotations

__all__: list[str] = []
