"""Checkers for chapter 10's exercises."""

from __future__ import annotations

__all__: list[str] = []
