"""Autograde in clean processes, keep every flag, export only what was handed in.

:func:`autograde` grades one assignment for every student who handed it in (or the ones
named), in three steps that never stop for one student's sake:

1. **nbgrader's own run, for the feedback only.** Each submission is copied, notebook only,
   into ``grading/staged/`` with its nbgrader metadata restored from the instructor's
   version (a duplicated or invented grade id, a demoted check cell or a changed point
   value cannot make nbgrader stop), and ``nbgrader autograde`` re-runs it in the sandboxed
   kernel (:mod:`.sandbox`: a private read-only view of the files, no course folder, no
   gradebook). A student whose run fails (a dead kernel, a hang) is named, with the cause.
2. **The grade.** Every exercise is graded in clean processes (:mod:`.clean`): the answer
   cell alone, sandboxed, called from the trusted hidden tests. Those scores replace
   nbgrader's in the gradebook, and each answer cell gets a comment saying what counted.
3. **Integrity.** Integrity findings (a forbidden call, the checkers imported, something
   the sandbox refused) are flags: the exercise scores 0, the flag is written to
   ``grading/flags.json`` and applied again by every later run, so a rerun never undoes
   it. A manual score that appeared in the gradebook during the run (the formgrader is the
   only place manual scores come from) is put back and reported. An instructor who
   disagrees with a flag sets a manual score in the formgrader; it wins.

Printed output in the autograded notebooks is capped (a 50 MB print stays a few lines)
and any output that repeats a hidden test is removed. ``grading/summary-<assignment>.csv``
lists every exercise of every student with its score and cause.

:func:`export_grades` writes nbgrader's ``grades.csv`` for the assignments that students
have handed in and ``exercises.csv`` with one row per student and exercise.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows how to use it.
"""

from __future__ import annotations

import copy
import csv
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .clean import ExerciseResult, Limits, grade_submissions, read_exercises
from .course import run_nbgrader
from .format import BEGIN_HIDDEN, END_HIDDEN, exercise_of

GRADING = "grading"  # the book's folder inside the course
KERNEL_NAME = "attention-book-grading"
OUTPUT_CHARACTERS = 10_000  # per output of an autograded notebook
NOTEBOOK_OUTPUT_CHARACTERS = 200_000
_FAILED_BLOCK = re.compile(r"There was an error processing assignment: (?P<path>[^\n]+)")


@dataclass
class StudentGrade:
    """One student's notebook of one assignment, graded.

    Args:
        student: the student id.
        notebook: the notebook id.
        exercises: the clean grade of each exercise.
        problems: what went wrong for this student outside the exercises (nbgrader's
            feedback run failed, the notebook could not be read), as sentences.
        flags: each exercise's integrity flags, this run's and every earlier run's.
        kept_manual: grade ids that are flagged or failed but keep the instructor's manual
            score.
        reverted: manual scores that appeared during the run and were put back.
    """

    student: str
    notebook: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    flags: dict[str, list[str]] = field(default_factory=dict)
    kept_manual: list[str] = field(default_factory=list)
    reverted: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        """Autograded points after flags."""
        return sum(0.0 if self.flags.get(e.key) else e.score for e in self.exercises)


@dataclass
class AutogradeReport:
    """What :func:`autograde` did.

    Args:
        assignment: the assignment id.
        students: one :class:`StudentGrade` per graded notebook.
        isolated: the answers and kernels ran in the private file view.
        summary: the CSV with every exercise of every student.
        seconds: wall-clock time of the whole run.
    """

    assignment: str
    students: list[StudentGrade]
    isolated: bool
    summary: Path
    seconds: float


# --------------------------------------------------------------------------- the course


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


_course = course_folder


def _db_url(course: Path) -> str:
    return f"sqlite:///{course / 'gradebook.db'}"


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


def _grading_dir(course: Path) -> Path:
    folder = course / GRADING
    folder.mkdir(exist_ok=True)
    return folder


def _submitted(course: Path, assignment: str, students: list[str] | None) -> dict[str, Path]:
    """Each student's submitted notebook of ``assignment`` (one notebook per assignment)."""
    found = {}
    for folder in sorted((course / "submitted").glob(f"*/{assignment}")):
        if not folder.is_dir():
            continue
        notebook = folder / f"{assignment}.ipynb"
        found[folder.parent.name] = notebook
    if students:
        unknown = [s for s in students if s not in found]
        if unknown:
            have = ", ".join(sorted(found)) or "nobody yet"
            raise ValueError(f"no submission of {assignment} by {', '.join(unknown)} "
                             f"(submitted/*/{assignment} has: {have})")
        found = {s: found[s] for s in students}
    return found


# --------------------------------------------------------------------------- staging


def _restored(submission: dict, source: dict) -> dict:
    """The submission with nbgrader metadata as the instructor wrote it.

    Cells whose grade id the instructor's version has keep it, once, with the instructor's
    metadata (points, lock, checksum); any other nbgrader metadata (a duplicate, an invented
    graded cell) is dropped, so nbgrader's run cannot fail on it.
    """
    wanted = {}
    for cell in source.get("cells", []):
        meta = (cell.get("metadata") or {}).get("nbgrader")
        if isinstance(meta, dict) and meta.get("grade_id"):
            wanted[meta["grade_id"]] = (cell.get("cell_type"), meta)
    notebook = copy.deepcopy(submission)
    seen = set()
    cells = []
    for cell in notebook.get("cells", []):
        if not isinstance(cell, dict):
            continue
        metadata = cell.setdefault("metadata", {}) if isinstance(cell.get("metadata"), dict) \
            else cell.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            cell["metadata"] = metadata = {}
        meta = metadata.get("nbgrader")
        grade_id = meta.get("grade_id") if isinstance(meta, dict) else None
        if grade_id in wanted and grade_id not in seen and cell.get("cell_type") == wanted[
                grade_id][0]:
            metadata["nbgrader"] = copy.deepcopy(wanted[grade_id][1])
            seen.add(grade_id)
        else:
            metadata.pop("nbgrader", None)
        cells.append(cell)
    notebook["cells"] = cells
    notebook.setdefault("metadata", {})
    notebook["metadata"]["kernelspec"] = (source.get("metadata") or {}).get(
        "kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    notebook["nbformat"], notebook["nbformat_minor"] = 4, max(
        5, int(notebook.get("nbformat_minor", 5) or 5))
    return notebook


def _stage(course: Path, assignment: str, notebooks: dict[str, Path], source: dict,
           problems: dict[str, list[str]]) -> Path:
    staged = _grading_dir(course) / "staged"
    if staged.exists():
        shutil.rmtree(staged)
    for student, path in notebooks.items():
        try:
            submission = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(submission, dict):
                raise ValueError("not a notebook")
        except (OSError, ValueError, UnicodeDecodeError) as error:
            problems[student].append(f"the notebook could not be read ({type(error).__name__}),"
                                     " so there is no feedback run")
            continue
        folder = staged / student / assignment
        folder.mkdir(parents=True)
        (folder / path.name).write_text(json.dumps(_restored(submission, source)),
                                        encoding="utf-8")
        for name in ("timestamp.txt", "submission_secret.txt"):  # nbgrader's own files
            if (path.parent / name).is_file():
                shutil.copyfile(path.parent / name, folder / name)
    return staged


def _sections(log: str, staged: Path) -> dict[str, str]:
    """Each student's part of an nbgrader autograde log (from their "Sanitizing" line on)."""
    marker = re.compile(r"\[AutogradeApp \| INFO\] Sanitizing (?P<path>\S+)")
    starts = [(m.start(), Path(m["path"]).relative_to(staged).parts[0])
              for m in marker.finditer(log) if Path(m["path"]).is_relative_to(staged)]
    sections: dict[str, str] = {}
    for index, (start, student) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(log)
        sections[student] = sections.get(student, "") + log[start:end]
    return sections


def _kernel_spec(course: Path) -> Path:
    """The sandboxed kernel for nbgrader's run, in a folder on ``JUPYTER_PATH``."""
    from . import sandbox

    folder = _grading_dir(course) / "jupyter"
    spec = folder / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []),
                 sandbox.__file__, "kernel", "-f", "{connection_file}"],
        "display_name": "Python 3 (sandboxed for grading)",
        "language": "python",
        "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1", "MPLBACKEND":
                "module://matplotlib_inline.backend_inline"},
    }, indent=1), encoding="utf-8")
    return folder


def _nbgrader_feedback_run(course: Path, assignment: str, staged: Path, students: list[str],
                           cell_timeout: int, timeout: float) -> tuple[dict[str, str], str]:
    """nbgrader autograde of the staged notebooks in the sandboxed kernel."""
    if not students:
        return {}, ""
    jupyter = _kernel_spec(course)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["JUPYTER_PATH"] = os.pathsep.join([str(jupyter), env.get("JUPYTER_PATH", "")]).rstrip(
        os.pathsep)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    command = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--force",
               f"--CourseDirectory.submitted_directory={staged.relative_to(course)}",
               f"--Execute.kernel_name={KERNEL_NAME}", f"--Execute.timeout={cell_timeout}",
               "--Execute.interrupt_on_timeout=True", "--Execute.raise_on_iopub_timeout=False"]
    failures: dict[str, str] = {}
    try:
        process = subprocess.run(command, cwd=course, env=env, capture_output=True, text=True,
                                 timeout=timeout, check=False)
        log = process.stdout + process.stderr
    except subprocess.TimeoutExpired as error:
        log = (error.stdout or b"").decode(errors="replace") if isinstance(
            error.stdout, bytes) else (error.stdout or "")
        for student in students:
            if not (course / "autograded" / student / assignment).exists():
                failures[student] = (f"nbgrader's feedback run was stopped after {timeout:g} s "
                                     "before it reached this notebook")
    (course / "logs").mkdir(exist_ok=True)
    (course / "logs" / f"autograde-{assignment}.log").write_text(log, encoding="utf-8")
    from .course import nbgrader_errors

    for student, section in _sections(log, staged).items():
        causes = [c for c in nbgrader_errors(section)
                  if "error processing" not in c.lower() and "see the" not in c.lower()
                  and "traceback" not in c.lower() and "interrupting kernel" not in c.lower()
                  and "subprocesses termination" not in c.lower()]
        if _FAILED_BLOCK.search(section):
            failures[student] = ("nbgrader's feedback run failed"
                                 + (f": {causes[-1][:300]}" if causes else ""))
        elif causes:
            failures[student] = ("nbgrader's feedback run was interrupted: "
                                 + "; ".join(dict.fromkeys(c[:200] for c in causes)))
    for student in students:
        if student not in failures and not any(
                (course / "autograded" / student / assignment).glob("*.ipynb")):
            causes = nbgrader_errors(log)
            failures[student] = ("nbgrader's feedback run made no notebook"
                                 + (f": {causes[-1][:300]}" if causes else "")
                                 + f" (whole log: logs/autograde-{assignment}.log)")
    return failures, log


# --------------------------------------------------------------------------- outputs


def _hidden_lines(source: dict) -> list[str]:
    lines = []
    for cell in source.get("cells", []):
        text = "".join(cell.get("source", "")) if isinstance(cell.get("source"), list) \
            else str(cell.get("source", ""))
        inside = False
        for line in text.splitlines():
            if BEGIN_HIDDEN in line:
                inside = True
                continue
            if END_HIDDEN in line:
                inside = False
            elif inside and len(line.strip()) >= 16:
                lines.append(line.strip())
    return lines


def bound_outputs(notebook: dict, hidden_lines: list[str]) -> dict:
    """Cap printed output and drop any output that repeats a hidden test line.

    Args:
        notebook: a notebook as a dict (changed in place and returned).
        hidden_lines: the hidden tests' lines (:func:`_hidden_lines`).

    Returns:
        The notebook.
    """
    budget = NOTEBOOK_OUTPUT_CHARACTERS
    for cell in notebook.get("cells", []):
        kept = []
        for output in cell.get("outputs", []) or []:
            if not isinstance(output, dict):
                continue
            texts = []
            for key in ("text",):
                if key in output:
                    texts.append(key)
            data = output.get("data") if isinstance(output.get("data"), dict) else {}
            blob = json.dumps(output)[:2_000_000]
            if any(line in blob for line in hidden_lines):
                kept.append({"output_type": "stream", "name": "stdout",
                             "text": "(output removed: it repeated the hidden tests)\n"})
                continue
            for key in texts:
                value = output[key]
                value = "".join(value) if isinstance(value, list) else str(value)
                limit = max(0, min(OUTPUT_CHARACTERS, budget))
                if len(value) > limit:
                    value = value[:limit] + f"\n… ({len(value) - limit:,} more characters " \
                                            "left out)\n"
                budget -= len(value)
                output[key] = value
            for mime in ("text/plain", "text/html"):
                if mime in data:
                    value = data[mime]
                    value = "".join(value) if isinstance(value, list) else str(value)
                    if len(value) > max(OUTPUT_CHARACTERS * 20, 0) or budget <= 0:
                        data[mime] = value[:OUTPUT_CHARACTERS] + "\n… (left out)\n"
                    budget -= min(len(value), OUTPUT_CHARACTERS * 20)
            if output.get("output_type") == "error":
                output["traceback"] = [str(line)[:OUTPUT_CHARACTERS]
                                       for line in (output.get("traceback") or [])[:40]]
                output["evalue"] = str(output.get("evalue", ""))[:OUTPUT_CHARACTERS]
            kept.append(output)
        if "outputs" in cell:
            cell["outputs"] = kept
    return notebook


def _bound_autograded(course: Path, assignment: str, students: list[str], source: dict) -> None:
    hidden = _hidden_lines(source)
    for student in students:
        for path in (course / "autograded" / student / assignment).glob("*.ipynb"):
            try:
                notebook = json.loads(path.read_text(encoding="utf-8"))
                mode = path.stat().st_mode & 0o777
                path.chmod(mode | 0o200)  # nbgrader leaves it read-only (444)
                path.write_text(json.dumps(bound_outputs(notebook, hidden), indent=1),
                                encoding="utf-8")
                path.chmod(mode)
            except (OSError, ValueError):
                continue


# --------------------------------------------------------------------------- flags


def _flags_path(course: Path) -> Path:
    return _grading_dir(course) / "flags.json"


def read_flags(course_dir) -> list[dict]:
    """Every integrity flag ever recorded in the course (``grading/flags.json``).

    Args:
        course_dir: the course folder.

    Returns:
        Dicts with ``assignment``, ``student``, ``exercise``, ``flag`` and ``first_seen``.
    """
    path = _flags_path(course_folder(course_dir))
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return []
    return [entry for entry in data.get("flags", []) if isinstance(entry, dict)]


def _record_flags(course: Path, new: list[dict]) -> list[dict]:
    flags = read_flags(course)
    known = {(f["assignment"], f["student"], f["exercise"], f["flag"]) for f in flags}
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for entry in new:
        key = (entry["assignment"], entry["student"], entry["exercise"], entry["flag"])
        if key not in known:
            flags.append({**entry, "first_seen": now})
            known.add(key)
    path = _flags_path(course)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"flags": flags}, indent=1), encoding="utf-8")
    temporary.replace(path)
    return flags


# --------------------------------------------------------------------------- the gradebook


def _manual_scores(course: Path, assignment: str) -> dict[tuple[str, str], tuple]:
    from nbgrader.api import Gradebook, MissingEntry

    scores = {}
    with Gradebook(_db_url(course)) as gradebook:
        try:
            record = gradebook.find_assignment(assignment)
        except MissingEntry:
            return {}
        for submission in record.submissions:
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    scores[(submission.student.id, grade.name)] = (grade.manual_score,
                                                                   grade.extra_credit)
    return scores


def _write_grades(course: Path, assignment: str, grade: StudentGrade,
                  snapshot: dict[tuple[str, str], tuple]) -> None:
    from nbgrader.api import Gradebook

    results = {cell.grade_id: cell for e in grade.exercises for cell in e.cells}
    exercises = {e.key: e for e in grade.exercises}
    with Gradebook(_db_url(course)) as gradebook:
        gradebook.update_or_create_student(grade.student)
        with gradebook.db.no_autoflush:
            submission = gradebook.update_or_create_submission(assignment, grade.student)
        notebook = next((n for n in submission.notebooks if n.name == grade.notebook), None)
        if notebook is None:
            return
        for row in notebook.grades:
            before = snapshot.get((grade.student, row.name), (None, None))
            if (row.manual_score, row.extra_credit) != before:
                grade.reverted.append(f"{row.name}: {row.manual_score} -> {before[0]}")
                row.manual_score, row.extra_credit = before
            cell = results.get(row.name)
            if cell is None:
                continue
            flagged = bool(grade.flags.get(exercise_of(row.name)))
            row.auto_score = float(cell.points) if cell.passed and not flagged else 0.0
            row.needs_manual_grade = False
            if row.manual_score is not None and row.auto_score < cell.points:
                grade.kept_manual.append(row.name)
        for comment in notebook.comments:
            exercise = exercises.get(exercise_of(comment.name))
            if exercise is not None:
                comment.auto_comment = _comment(exercise, grade.flags.get(exercise.key, []),
                                                any(exercise_of(g) == exercise.key
                                                    for g in grade.kept_manual))
        gradebook.db.commit()


def _comment(exercise: ExerciseResult, flags: list[str], manual: bool) -> str:
    from .feedback import shorten_paths

    points = f"{exercise.score:g} of {exercise.points:g}" if not flags \
        else f"0 of {exercise.points:g}"
    text = [f"Graded in a clean run of this answer cell on its own: {points} points."]
    if flags:
        text.append("Not counted: " + "; ".join(flags[:3]) + ".")
    elif exercise.cause:
        text.append(exercise.cause)
    text += [f"Note: {note}." for note in exercise.notes[:3]]
    if manual:
        text.append("The instructor set a manual score for this exercise, which is the one "
                    "that counts.")
    return shorten_paths("\n".join(text))


# --------------------------------------------------------------------------- autograde


def autograde(course_dir: str | os.PathLike, assignment: str,
              students: list[str] | None = None, *, feedback_run: bool = True,
              limits: Limits | None = None, cell_timeout: int = 180,
              feedback_timeout: float | None = None) -> AutogradeReport:
    """Grade ``assignment`` for every student who handed it in (see the module docstring).

    Args:
        course_dir: the course folder.
        assignment: the assignment id, or its chapter number (``"02"``).
        students: only these student ids (default: every submission).
        feedback_run: also let nbgrader re-run each notebook for the feedback.
        limits: the limits of each answer process (:class:`~.clean.Limits`).
        cell_timeout: seconds for one cell in nbgrader's feedback run.
        feedback_timeout: seconds for the whole feedback run (default: 10 minutes a student).

    Returns:
        An :class:`AutogradeReport`.

    Raises:
        ValueError: no course, an unknown assignment or student, or no submissions.
    """
    start = time.monotonic()
    course = course_folder(course_dir)
    assignment = resolve_assignment(course, assignment)
    notebooks = _submitted(course, assignment, students)
    if not notebooks:
        raise ValueError(f"nobody has handed in {assignment} yet (submitted/*/{assignment} is "
                         "empty); collect the submissions first")
    source_path = course / "source" / assignment / f"{assignment}.ipynb"
    source = json.loads(source_path.read_text(encoding="utf-8"))
    exercises = read_exercises(source)
    problems: dict[str, list[str]] = {student: [] for student in notebooks}
    snapshot = _manual_scores(course, assignment)
    failures: dict[str, str] = {}
    if feedback_run:
        staged = _stage(course, assignment, notebooks, source, problems)
        runnable = [s for s in notebooks if (staged / s / assignment).is_dir()]
        failures, _ = _nbgrader_feedback_run(
            course, assignment, staged, runnable, cell_timeout,
            feedback_timeout if feedback_timeout is not None else 600.0 * max(1, len(runnable)))
        _bound_autograded(course, assignment, runnable, source)
        shutil.rmtree(staged, ignore_errors=True)
        for student, cause in failures.items():
            if student in problems:
                problems[student].append(cause)
    grades: list[StudentGrade] = []
    new_flags: list[dict] = []
    try:
        graded, isolated = grade_submissions(source, notebooks, limits=limits)
    except RuntimeError as error:
        from .clean import CellResult

        isolated, graded = False, {}
        for student in notebooks:
            graded[student] = [ExerciseResult(
                e.key, e.title, [CellResult(c.grade_id, c.points) for c in e.grade_cells],
                cause=f"This exercise could not be graded ({error}); tell your instructor.")
                for e in exercises]
            problems[student].append(f"the clean grading failed: {error}")
    for student in notebooks:
        grade = StudentGrade(student, assignment, exercises=graded[student],
                             problems=problems[student])
        for result in grade.exercises:
            for flag in result.flags:
                new_flags.append({"assignment": assignment, "student": student,
                                  "exercise": result.key, "flag": flag})
        grades.append(grade)
    all_flags = _record_flags(course, new_flags)
    for grade in grades:
        for entry in all_flags:
            if entry["assignment"] == assignment and entry["student"] == grade.student:
                grade.flags.setdefault(entry["exercise"], []).append(entry["flag"])
        _write_grades(course, assignment, grade, snapshot)
    for grade in grades:  # a manual score written by someone's code is a flag of that student
        if grade.reverted:
            entry = {"assignment": assignment, "student": grade.student, "exercise": "gradebook",
                     "flag": "a manual score appeared in the gradebook during grading: "
                             + "; ".join(grade.reverted[:3])}
            _record_flags(course, [entry])
            grade.flags.setdefault("gradebook", []).append(entry["flag"])
    summary = _write_summary(course, assignment, grades)
    return AutogradeReport(assignment, grades, isolated, summary, time.monotonic() - start)


def _write_summary(course: Path, assignment: str, grades: list[StudentGrade]) -> Path:
    path = _grading_dir(course) / f"summary-{assignment}.csv"
    graded = {grade.student for grade in grades}
    kept = []  # the rows of students this run did not grade (STUDENT=… runs)
    if path.exists():
        with path.open(encoding="utf-8") as handle:
            kept = [row for row in csv.reader(handle)][1:]
        kept = [row for row in kept if row and row[0] not in graded]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "assignment", "exercise", "score", "max_score", "cause",
                         "flags"])
        writer.writerows(kept)
        for grade in grades:
            for exercise in grade.exercises:
                flags = grade.flags.get(exercise.key, [])
                score = 0.0 if flags else exercise.score
                writer.writerow([grade.student, assignment, exercise.key, f"{score:g}",
                                 f"{exercise.points:g}", exercise.cause, " | ".join(flags)])
            for problem in grade.problems:
                writer.writerow([grade.student, assignment, "", "", "", problem, ""])
    return path


def autograde_summary(report: AutogradeReport) -> list[str]:
    """Lines for the instructor: every cause of a lost point, every flag and problem.

    Args:
        report: from :func:`autograde`.

    Returns:
        Human-readable lines, one per student and exercise that needs a word.
    """
    lines = []
    for grade in report.students:
        total = sum(e.points for e in grade.exercises)
        lines.append(f"{grade.student}: {grade.score:g} / {total:g}")
        for exercise in grade.exercises:
            flags = grade.flags.get(exercise.key, [])
            if flags:
                lines.append(f"  {exercise.key}: FLAG, 0 points: {'; '.join(flags[:3])}")
            elif exercise.score < exercise.points:
                detail = "; ".join(c.detail for c in exercise.cells if c.detail)
                lines.append(f"  {exercise.key}: {exercise.score:g} / {exercise.points:g}: "
                             f"{_one_line(exercise.cause)}" + (f" [{detail}]" if detail else ""))
        for flag in grade.flags.get("gradebook", []):
            lines.append(f"  FLAG: {flag}")
        for problem in grade.problems:
            lines.append(f"  problem: {problem}")
        for grade_id in grade.kept_manual:
            lines.append(f"  {grade_id}: keeps your manual score")
    if not report.isolated:
        lines.append("note: this machine gives no private file view (user namespaces are off): "
                     "the answers ran with the audit hook and limits only; see the guide")
    return lines


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]

def released_assignments(course_dir: str | os.PathLike) -> list[str]:
    """The assignments with at least one submission, in gradebook order.

    Args:
        course_dir: the course folder.

    Returns:
        Assignment ids (a chapter generated but never handed in is left out).
    """
    from nbgrader.api import Gradebook

    course = _course(course_dir)
    if not (course / "gradebook.db").exists():
        return []
    with Gradebook(_db_url(course)) as gradebook:
        return [assignment.name for assignment in gradebook.assignments
                if assignment.submissions]


def exercise_scores(course_dir: str | os.PathLike,
                    assignments: list[str] | None = None) -> list[dict[str, object]]:
    """One row per student, assignment and exercise, read from the gradebook.

    Args:
        course_dir: the course folder.
        assignments: the assignment ids (default: :func:`released_assignments`).

    Returns:
        Dicts with ``assignment``, ``student``, ``exercise``, ``kind`` (``autograded`` or
        ``written``), ``score``, ``max_score``, ``needs_manual_grade`` and ``comment``.
    """
    from nbgrader.api import Gradebook

    course = _course(course_dir)
    assignments = released_assignments(course) if assignments is None else assignments
    rows = []
    with Gradebook(_db_url(course)) as gradebook:
        for assignment in assignments:
            for submission in gradebook.find_assignment(assignment).submissions:
                for notebook in submission.notebooks:
                    comments = {exercise_of(c.name): c.comment for c in notebook.comments}
                    merged: dict[tuple[str, str], dict[str, object]] = {}
                    for grade in sorted(notebook.grades, key=lambda g: g.name):
                        kind = "autograded" if grade.cell.cell_type == "code" else "written"
                        key = (exercise_of(grade.name), kind)
                        row = merged.setdefault(key, {
                            "assignment": assignment, "student": submission.student.id,
                            "exercise": key[0], "kind": kind, "score": 0.0,
                            "max_score": 0.0, "needs_manual_grade": False,
                            "comment": comments.get(key[0]) or ""})
                        row["score"] += float(grade.score or 0.0)
                        row["max_score"] += float(grade.max_score)
                        row["needs_manual_grade"] |= bool(grade.needs_manual_grade)
                    rows += list(merged.values())
    return sorted(rows, key=lambda r: (r["assignment"], r["student"], r["exercise"], r["kind"]))


def export_grades(course_dir: str | os.PathLike, assignments: list[str] | None = None,
                  to: str = "grades.csv", exercises_to: str = "exercises.csv") -> tuple[Path, Path]:
    """Write nbgrader's ``grades.csv`` and the book's ``exercises.csv`` into the course.

    Args:
        course_dir: the course folder.
        assignments: which assignments (default: :func:`released_assignments`).
        to: file name of nbgrader's export (one row per student and assignment).
        exercises_to: file name of the per-exercise export.

    Returns:
        The two paths.

    Raises:
        ValueError: no assignment has been handed in yet.
    """
    course = _course(course_dir)
    assignments = released_assignments(course) if assignments is None else list(assignments)
    if not assignments:
        raise ValueError("no assignment has been handed in yet: nothing to export")
    args = ["export", "--to", to]
    for assignment in assignments:
        args += ["--assignment", assignment]
    run_nbgrader(course, *args, log_name="export.log")
    rows = exercise_scores(course, assignments)
    path = course / exercises_to
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["assignment", "student", "exercise", "kind",
                                                    "score", "max_score",
                                                    "needs_manual_grade", "comment"])
        writer.writeheader()
        writer.writerows(rows)
    return course / to, path

