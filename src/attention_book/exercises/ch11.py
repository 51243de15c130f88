"""Checkers for chapter 11's exercises."""

from __future__ import annotations

__all__: list[str] = []
