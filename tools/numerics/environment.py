"""Read the book's numeric environments (``tools/numerics/<name>.env``: KEY=VALUE lines)."""

from __future__ import annotations

from pathlib import Path

NUMERICS_DIR = Path(__file__).resolve().parent


def numeric_environment(name: str) -> dict[str, str]:
    """The variables of ``tools/numerics/<name>.env``; a ``#`` starts a comment line."""
    path = NUMERICS_DIR / f"{name}.env"
    if not path.is_file():
        choices = sorted(p.stem for p in NUMERICS_DIR.glob("*.env"))
        raise ValueError(f"no numeric environment {name!r} in tools/numerics/ (have {choices})")
    variables = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            variables[key.strip()] = value.strip()
    return variables
