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
- a figure gets the alt text the book stores in its cell metadata (``mystnb.image.alt``).

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains feedback.
"""

from __future__ import annotations

import re

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from .format import BEGIN_HIDDEN, END_HIDDEN

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
                output["text"] = shorten_paths(output.get("text", ""))
            elif kind == "error":
                output["traceback"] = self._traceback(output, printed)
                output["evalue"] = shorten_paths(str(output.get("evalue", "")))
        alt = cell.metadata.get("mystnb", {}).get("image", {}).get("alt")
        if alt and "alt" not in cell.metadata:
            cell.metadata["alt"] = alt
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
