"""Run the hidden tests of a chapter's check cell against an answer, as the grader does.

The grader runs a check cell's hidden tests with the learner's answer names bound; here they
run in this process, with the answers given as keyword arguments, so that a checker's tests
can show that a weak answer fails the hidden tests as well as the checker.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def hidden_tests(notebook: str, grade_id: str) -> str:
    """The source between the hidden-test markers of the check cell ``grade_id``."""
    for cell in json.loads((CHAPTERS / notebook).read_text())["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            source = "".join(cell["source"])
            return source.split("### BEGIN HIDDEN TESTS", 1)[1].split("### END HIDDEN TESTS")[0]
    raise KeyError(f"{notebook} has no cell {grade_id}")


def passes_hidden_tests(notebook: str, grade_id: str, **answers) -> bool:
    """True when the hidden tests of ``grade_id`` pass with ``answers`` as the answer names."""
    code = compile(hidden_tests(notebook, grade_id), f"{notebook}:{grade_id}", "exec")
    try:
        exec(code, dict(answers))
    except Exception:  # noqa: BLE001 - the grader scores any failure as 0
        return False
    return True
