"""Autograde in clean processes, keep every flag, export only what was handed in.

:func:`autograde` grades one assignment for every student who handed it in (or the ones
named), in steps that never stop for one student's sake:

1. **Before any student code runs**: the run takes the course's lock
   (``grading/autograde.lock``: a second run on the course waits), checks which sandbox
   layers the machine gives (:func:`.sandbox.available_layers`; without a kernel-enforced
   one it refuses unless ``unsafe=True``), takes the package's fingerprint
   (:mod:`.integrity`), and reads the instructor notebook with its hidden tests.
2. **The grade.** Every exercise is graded in clean processes (:mod:`.clean`): one grader
   process per student, ``jobs`` students at a time, each exercise's answer cell alone in
   a sandboxed process, called from the trusted hidden tests.
3. **nbgrader's own run, for the feedback only**, after the grade. Each submission is
   copied, notebook only, into a staging folder of this run with its nbgrader metadata
   restored from the instructor's version, and ``nbgrader autograde`` re-runs it in the
   sandboxed kernel (:mod:`.sandbox`, the same layers; ``jobs`` nbgrader processes at
   once). A student whose run fails (a dead kernel, a hang) is named, with the cause; what
   the sandbox refused there is a flag of the student that costs no points.
4. **Integrity.** Integrity findings (a forbidden call, the checkers imported, something
   the sandbox refused) are flags: the exercise scores 0, the flag is written to
   ``grading/flags.json`` (atomically; no flag recorded before the run is ever dropped) and
   applied again by every later run. A manual score that appeared in the gradebook during
   the run is put back and reported. The package's fingerprint is checked again at the
   end: a change stops the run with the files named, and the next run refuses a package
   that changed after a run without kernel isolation.

Printed output in the autograded notebooks is capped (a 50 MB print stays a few lines)
and any output that repeats a hidden test is removed. ``grading/summary-<assignment>.csv``
lists every exercise of every student with its score, cause, flags and the isolation of the
run that graded it.

:func:`export_grades` writes nbgrader's ``grades.csv`` for the assignments that students
have handed in and ``exercises.csv`` with one row per student and exercise (with the
isolation, ``UNPROTECTED: …`` for a run without it).

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows how to use it.
"""

from __future__ import annotations

import contextlib
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

from . import integrity, sandbox
from .clean import (
    CellResult,
    ExerciseResult,
    Limits,
    default_jobs,
    grade_submissions,
    read_exercises,
)
from .course import course_folder, known_assignments, resolve_assignment, run_nbgrader
from .feedback import shorten_paths
from .format import BEGIN_HIDDEN, END_HIDDEN, chapter_number, exercise_of

GRADING = "grading"  # the book's folder inside the course
KERNEL_NAME = "attention-book-grading"
OUTPUT_CHARACTERS = 10_000  # per output of an autograded notebook
NOTEBOOK_OUTPUT_CHARACTERS = 200_000
_FAILED_BLOCK = re.compile(r"There was an error processing assignment: (?P<path>[^\n]+)")
_SANDBOX_LINE = re.compile(r"^\[sandbox\] (?P<kind>refused|stopped): (?P<text>.*)$", re.M)
FEEDBACK_RUN = "feedback run"  # the "exercise" of a flag raised in nbgrader's feedback run
UNSAFE_OPTION = "--unsafe-no-isolation"
__all__ = ["AutogradeReport", "StudentGrade", "autograde", "autograde_summary", "bound_outputs",
           "course_folder", "exercise_scores", "export_grades", "known_assignments",
           "read_flags", "released_assignments", "resolve_assignment"]


def _db_url(course: Path) -> str:
    return f"sqlite:///{course / 'gradebook.db'}"


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
        isolated: a kernel-enforced layer fenced the files of every process that ran
            student code (false only for a run with ``unsafe=True``).
        summary: the CSV with every exercise of every student.
        seconds: wall-clock time of the whole run.
        layers: the sandbox layers of the run.
        jobs: students graded at once.
    """

    assignment: str
    students: list[StudentGrade]
    isolated: bool
    summary: Path
    seconds: float
    layers: sandbox.Layers = field(default_factory=sandbox.Layers)
    jobs: int = 1


# --------------------------------------------------------------------------- the course


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


def _stage(run: Path, assignment: str, notebooks: dict[str, Path], source: dict,
           problems: dict[str, list[str]], groups: int) -> list[tuple[Path, list[str]]]:
    """Copy each readable submission into one of ``groups`` staging folders of this run.

    Returns:
        ``(staging folder, students)`` per group that has any.
    """
    staged: list[tuple[Path, list[str]]] = [(run / f"staged-{k}", []) for k in range(groups)]
    readable = 0
    for student, path in notebooks.items():
        try:
            submission = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(submission, dict):
                raise ValueError("not a notebook")
        except (OSError, ValueError, UnicodeDecodeError) as error:
            problems[student].append(f"the notebook could not be read ({type(error).__name__}),"
                                     " so there is no feedback run")
            continue
        folder, members = staged[readable % groups]
        readable += 1
        target = folder / student / assignment
        target.mkdir(parents=True)
        (target / path.name).write_text(json.dumps(_restored(submission, source)),
                                        encoding="utf-8")
        for name in ("timestamp.txt", "submission_secret.txt"):  # nbgrader's own files
            if (path.parent / name).is_file():
                shutil.copyfile(path.parent / name, target / name)
        members.append(student)
    return [(folder, members) for folder, members in staged if members]


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


def _kernel_spec(run: Path, assignment: str, layers: sandbox.Layers) -> Path:
    """The sandboxed kernel of this run, in a folder to put on ``JUPYTER_PATH``.

    Its environment names the chapter's policy (:data:`.sandbox.POLICIES`) and the layers
    the run promised: a kernel that cannot enter them stops before any cell runs.
    """
    folder = run / "jupyter"
    spec = folder / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    temporary = run / "kernel-tmp"
    temporary.mkdir(mode=0o700, exist_ok=True)
    try:
        chapter = chapter_number(f"{assignment}.ipynb")
    except (ValueError, TypeError):
        chapter = None
    policy = sandbox.policy_for(chapter)
    env = {"PYDEVD_DISABLE_FILE_VALIDATION": "1",
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "BOOK_SANDBOX_POLICY": json.dumps({"processes": policy.processes,
                                              "loopback_tcp": policy.loopback_tcp}),
           "BOOK_SANDBOX_REQUIRE": layers.to_json(),
           "BOOK_SANDBOX_JAIL": "1" if layers.namespaces else "0",
           # The kernel's private folders (its jail's root, or its scratch without the jail)
           # go inside this run, which autograde removes: none is left behind in /tmp.
           "TMPDIR": str(temporary)}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []),
                 sandbox.__file__, "kernel", "-f", "{connection_file}"],
        "display_name": "Python 3 (sandboxed for grading)",
        "language": "python",
        "env": env,
    }, indent=1), encoding="utf-8")
    return folder


def _nbgrader_feedback_run(course: Path, assignment: str, run: Path,
                           groups: list[tuple[Path, list[str]]], layers: sandbox.Layers,
                           cell_timeout: int, timeout: float
                           ) -> tuple[dict[str, str], dict[str, list[str]]]:
    """nbgrader autograde of the staged notebooks in the sandboxed kernel, one nbgrader
    process per group, the groups at once.

    Returns:
        ``(failures, refusals)``: the students whose run failed, with the cause, and what
        the sandbox refused in each student's kernel.
    """
    if not groups:
        return {}, {}
    jupyter = _kernel_spec(run, assignment, layers)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["JUPYTER_PATH"] = os.pathsep.join([str(jupyter), env.get("JUPYTER_PATH", "")]).rstrip(
        os.pathsep)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    env["OMP_NUM_THREADS"] = "1" if len(groups) > 1 else env.get("OMP_NUM_THREADS", "")
    if not env["OMP_NUM_THREADS"]:
        del env["OMP_NUM_THREADS"]
    processes = []
    for staged, _ in groups:
        command = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--force",
                   f"--CourseDirectory.submitted_directory={staged.relative_to(course)}",
                   f"--Execute.kernel_name={KERNEL_NAME}", f"--Execute.timeout={cell_timeout}",
                   "--Execute.interrupt_on_timeout=True",
                   "--Execute.raise_on_iopub_timeout=False"]
        processes.append(subprocess.Popen(command, cwd=course, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    logs, failures, refusals = [], {}, {}
    from .course import nbgrader_errors

    for (staged, students), process in zip(groups, processes, strict=True):
        try:
            log, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            log, _ = process.communicate()
            for student in students:
                if not (course / "autograded" / student / assignment).exists():
                    failures[student] = (f"nbgrader's feedback run was stopped after "
                                         f"{timeout:g} s before it reached this notebook")
        logs.append(log or "")
        for student, section in _sections(log or "", staged).items():
            for match in _SANDBOX_LINE.finditer(section):
                refusals.setdefault(student, []).append(
                    f"{match['kind']}: {shorten_paths(match['text'])[:200]}")
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
                causes = nbgrader_errors(log or "")
                failures[student] = ("nbgrader's feedback run made no notebook"
                                     + (f": {causes[-1][:300]}" if causes else "")
                                     + f" (whole log: logs/autograde-{assignment}.log)")
    (course / "logs").mkdir(exist_ok=True)
    (course / "logs" / f"autograde-{assignment}.log").write_text("\n".join(logs),
                                                                 encoding="utf-8")
    return failures, refusals


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


def _record_flags(course: Path, new: list[dict], known: list[dict] | None = None) -> list[dict]:
    """Add ``new`` flags to ``grading/flags.json``, atomically, and return them all.

    Args:
        course: the course folder.
        new: the flags of this run.
        known: the flags read before any student code of the run executed; none of them is
            ever dropped, whatever the file says now.
    """
    flags = read_flags(course)
    seen = {(f["assignment"], f["student"], f["exercise"], f["flag"]) for f in flags}
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for entry in [*(known or []), *new]:
        key = (entry["assignment"], entry["student"], entry["exercise"], entry["flag"])
        if key not in seen:
            flags.append({**entry, "first_seen": entry.get("first_seen", now)})
            seen.add(key)
    _write_atomically(_flags_path(course), json.dumps({"flags": flags}, indent=1))
    return flags


def _write_atomically(path: Path, text: str) -> None:
    """Write a whole file or nothing: a temporary file beside it, synced, then renamed."""
    import tempfile

    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _course_lock(course: Path):
    """Hold ``grading/autograde.lock``: runs on one course wait for each other."""
    import fcntl

    path = _grading_dir(course) / "autograde.lock"
    with path.open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            print(f"waiting for the other autograde run on this course ({handle.read().strip()})"
                  " to finish", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _package_record(course: Path) -> Path:
    return _grading_dir(course) / "package.json"


def _check_package(course: Path, fingerprint: dict[str, str]) -> None:
    """Refuse a package that changed since a run that ran without kernel isolation."""
    path = _package_record(course)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    changed = integrity.changed_files(record.get("fingerprint", {}), fingerprint)
    if changed and not record.get("protected", False):
        raise integrity.PackageChanged(
            "the book's package changed since the last autograde of this course, which ran "
            "without kernel isolation (so a student's code could have changed it): "
            + ", ".join(changed[:5]) + ". Reinstall the package from a clean copy (git "
            "checkout, or pip install --force-reinstall), then delete "
            f"{path} to accept it")


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
                  snapshot: dict[tuple[str, str], tuple], protected: bool = True) -> None:
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
                                                    for g in grade.kept_manual), protected)
        gradebook.db.commit()


def _comment(exercise: ExerciseResult, flags: list[str], manual: bool,
             protected: bool = True) -> str:
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
    if not protected:
        text.append("UNPROTECTED: this run had no kernel-enforced isolation.")
    return shorten_paths("\n".join(text))


# --------------------------------------------------------------------------- autograde


def autograde(course_dir: str | os.PathLike, assignment: str,
              students: list[str] | None = None, *, feedback_run: bool = True,
              limits: Limits | None = None, cell_timeout: int = 180,
              feedback_timeout: float | None = None, jobs: int | None = None,
              unsafe: bool = False, use_jail: bool = True) -> AutogradeReport:
    """Grade ``assignment`` for every student who handed it in (see the module docstring).

    Args:
        course_dir: the course folder.
        assignment: the assignment id, or its chapter number (``"02"``).
        students: only these student ids (default: every submission).
        feedback_run: also let nbgrader re-run each notebook for the feedback.
        limits: the limits of each answer process (:class:`~.clean.Limits`).
        cell_timeout: seconds for one cell in nbgrader's feedback run.
        feedback_timeout: seconds for the whole feedback run (default: 10 minutes a student).
        jobs: students graded at once (default: the machine's cores).
        unsafe: grade even where no kernel-enforced layer fences files (every grade of the
            run is then marked unprotected).
        use_jail: use the private file view where the machine allows it.

    Returns:
        An :class:`AutogradeReport`.

    Raises:
        ValueError: no course, an unknown assignment or student, no submissions, or no
            kernel-enforced isolation here without ``unsafe``.
        integrity.PackageChanged: the package is not the one the run started with.
    """
    start = time.monotonic()
    course = course_folder(course_dir)
    assignment = resolve_assignment(course, assignment)
    notebooks = _submitted(course, assignment, students)
    if not notebooks:
        raise ValueError(f"nobody has handed in {assignment} yet (submitted/*/{assignment} is "
                         "empty); collect the submissions first")
    jobs = max(1, int(jobs or default_jobs()))
    layers = sandbox.available_layers(use_jail=use_jail)
    if not layers.protected and not unsafe:
        raise ValueError(
            "this machine gives graded code no kernel-enforced isolation (no user namespaces, "
            "no Landlock): a student's native code could read other students' work and "
            f"rewrite the grader. Grade on a machine that has them, or pass {UNSAFE_OPTION} "
            "(make autograde UNSAFE=1) to grade anyway: every grade of the run is then marked "
            "UNPROTECTED")
    with _course_lock(course):
        fingerprint = integrity.fingerprint()  # before any student code of this run
        _check_package(course, fingerprint)
        source_path = course / "source" / assignment / f"{assignment}.ipynb"
        source_text = source_path.read_text(encoding="utf-8")
        source = json.loads(source_text)  # the hidden tests, loaded before any student code
        exercises = read_exercises(source)
        problems: dict[str, list[str]] = {student: [] for student in notebooks}
        snapshot = _manual_scores(course, assignment)
        known_flags = read_flags(course)
        try:
            graded, _ = grade_submissions(source, notebooks, limits=limits, jobs=jobs,
                                          layers=layers, fingerprint=fingerprint)
        except RuntimeError as error:
            graded = {}
            for student in notebooks:
                graded[student] = [ExerciseResult(
                    e.key, e.title, [CellResult(c.grade_id, c.points) for c in e.grade_cells],
                    cause=f"This exercise could not be graded ({error}); tell your "
                          "instructor.") for e in exercises]
                problems[student].append(f"the clean grading failed: {error}")
        refusals: dict[str, list[str]] = {}
        if feedback_run:  # after the clean grade: nothing it runs can reach a grade
            run = _grading_dir(course) / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            try:
                groups = _stage(run, assignment, notebooks, source, problems, jobs)
                failures, refusals = _nbgrader_feedback_run(
                    course, assignment, run, groups, layers, cell_timeout,
                    feedback_timeout if feedback_timeout is not None
                    else 600.0 * max(1, -(-len(notebooks) // jobs)))
                _bound_autograded(course, assignment, [s for _, g in groups for s in g], source)
            finally:
                shutil.rmtree(run, ignore_errors=True)
                with contextlib.suppress(OSError):
                    run.parent.rmdir()  # grading/runs/, when no other run is there
            for student, cause in failures.items():
                if student in problems:
                    problems[student].append(cause)
        grades = _grades(assignment, notebooks, graded, problems, refusals)
        new_flags = [{"assignment": assignment, "student": grade.student, "exercise": key,
                      "flag": flag} for grade in grades for key, flags in grade.flags.items()
                     for flag in flags]
        for grade in grades:
            grade.flags = {}
        all_flags = _record_flags(course, new_flags, known_flags)
        for grade in grades:
            for entry in all_flags:
                if entry["assignment"] == assignment and entry["student"] == grade.student:
                    grade.flags.setdefault(entry["exercise"], []).append(entry["flag"])
            _write_grades(course, assignment, grade, snapshot, layers.protected)
        for grade in grades:  # a manual score written by someone's code is a flag of that student
            if grade.reverted:
                entry = {"assignment": assignment, "student": grade.student,
                         "exercise": "gradebook",
                         "flag": "a manual score appeared in the gradebook during grading: "
                                 + "; ".join(grade.reverted[:3])}
                _record_flags(course, [entry], known_flags)
                grade.flags.setdefault("gradebook", []).append(entry["flag"])
        summary = _write_summary(course, assignment, grades, layers)
        after = integrity.fingerprint()
        changed = integrity.changed_files(fingerprint, after)
        source_changed = source_path.read_text(encoding="utf-8") != source_text
        _write_atomically(_package_record(course), json.dumps(
            {"fingerprint": fingerprint, "protected": layers.protected and not changed}))
        if changed or source_changed:
            what = ", ".join(changed[:5]) if changed else str(source_path)
            raise integrity.PackageChanged(
                f"{what} changed during this run (after the clean grade, which used the "
                "files as they were at its start): reinstall the package or restore the "
                "instructor notebook before the next run")
    return AutogradeReport(assignment, grades, layers.protected, summary,
                           time.monotonic() - start, layers, jobs)


def _grades(assignment: str, notebooks: dict[str, Path], graded: dict,
            problems: dict[str, list[str]], refusals: dict[str, list[str]]) -> list[StudentGrade]:
    grades = []
    for student in notebooks:
        grade = StudentGrade(student, assignment, exercises=graded[student],
                             problems=problems[student])
        for result in grade.exercises:
            for flag in result.flags:
                grade.flags.setdefault(result.key, []).append(flag)
        stops = [text for text in refusals.get(student, []) if text.startswith("stopped")]
        grade.problems += [f"nbgrader's feedback run: the sandboxed kernel {text}"
                           for text in stops]
        for text in refusals.get(student, []):
            if text.startswith("refused"):
                grade.flags.setdefault(FEEDBACK_RUN, []).append(
                    "in nbgrader's feedback run (no points at stake), the sandbox "
                    + text.replace("refused: ", "refused ", 1))
        grades.append(grade)
    return grades


def _write_summary(course: Path, assignment: str, grades: list[StudentGrade],
                   layers: sandbox.Layers) -> Path:
    path = _grading_dir(course) / f"summary-{assignment}.csv"
    graded = {grade.student for grade in grades}
    header = ["student", "assignment", "exercise", "score", "max_score", "cause", "flags",
              "isolation"]
    kept = []  # the rows of students this run did not grade (STUDENT=… runs)
    if path.exists():
        with path.open(encoding="utf-8") as handle:
            kept = [row for row in csv.reader(handle)][1:]
        kept = [row + [""] * (len(header) - len(row)) for row in kept
                if row and row[0] not in graded]
    isolation = layers.describe()
    rows = []
    for grade in grades:
        for exercise in grade.exercises:
            flags = grade.flags.get(exercise.key, [])
            score = 0.0 if flags else exercise.score
            rows.append([grade.student, assignment, exercise.key, f"{score:g}",
                         f"{exercise.points:g}", exercise.cause, " | ".join(flags), isolation])
        for problem in grade.problems:
            rows.append([grade.student, assignment, "", "", "", problem, "", isolation])
        for key in (FEEDBACK_RUN, "gradebook"):
            if grade.flags.get(key):
                rows.append([grade.student, assignment, key, "", "", "",
                             " | ".join(grade.flags[key]), isolation])
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(kept)
    writer.writerows(rows)
    _write_atomically(path, buffer.getvalue())
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
        for flag in grade.flags.get("gradebook", []) + grade.flags.get(FEEDBACK_RUN, []):
            lines.append(f"  FLAG: {flag}")
        for problem in grade.problems:
            lines.append(f"  problem: {problem}")
        for grade_id in grade.kept_manual:
            lines.append(f"  {grade_id}: keeps your manual score")
    lines.append(f"isolation of this run ({report.jobs} at a time): {report.layers.describe()}")
    if not report.isolated:
        lines.append("WARNING: every grade of this run is UNPROTECTED (marked so in the summary "
                     "and the export): a student's native code could have read other students' "
                     "work or changed files you own; see the guide")
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

    course = course_folder(course_dir)
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
        ``written``), ``score``, ``max_score``, ``needs_manual_grade``, ``comment`` and
        ``isolation`` (the layers of the run that graded it, ``UNPROTECTED: …`` without any;
        empty for written answers).
    """
    from nbgrader.api import Gradebook

    course = course_folder(course_dir)
    assignments = released_assignments(course) if assignments is None else assignments
    isolation = _isolation_of(course, assignments)
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
                            "comment": comments.get(key[0]) or "",
                            "isolation": isolation.get((assignment, submission.student.id), "")
                            if kind == "autograded" else ""})
                        row["score"] += float(grade.score or 0.0)
                        row["max_score"] += float(grade.max_score)
                        row["needs_manual_grade"] |= bool(grade.needs_manual_grade)
                    rows += list(merged.values())
    return sorted(rows, key=lambda r: (r["assignment"], r["student"], r["exercise"], r["kind"]))


def _isolation_of(course: Path, assignments: list[str]) -> dict[tuple[str, str], str]:
    """The isolation each student's last autograde had, from the summaries."""
    found = {}
    for assignment in assignments:
        path = _grading_dir(course) / f"summary-{assignment}.csv"
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row.get("isolation"):
                    found[(assignment, row["student"])] = row["isolation"]
    return found


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
    course = course_folder(course_dir)
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
                                                    "needs_manual_grade", "comment",
                                                    "isolation"])
        writer.writeheader()
        writer.writerows(rows)
    return course / to, path

