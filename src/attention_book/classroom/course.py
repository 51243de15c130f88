"""Build an nbgrader course from the chapters and run nbgrader in it, safely on a live course.

The course folder lives *outside* the clone (a ``git clean`` must never take the grades
with it) and holds two configuration files:

- ``nbgrader_config.py``: the instructor's. It is written once, when missing, and never
  changed after; it loads the book's file first, so every line in it overrides the book.
- ``attention_book_config.py``: the book's settings (course id, timeouts, missing check
  cells restored, student-friendly feedback), rewritten by every ``generate``.

``generate`` copies and generates only the chapters asked for, so the gradebook and
``nbgrader export`` know only those, and it never touches a chapter that has submissions:
nbgrader would delete its ``release/`` folder and then refuse to change the gradebook.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows how to use it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .format import chapter_number, find_chapters
from .leaks import leaked_solution_text

COURSE_ID = "attention-step-by-step"
BOOK_CONFIG = "attention_book_config.py"
INSTRUCTOR_CONFIG = "nbgrader_config.py"
LOAD_LINE = f'load_subconfig("{BOOK_CONFIG}")  # noqa: F821 - the book\'s settings, see that file'

_BOOK_CONFIG_TEXT = '''\
# The book's nbgrader settings for this course. Rewritten by
# `python -m attention_book.classroom generate` (`make assignments`): do not edit.
# nbgrader_config.py loads this file first; put your own settings there, they win.
c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {root!r}
c.CourseDirectory.db_url = {db_url!r}
# A chapter cell may train a small model: give each cell up to five minutes.
c.Execute.timeout = 300
# A check cell that a student deleted comes back (with its hidden tests) and is graded.
c.OverwriteCells.add_missing_cells = True
# Feedback for students: hidden tests left out, short tracebacks without the package's
# internals or the instructor's paths, figures with the book's alt text.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "attention_book.classroom.feedback.StudentFeedback",
]
# A submission is untrusted HTML: the book makes autograded notebooks inert (text and images
# only, markdown escaped; attention_book.classroom.sanitise), and nbconvert's sanitiser cleans
# any HTML output left in one that did not pass through the book. On a hub, put this line in
# ~/.jupyter/nbgrader_config.py too: the formgrader reads that file, not this one.
c.HTMLExporter.sanitize_html = True
'''

_INSTRUCTOR_CONFIG_TEXT = f'''\
# nbgrader settings of this course: yours to edit. `python -m attention_book.classroom`
# writes this file only when it does not exist and never changes it afterwards.
c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file
# The book's settings (course id, timeouts, restored check cells, feedback); every line
# below this one overrides them.
{LOAD_LINE}

# Your settings, for example the exchange of a JupyterHub course:
# c.Exchange.root = "/srv/nbgrader/exchange"
# c.CourseDirectory.course_id = "attention-step-by-step"
'''

_LOG_RECORD = re.compile(r"^\[(?:(?P<app>[\w.-]+) \| )?(?P<level>[A-Z]+)\] ?(?P<message>.*)$")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(: .*)?$")
_GENERIC_ERRORS = ("Please see the the above traceback", "Please see the above traceback",
                   "There was an error processing assignment")


# --------------------------------------------------------------------------- nbgrader


class NbgraderError(RuntimeError):
    """nbgrader failed; the message holds the real cause, not the end of its log."""


def nbgrader_errors(log: str) -> list[str]:
    """Pick the real causes out of an nbgrader log.

    nbgrader logs an error as an ``[App | ERROR]`` line, often followed by an indented
    traceback whose last line is the cause, and then by generic lines ("Please see the
    above traceback"). This returns every cause, once, in order.

    Args:
        log: nbgrader's stdout and stderr.

    Returns:
        The error messages and the last line of each traceback; generic lines left out.
    """
    if not isinstance(log, str):
        raise TypeError(f"log must be a str, got {type(log).__name__}")
    causes: list[str] = []
    records: list[tuple[str, str, list[str]]] = []
    for line in log.splitlines():
        match = _LOG_RECORD.match(line)
        if match:
            records.append((match["level"], match["message"], []))
        elif records:
            records[-1][2].append(line)
        elif line.strip():
            records.append(("OTHER", line, []))
    for level, message, continuation in records:
        body = [line.strip() for line in continuation
                if line.strip() and not set(line.strip()) <= set("^~ ")]
        if level in {"ERROR", "CRITICAL"}:
            if message.startswith("Traceback") or (body and body[0].startswith("File ")):
                raised = [line for line in body if _EXCEPTION_LINE.match(line)]
                cause = raised[-1] if raised else body[-1] if body else message
            elif any(generic in message for generic in _GENERIC_ERRORS) and not body:
                continue
            else:
                cause = " ".join([message, *body]) if body else message
        elif (level == "OTHER" or any(line.startswith("Traceback (most recent call last)")
                                      for line in [message, *body])):
            # an uncaught exception that Python printed itself, inside or after a record
            raised = [line for line in [message, *body] if _EXCEPTION_LINE.match(line)]
            if not raised:
                continue
            cause = raised[-1]
        else:
            continue
        if cause not in causes:
            causes.append(cause)
    return causes


def run_nbgrader(course_dir: str | os.PathLike, *args: str, log_name: str | None = None,
                 check: bool = True) -> subprocess.CompletedProcess:
    """Run ``nbgrader <args>`` inside ``course_dir`` with this Python environment.

    The kernel that autograding starts is ``python`` from ``PATH``; this environment's
    ``bin`` folder goes first on ``PATH`` so that kernel sees the same packages (and
    nbgrader finds its ``alembic``).

    Args:
        course_dir: the nbgrader course folder (holds ``nbgrader_config.py``).
        *args: the nbgrader sub-command and its arguments.
        log_name: if given, the whole log is also written to ``course_dir/logs/<log_name>``.
        check: raise :class:`NbgraderError` when nbgrader fails or logs an error.

    Returns:
        The finished process (stdout and stderr captured).

    Raises:
        NbgraderError: nbgrader failed; the message names every cause it logged.
    """
    course = Path(course_dir)
    if not course.is_dir():
        raise ValueError(f"course_dir {course} is not a folder")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # no debugger warning in the kernel
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course, env=env, capture_output=True, text=True, check=False,
    )
    log = result.stdout + result.stderr
    if log_name:
        (course / "logs").mkdir(exist_ok=True)
        (course / "logs" / log_name).write_text(log, encoding="utf-8")
    if check and (result.returncode != 0 or " | ERROR]" in log):
        causes = nbgrader_errors(log) or [log.strip().splitlines()[-1] if log.strip()
                                          else "no output"]
        where = f" (whole log: logs/{log_name})" if log_name else ""
        raise NbgraderError(f"nbgrader {' '.join(args)} failed (exit {result.returncode})"
                            f"{where}:\n" + "\n".join(f"  {cause}" for cause in causes))
    return result


# --------------------------------------------------------------------------- config


def check_course_dir(course_dir: str | os.PathLike, root: str | os.PathLike) -> Path:
    """Return ``course_dir`` resolved, or refuse a folder inside the repository clone.

    Args:
        course_dir: where the course lives.
        root: the repository root (holds ``chapters/``).

    Returns:
        The absolute course folder.

    Raises:
        ValueError: the course folder is inside the clone, where ``git clean`` or a fresh
            clone would lose the gradebook and every submission.
    """
    course, repo = Path(course_dir).resolve(), Path(root).resolve()
    if course == repo or repo in course.parents:
        raise ValueError(
            f"the course folder {course} is inside the repository {repo}; grades and "
            "submissions must outlive the clone. Choose a folder outside it, e.g. "
            "COURSE_DIR=$HOME/attention-course")
    return course


def write_course_config(course_dir: str | os.PathLike, course_id: str = COURSE_ID) -> list[str]:
    """Write the book's config, and the instructor's only when it is missing.

    An existing ``nbgrader_config.py`` is never rewritten; when it does not load the
    book's file yet (a course from an older version), the load line is inserted after its
    ``get_config()`` line and nothing else changes.

    Args:
        course_dir: the course folder (created if missing).
        course_id: nbgrader's course id (also what students' exchange config must name).

    Returns:
        What was done, one sentence per file.
    """
    if not isinstance(course_id, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", course_id):
        raise ValueError(f"course_id must be letters, digits, '-', '_' or '.', got {course_id!r}")
    course = Path(course_dir).resolve()
    course.mkdir(parents=True, exist_ok=True)
    done = []
    book = _BOOK_CONFIG_TEXT.format(course_id=course_id, root=str(course),
                                    db_url=f"sqlite:///{course / 'gradebook.db'}")
    (course / BOOK_CONFIG).write_text(book, encoding="utf-8")
    done.append(f"wrote {BOOK_CONFIG} (the book's settings)")
    instructor = course / INSTRUCTOR_CONFIG
    if not instructor.exists():
        instructor.write_text(_INSTRUCTOR_CONFIG_TEXT, encoding="utf-8")
        done.append(f"wrote {INSTRUCTOR_CONFIG} (yours from now on)")
    else:
        text = instructor.read_text(encoding="utf-8")
        if BOOK_CONFIG in text:
            done.append(f"kept your {INSTRUCTOR_CONFIG}")
        else:
            lines = text.splitlines()
            at = next((i + 1 for i, line in enumerate(lines) if "get_config()" in line), 0)
            lines[at:at] = [LOAD_LINE]
            instructor.write_text("\n".join(lines) + "\n", encoding="utf-8")
            done.append(f"added one line to your {INSTRUCTOR_CONFIG}: {LOAD_LINE.split('  #')[0]}"
                        " (your settings below it still win)")
    return done


# --------------------------------------------------------------------------- chapters


def select_chapters(root: str | os.PathLike, selectors: Iterable[str] | None = None) -> list[Path]:
    """Return the chapter notebooks that ``selectors`` name (all of them for ``None``).

    Args:
        root: the repository root.
        selectors: chapter numbers (``"02"``, ``"4"``) or names (``"02_dot_product_attention"``).

    Returns:
        The chapter paths, in book order, each once.

    Raises:
        ValueError: a selector names no chapter, or there are no chapters at all.
    """
    chapters = find_chapters(root)
    if not chapters:
        raise ValueError(f"no chapter notebooks under {Path(root, 'chapters')}")
    if selectors is None:
        return chapters
    if isinstance(selectors, str):
        selectors = selectors.split()
    chosen = []
    for selector in selectors:
        if not isinstance(selector, str):
            raise TypeError(f"a chapter selector is a str, got {type(selector).__name__}")
        text = selector.strip().removesuffix(".ipynb")
        matches = [path for path in chapters
                   if path.stem == text or (text.isdigit() and chapter_number(path) == int(text))]
        if not matches:
            known = ", ".join(path.stem for path in chapters)
            raise ValueError(f"no chapter matches {selector!r}; the chapters are: {known}")
        chosen += [path for path in matches if path not in chosen]
    return sorted(chosen, key=chapter_number)


def _exchange_inbound(course: Path, assignment: str) -> set[str]:
    """Students whose submission of ``assignment`` waits in the exchange, not yet collected."""
    if not (course / INSTRUCTOR_CONFIG).exists():
        return set()
    try:
        from jupyter_core.paths import jupyter_config_path
        from traitlets.config import Config
        from traitlets.config.loader import ConfigFileNotFound, PyFileConfigLoader

        config = Config()
        for folder in [*reversed(jupyter_config_path()), str(course)]:  # lowest priority first
            try:
                config.merge(PyFileConfigLoader(INSTRUCTOR_CONFIG, path=folder).load_config())
            except ConfigFileNotFound:
                continue
        root = config.Exchange.get("root", "/srv/nbgrader/exchange")
        course_id = config.CourseDirectory.get("course_id", COURSE_ID)
    except Exception:  # noqa: BLE001 - no readable config: nothing to find
        return set()
    inbound = Path(str(root), str(course_id), "inbound")
    if not inbound.is_dir():
        return set()
    return {path.name.split("+")[0] for path in inbound.glob(f"*+{assignment}+*")}


def submissions_of(course_dir: str | os.PathLike, assignment: str) -> list[str]:
    """Who has handed in ``assignment``: the gradebook, ``submitted/``, ``autograded/`` and
    the exchange's inbound folder (submitted, not collected yet).

    Args:
        course_dir: the course folder.
        assignment: the assignment id.

    Returns:
        The student ids, sorted.
    """
    course = Path(course_dir)
    students = {path.parent.name for folder in ("submitted", "autograded")
                for path in course.glob(f"{folder}/*/{assignment}") if path.is_dir()}
    students |= _exchange_inbound(course, assignment)
    database = course / "gradebook.db"
    if database.exists():
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(f"sqlite:///{database.resolve()}") as gradebook:
            try:
                record = gradebook.find_assignment(assignment)
            except MissingEntry:
                pass
            else:
                students |= {submission.student.id for submission in record.submissions}
    return sorted(students)


@dataclass
class CourseBuild:
    """What ``generate`` did.

    Args:
        released: each generated assignment id mapped to its student notebook.
        skipped: each assignment left alone, mapped to the reason.
        config: what happened to the two configuration files.
    """

    released: dict[str, Path] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    config: list[str] = field(default_factory=list)


def prepare_course(course_dir: str | os.PathLike, chapters: Sequence[str | os.PathLike],
                   course_id: str = COURSE_ID) -> CourseBuild:
    """Write the config and copy each chapter without submissions into ``source/``.

    Args:
        course_dir: where to build the course (created if missing).
        chapters: instructor notebooks, e.g. from :func:`select_chapters`.
        course_id: nbgrader's course id.

    Returns:
        A :class:`CourseBuild` whose ``released`` maps each copied chapter to its copy in
        ``source/`` (:func:`build_assignments` replaces it by the student version) and whose
        ``skipped`` names the chapters that already have submissions.
    """
    course = Path(course_dir).resolve()
    build = CourseBuild(config=write_course_config(course, course_id))
    for chapter in chapters:
        assignment = Path(chapter).stem
        students = submissions_of(course, assignment)
        if students:
            build.skipped[assignment] = (
                f"{len(students)} submission(s) already; nbgrader cannot change a chapter "
                "after students handed it in, so its release/ and gradebook entry stay as "
                "they are")
            continue
        target = course / "source" / assignment
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(chapter, target / f"{assignment}.ipynb")
        build.released[assignment] = target / f"{assignment}.ipynb"
    return build


_BATCH = '''\
import json, sys
from nbgrader.apps import NbGraderAPI
from nbgrader.apps.nbgraderapp import NbGrader
app = NbGrader()
app.config_file_paths.append(".")
app.load_config_file()
api = NbGraderAPI(config=app.config)
for assignment in sys.argv[1:]:
    result = api.generate_assignment(assignment, force=True, create=True)
    print(json.dumps({"assignment": assignment, "success": result["success"],
                      "log": result.get("log", ""), "error": result.get("error", "")}))
'''


def generate_assignments(course_dir: str | os.PathLike,
                         assignments: Sequence[str] | None = None) -> dict[str, Path]:
    """Run ``nbgrader generate_assignment`` for each assignment, in one nbgrader process.

    Args:
        course_dir: a course folder written by :func:`prepare_course`.
        assignments: the ids to generate; ``None`` for every folder in ``source/``.

    Returns:
        Each assignment id mapped to its student notebook under ``release/``.

    Raises:
        NbgraderError: nbgrader refused an assignment; the message names its real cause.
        ValueError: there is nothing to generate.
    """
    import json

    course = Path(course_dir).resolve()
    if assignments is None:
        source = course / "source"
        assignments = sorted(p.name for p in source.iterdir() if p.is_dir()) \
            if source.is_dir() else []
    if not assignments:
        raise ValueError(f"no assignments to generate in {course / 'source'}")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    result = subprocess.run([sys.executable, "-c", _BATCH, *assignments], cwd=course, env=env,
                            capture_output=True, text=True, check=False)
    (course / "logs").mkdir(exist_ok=True)
    (course / "logs" / "generate_assignment.log").write_text(result.stdout + result.stderr,
                                                              encoding="utf-8")
    outcomes = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            outcome = json.loads(line)
            outcomes[outcome["assignment"]] = outcome
    failures = []
    for assignment in assignments:
        outcome = outcomes.get(assignment)
        if outcome is None:
            causes = nbgrader_errors(result.stderr) or [result.stderr.strip()[-500:]]
            failures.append(f"{assignment}: nbgrader stopped: " + "; ".join(causes))
        elif not outcome["success"]:
            log = outcome["log"] + "\n[GenerateAssignmentApp | ERROR] " + outcome["error"]
            failures.append(f"{assignment}: " + "; ".join(nbgrader_errors(log)))
    if failures:
        raise NbgraderError("nbgrader generate_assignment refused (whole log: "
                            "logs/generate_assignment.log):\n"
                            + "\n".join(f"  {failure}" for failure in failures))
    released = {}
    for assignment in assignments:
        student = course / "release" / assignment / f"{assignment}.ipynb"
        if not student.exists():
            raise NbgraderError(f"nbgrader wrote no student version {student}")
        released[assignment] = student
    return released


def build_assignments(root: str | os.PathLike, course_dir: str | os.PathLike,
                      chapters: Iterable[str] | None = None,
                      course_id: str = COURSE_ID, *, new: bool = False) -> CourseBuild:
    """Generate the student version of the chosen chapters and check it hides the solutions.

    Safe to rerun on a live course: chapters with submissions are skipped (and said so),
    the instructor's ``nbgrader_config.py`` is kept, only the chosen chapters are
    registered in the gradebook.

    Args:
        root: the repository root (holds ``chapters/``).
        course_dir: the course folder, outside the repository.
        chapters: chapter selectors (see :func:`select_chapters`); ``None`` for all.
        course_id: nbgrader's course id.
        new: create the course when the folder holds none yet (the first time); without it,
            a folder that is not a course is refused, so a typo never starts a new course.

    Returns:
        A :class:`CourseBuild`.

    Raises:
        ValueError: the course folder is inside the repository, holds no course (and
            ``new`` is false), or a chapter is unknown.
        NbgraderError: nbgrader failed, or a student version leaks a solution.
    """
    course = check_course_dir(course_dir, root)
    if not new and not (course / INSTRUCTOR_CONFIG).exists():
        raise ValueError(f"no course at {course}: check COURSE_DIR, or create the course with "
                         "`make assignments COURSE_DIR=… NEW=1` (--new)")
    selected = select_chapters(root, chapters)
    build = prepare_course(course, selected, course_id)
    if build.released:
        build.released = generate_assignments(course, list(build.released))
    for chapter in selected:
        if chapter.stem not in build.released:
            continue
        instructor = nbformat.read(chapter, as_version=4)
        student = nbformat.read(build.released[chapter.stem], as_version=4)
        leaks = leaked_solution_text(instructor, student)
        if leaks:
            raise NbgraderError(f"the student version of {chapter.name} still contains "
                                f"solution text: {leaks[:5]}")
    return build


# --------------------------------------------------------------------------- a course


def course_folder(course_dir) -> Path:
    """The course folder, which must exist and hold ``nbgrader_config.py``.

    Args:
        course_dir: the folder the instructor named (``COURSE_DIR``).

    Returns:
        Its absolute path.

    Raises:
        ValueError: there is no course there (with what to do about it).
    """
    if not course_dir:
        raise ValueError("name the course folder with --course-dir or COURSE_DIR")
    course = Path(course_dir).expanduser().resolve()
    if not course.is_dir():
        raise ValueError(f"no course at {course}: check COURSE_DIR, or create a course there "
                         "with `make assignments COURSE_DIR=… NEW=1`")
    if not (course / "nbgrader_config.py").exists():
        raise ValueError(f"{course} is not a course folder (no nbgrader_config.py): check "
                         "COURSE_DIR, or create a course with `make assignments … NEW=1`")
    return course


def known_assignments(course_dir) -> list[str]:
    """The assignments of a course: the folders of ``source/`` and ``release/``.

    Args:
        course_dir: the course folder.

    Returns:
        Assignment ids, sorted.
    """
    course = course_folder(course_dir)
    names = {path.name for folder in ("source", "release")
             for path in (course / folder).glob("*") if path.is_dir()}
    return sorted(names)


def resolve_assignment(course_dir, name: str) -> str:
    """The assignment id that ``name`` means: an id, or a chapter number like ``02``.

    Args:
        course_dir: the course folder.
        name: what the instructor typed (``ASSIGNMENT=02``).

    Returns:
        The assignment id.

    Raises:
        ValueError: ``name`` is empty, unknown or ambiguous (the message lists the known ones).
    """
    known = known_assignments(course_dir)
    have = ", ".join(known) if known else "none yet: run `make assignments` first"
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name the assignment, e.g. ASSIGNMENT=02 (have {have})")
    text = name.strip().rstrip("/").removesuffix(".ipynb")
    if text in known:
        return text
    matches = [a for a in known if text.isdigit() and a.split("_", 1)[0].isdigit()
               and int(a.split("_", 1)[0]) == int(text)]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(f"unknown assignment {name!r} (have {have})")
