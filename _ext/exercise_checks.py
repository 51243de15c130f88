"""On the website, an exercise's check is folded away with its model answer.

Each exercise of a chapter is a prompt, an answer cell (a model answer, tagged ``hide-input``
in the notebook, so the page folds it) and a check cell: the code cell whose nbgrader metadata
says ``grade: true``. The check cell holds the hidden tests, and its stored output ("Correct:
…") states the answer too, so an unfolded check gives away a "predict before you run" exercise.

This extension folds every check cell, its code and its output, while Sphinx reads a notebook
(``source-read``, before myst-nb parses it): it adds the tag ``hide-cell`` (myst-nb's fold of a
whole cell, behind a "Show" toggle) and the tag ``exercise-check`` (so the page marks the cell
with the class ``tag_exercise-check``), and names the toggle. The notebooks themselves are not
changed: in Jupyter a learner runs the check as it is. ``tests/test_browser.py`` checks that no
check cell is visible unfolded and that every check cell of each chapter is folded.

The answer cells (``solution: true``, folded by their ``hide-input`` tag) get a toggle that says
what it hides, "Show the model answer", instead of myst-nb's "Show code cell source".
"""

from __future__ import annotations

import json

from sphinx.application import Sphinx

CHECK_TAG = "exercise-check"
FOLD_TAG = "hide-cell"
SHOW_PROMPT = "Show the check (hidden tests and result)"
HIDE_PROMPT = "Hide the check"
SHOW_ANSWER = "Show the model answer"
HIDE_ANSWER = "Hide the model answer"


def is_check_cell(cell: dict) -> bool:
    """True for an exercise's check cell: a code cell graded by nbgrader (``grade: true``)."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and nbgrader.get("grade") is True


def is_answer_cell(cell: dict) -> bool:
    """True for an exercise's answer cell: a code cell nbgrader marks ``solution: true``."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and nbgrader.get("solution") is True


def fold_check_cells(notebook: dict) -> int:
    """Tag every check cell of ``notebook`` (a parsed .ipynb) to be folded; return how many.

    Also names the toggle of every answer cell ("Show the model answer").
    """
    count = 0
    for cell in notebook.get("cells", []):
        if is_answer_cell(cell):
            prompts = cell.setdefault("metadata", {}).setdefault("mystnb", {})
            prompts.setdefault("code_prompt_show", SHOW_ANSWER)
            prompts.setdefault("code_prompt_hide", HIDE_ANSWER)
        if not is_check_cell(cell):
            continue
        metadata = cell.setdefault("metadata", {})
        tags = metadata.setdefault("tags", [])
        if "remove-cell" not in tags:
            for tag in (FOLD_TAG, CHECK_TAG):
                if tag not in tags:
                    tags.append(tag)
            prompts = metadata.setdefault("mystnb", {})
            prompts.setdefault("code_prompt_show", SHOW_PROMPT)
            prompts.setdefault("code_prompt_hide", HIDE_PROMPT)
        count += 1
    return count


def _fold(app: Sphinx, docname: str, source: list[str]) -> None:
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    notebook = json.loads(source[0])
    checks = fold_check_cells(notebook)
    if checks or any(map(is_answer_cell, notebook.get("cells", []))):
        source[0] = json.dumps(notebook)


def setup(app: Sphinx) -> dict:
    app.connect("source-read", _fold)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
