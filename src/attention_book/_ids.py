"""The one rule for the fixed HTML ids of the book's demos and bertviz views."""

from __future__ import annotations

import re

_ID_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _check_element_id(element_id: object) -> None:
    """Raise ``ValueError`` unless ``element_id`` can serve as a fixed HTML id."""
    if not isinstance(element_id, str) or not _ID_PATTERN.match(element_id):
        raise ValueError(
            "element_id must start with a letter and hold only letters, digits, '-' and '_', "
            f"got {element_id!r}"
        )
