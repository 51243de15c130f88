"""Feedback a student can read: no hidden tests, no package internals, no instructor paths.

nbgrader's feedback is the autograded notebook as HTML. Left alone it shows each check
cell's hidden tests, every failure message twice (printed by the checker, then again in
the exception) and a traceback through ``attention_book``'s files with the instructor's
absolute paths. :class:`StudentFeedback`, an nbconvert preprocessor that the book's course
config adds to ``GenerateFeedback.preprocessors``, fixes each of those:

- the lines between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` become one
  comment saying that hidden tests ran;
- an error output keeps the frames of the notebook's own cells (a frame on a hidden line
  becomes "a hidden test"), drops the frames in installed files, and ends with the
  exception, without repeating a message the cell already printed;
- absolute paths in error and stream outputs are shortened to the file's name;
- an answer that still raises ``NotImplementedError`` reads "not answered yet";
- outputs are reduced to text and images, and markdown (the student's and the comments
  under each answer) to inert HTML (:mod:`.sanitise`), so nothing the student wrote or their
  code displayed runs as a script in the page;
- a figure gets the alt text the book stores in its cell metadata (``mystnb.image.alt``);
- printed output is capped (:data:`OUTPUT_CHARACTERS` an output), so a 50 MB print cannot
  make a 50 MB page;
- each check cell ends with one line giving its points, which come from the clean grading
  (:mod:`.clean`), so "Correct" printed in the student's own run never stands beside a 0
  without a word.

:func:`write_feedback` runs ``nbgrader generate_feedback`` for the graded students and
writes a plain page (scores and comments from the gradebook) for anyone whose notebook
nbgrader could not re-run, so every student gets feedback.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains feedback.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from .format import BEGIN_HIDDEN, END_HIDDEN, exercise_of
from .sanitise import inert_notebook

OUTPUT_CHARACTERS = 10_000

HIDDEN_NOTE = "# (hidden tests ran here when your work was graded; they are not shown)"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CELL_FRAME = re.compile(r"^(?:Cell|Input) In ?\[(?P<count>\d+)\], line (?P<line>\d+)")
_CONTEXT_LINE = re.compile(r"^\s*(?:-*>)?\s*(\d+)\b")
_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/:'\"()<>,]+/)+(?P<name>[^\s/:'\"()<>,]+)")


def strip_hidden_tests(source: str) -> str:
    """Replace every hidden-test block of a cell with one comment line.

    Args:
        source: a cell's source.

    Returns:
        The source without the hidden tests (and their markers).
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    kept, hidden = [], False
    for line in source.splitlines():
        if BEGIN_HIDDEN in line:
            hidden = True
            kept.append(line[: len(line) - len(line.lstrip())] + HIDDEN_NOTE)
        elif END_HIDDEN in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept)


def hidden_lines(source: str) -> set[int]:
    """The 1-based line numbers of ``source`` inside hidden-test blocks (markers included).

    Args:
        source: a cell's source.

    Returns:
        The line numbers.
    """
    lines, hidden = set(), False
    for number, line in enumerate(source.splitlines(), start=1):
        if BEGIN_HIDDEN in line:
            hidden = True
        if hidden:
            lines.add(number)
        if END_HIDDEN in line:
            hidden = False
    return lines


def shorten_paths(text: str) -> str:
    """Replace absolute paths in ``text`` by ``…/<file name>``.

    Args:
        text: any output text.

    Returns:
        The text without directory names.
    """
    return _PATH.sub(lambda match: f"…/{match['name']}", text)


class StudentFeedback(Preprocessor):
    """nbconvert preprocessor for nbgrader's feedback (see the module docstring)."""

    enabled = Bool(True, help="nbconvert runs a preprocessor only when it is enabled").tag(
        config=True)

    def preprocess(self, nb, resources):
        """Clean every cell of the autograded notebook ``nb`` before it becomes HTML.

        Args:
            nb: the autograded notebook.
            resources: nbconvert's resources (unchanged).

        Returns:
            ``(nb, resources)``.
        """
        # Everything shown is the student's: outputs become text and images, markdown and
        # the comments under each answer inert HTML (the autograded notebook already is;
        # this holds for one made by plain nbgrader too).
        inert_notebook(nb)
        self._hidden_by_count = {}
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.get("execution_count") is not None:
                self._hidden_by_count[cell.execution_count] = hidden_lines(cell.source)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        """Strip hidden tests, shorten tracebacks and paths, add alt text to one cell.

        Args:
            cell: a notebook cell.
            resources: nbconvert's resources.
            index: the cell's position.

        Returns:
            ``(cell, resources)``.
        """
        if cell.cell_type != "code":
            return cell, resources
        cell.source = strip_hidden_tests(cell.source)
        printed = "".join(output.get("text", "") for output in cell.get("outputs", [])
                          if output.get("output_type") == "stream")
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                text = shorten_paths(output.get("text", ""))
                if len(text) > OUTPUT_CHARACTERS:
                    text = (text[:OUTPUT_CHARACTERS]
                            + f"\n… ({len(text) - OUTPUT_CHARACTERS:,} more characters left out)\n")
                output["text"] = text
            elif kind == "error":
                output["traceback"] = self._traceback(output, printed)
                output["evalue"] = shorten_paths(str(output.get("evalue", "")))
        alt = cell.metadata.get("mystnb", {}).get("image", {}).get("alt")
        if alt and "alt" not in cell.metadata:
            cell.metadata["alt"] = alt
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution") and meta.get("score") is not None:
            from nbformat.v4 import new_output

            cell.outputs.append(new_output("stream", name="stdout", text=(
                f"Points for this check: {float(meta['score']):g} of "
                f"{float(meta.get('points') or 0):g}, from the clean run of your answer cell "
                "(the comment on your answer says why).\n")))
        return cell, resources

    def _traceback(self, output, printed: str) -> list[str]:
        frames, dropped = [], 0
        for entry in output.get("traceback", [])[:-1]:
            plain = _ANSI.sub("", entry)
            match = _CELL_FRAME.match(plain)
            if not match:
                dropped += plain.lstrip().startswith("File ")  # a frame in an installed file
                continue
            count, line = int(match["count"]), int(match["line"])
            hidden = self._hidden_by_count.get(count, set())
            if line in hidden:
                frames.append(f"In a hidden test (line {line} of this cell, not shown)")
                continue
            shown = [text for text in plain.splitlines()
                     if not ((number := _CONTEXT_LINE.match(text)) and int(number[1]) in hidden)]
            frames.append(shorten_paths("\n".join(shown)))
        name = output.get("ename", "Error")
        value = shorten_paths(str(output.get("evalue", ""))).strip()
        if name == "NotImplementedError" and not value:
            summary = ("NotImplementedError: this exercise is not answered yet (its answer "
                       "cell still raises NotImplementedError)")
        elif value and value in shorten_paths(printed):
            summary = f"{name}: see the message printed above"
        elif value:
            summary = f"{name}: {value}"
        else:
            summary = f"{name}: a check of this exercise failed"
        if dropped:
            frames.append(f"({dropped} step(s) inside the book's package left out)")
        return frames + [summary]


def _problems(course: Path, assignment: str, student: str) -> list[str]:
    import csv

    path = course / "grading" / f"summary-{assignment}.csv"
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as handle:
        return [shorten_paths(row["cause"]) for row in csv.DictReader(handle)
                if row["student"] == student and not row["exercise"] and row["cause"]]


def _fallback_page(course: Path, assignment: str, student: str) -> str:
    """A plain feedback page from the gradebook: each exercise's score and comment."""
    from nbgrader.api import Gradebook

    rows = []
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission(assignment, student)
        for notebook in submission.notebooks:
            comments = {exercise_of(c.name): c.comment for c in notebook.comments}
            scores: dict[str, list[float]] = {}
            for grade in notebook.grades:
                entry = scores.setdefault(exercise_of(grade.name), [0.0, 0.0])
                entry[0] += float(grade.score or 0.0)
                entry[1] += float(grade.max_score or 0.0)
            for key, (score, points) in sorted(scores.items()):
                rows.append(f"<tr><td>{html.escape(key)}</td><td>{score:g} / {points:g}</td>"
                            f"<td><pre>{html.escape(comments.get(key) or '')}</pre></td></tr>")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Feedback: {html.escape(assignment)}</title></head><body>"
            f"<h1>Feedback on {html.escape(assignment)}</h1>"
            "<p>Your notebook could not be re-run for the usual feedback page; your grade "
            "comes from a clean run of each answer cell, and the comments below say what "
            "counted.</p>"
            + "".join(f"<p>What happened: {html.escape(p)}</p>"
                      for p in _problems(course, assignment, student))
            + "<table><thead><tr><th>exercise</th><th>points</th><th>comment</th></tr></thead>"
            + f"<tbody>{''.join(rows)}</tbody></table></body></html>")


def write_feedback(course_dir, assignment: str, students: list[str] | None = None) -> list[str]:
    """Feedback pages for the graded students of ``assignment``.

    Args:
        course_dir: the course folder.
        assignment: the assignment id or its chapter number.
        students: only these student ids (default: everyone graded).

    Returns:
        What was written, one line per student.

    Raises:
        ValueError: no course, an unknown assignment, or nothing graded yet.
    """
    from nbgrader.api import Gradebook, MissingEntry

    from .course import course_folder, resolve_assignment

    course = course_folder(course_dir)
    assignment = resolve_assignment(course, assignment)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        try:
            graded = sorted(s.student.id for s in gradebook.find_assignment(assignment).submissions)
        except MissingEntry:
            graded = []
    if students:
        unknown = [s for s in students if s not in graded]
        if unknown:
            raise ValueError(f"no graded work of {assignment} by {', '.join(unknown)} (graded: "
                             f"{', '.join(graded) or 'nobody yet'}); run `make autograde` first")
        graded = [s for s in graded if s in students]
    if not graded:
        raise ValueError(f"nobody's work on {assignment} has been graded yet: run "
                         f"`make autograde ASSIGNMENT={assignment}` first")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    rerun = [s for s in graded if any((course / "autograded" / s / assignment).glob("*.ipynb"))]
    if rerun:
        command = [sys.executable, "-m", "nbgrader", "generate_feedback", assignment, "--force"]
        # nbgrader takes one --student at a time: one run for everyone, or one per student
        runs = [command] if students is None else [[*command, "--student", s] for s in rerun]
        log = []
        for run in runs:
            process = subprocess.run(run, cwd=course, env=env, capture_output=True, text=True,
                                     check=False)
            log.append(process.stdout + process.stderr)
        (course / "logs").mkdir(exist_ok=True)
        (course / "logs" / f"feedback-{assignment}.log").write_text("\n".join(log),
                                                                      encoding="utf-8")
    lines = []
    for student in graded:
        page = course / "feedback" / student / assignment / f"{assignment}.html"
        if page.exists() and student in rerun:
            lines.append(f"{student}: feedback/{student}/{assignment}/{page.name}")
            continue
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(_fallback_page(course, assignment, student), encoding="utf-8")
        lines.append(f"{student}: feedback/{student}/{assignment}/{page.name} (scores and "
                     "comments only: the notebook could not be re-run)")
    lines.append(f"(nbgrader release_feedback {assignment} hands them out on a hub)")
    return lines
