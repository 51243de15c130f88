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

The autograded notebooks, which the formgrader and the feedback pages show, are made inert
(:mod:`.sanitise`: text and images only, markdown escaped); printed output in them is capped
(a 50 MB print stays a few lines) and any output that repeats a hidden test is removed.
``grading/summary-<assignment>.csv`` lists every exercise of every student with its score,
cause, flags, the isolation of the run that graded it, the score of record in the gradebook
and every manual score.

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

from . import integrity, processes, sandbox
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
from .sanitise import inert_notebook

GRADING = "grading"  # the book's folder inside the course
KERNEL_NAME = "attention-book-grading"
OUTPUT_CHARACTERS = 10_000  # per output of an autograded notebook
NOTEBOOK_OUTPUT_CHARACTERS = 200_000
FEEDBACK_RUN = "feedback run"  # the "exercise" of a flag raised in nbgrader's feedback run
UNSAFE_OPTION = "--unsafe-no-isolation"
__all__ = ["AutogradeReport", "StudentGrade", "autograde", "autograde_summary", "bound_outputs",
           "course_folder", "exercise_scores", "export_grades", "known_assignments",
           "read_flags", "released_assignments", "resolve_assignment"]


def _db_url(course: Path) -> str:
    return f"sqlite:///{course / 'gradebook.db'}"


@dataclass(frozen=True)
class RecordedScore:
    """One grade cell of a student's notebook as the gradebook holds it.

    Args:
        grade_id: the cell's grade id.
        kind: ``"autograded"`` (a code cell) or ``"written"``.
        auto: the automatic score, or None.
        manual: the instructor's manual score, or None.
        extra: extra credit, or None.
        max_score: the cell's points.
    """

    grade_id: str
    kind: str
    auto: float | None
    manual: float | None
    extra: float | None
    max_score: float

    @property
    def score(self) -> float:
        """The score of record, as nbgrader counts it (``Grade.score``): the manual score
        where there is one, else the automatic one, plus extra credit."""
        if self.manual is None and self.auto is None:
            return 0.0
        return (self.manual if self.manual is not None else self.auto) + (self.extra or 0.0)


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
        recorded: every grade cell of the notebook as the gradebook holds it at the end of
            the run (what counts: a manual score wins), read by :func:`_write_summary`.
    """

    student: str
    notebook: str
    exercises: list[ExerciseResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    flags: dict[str, list[str]] = field(default_factory=dict)
    kept_manual: list[str] = field(default_factory=list)
    reverted: list[str] = field(default_factory=list)
    recorded: list[RecordedScore] = field(default_factory=list)

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
        problems: what concerns the run rather than one student (processes of nbgrader's
            feedback run that no kernel accounts for, which were ended).
    """

    assignment: str
    students: list[StudentGrade]
    isolated: bool
    summary: Path
    seconds: float
    layers: sandbox.Layers = field(default_factory=sandbox.Layers)
    jobs: int = 1
    problems: list[str] = field(default_factory=list)


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


def _kernel_spec(course: Path, run: Path, assignment: str, layers: sandbox.Layers,
                 scratch: Path, reports: Path) -> Path:
    """The sandboxed kernel of this run, in a folder to put on ``JUPYTER_PATH``.

    Its environment names the chapter's policy (:data:`.sandbox.POLICIES`), the layers the
    run promised (a kernel that cannot enter them stops before any cell runs), the folder of
    per-student reports (each kernel writes to its own student's, :func:`.sandbox._open_report`)
    and, as ``TMPDIR``, the run's scratch folder outside the course, which autograde removes.
    """
    folder = run / "jupyter"
    spec = folder / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
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
           "BOOK_SANDBOX_REPORTS": str(reports),
           "BOOK_SANDBOX_STUDENTS": str(course / "autograded"),
           "TMPDIR": str(scratch)}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []),
                 sandbox.__file__, "kernel", "-f", "{connection_file}"],
        "display_name": "Python 3 (sandboxed for grading)",
        "language": "python",
        "env": env,
    }, indent=1), encoding="utf-8")
    return folder


@dataclass
class _FeedbackRun:
    """What nbgrader's feedback run found, each part attributed by a fact, never by its log.

    Args:
        failures: students without a feedback notebook, with the cause.
        reports: the lines of each student's own report (refusals, stops, processes ended):
            written by that student's kernel and by the process that started it, and by
            nothing else.
        problems: what concerns the run, not one student (processes left behind that no
            kernel's report accounts for).
    """

    failures: dict[str, str] = field(default_factory=dict)
    reports: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _nbgrader_feedback_run(course: Path, assignment: str, run: Path,
                           groups: list[tuple[Path, list[str]]], layers: sandbox.Layers,
                           cell_timeout: int, timeout: float) -> _FeedbackRun:
    """nbgrader autograde of the staged notebooks in the sandboxed kernel, one nbgrader
    process per group, the groups at once.

    Each nbgrader runs under a supervisor (:mod:`.processes`) that waits for nbgrader's exit,
    ends it past ``timeout``, and ends every process left below it; nbgrader's output goes to
    a file, so no process a student's code leaves behind can hold the run up.
    """
    import tempfile

    found = _FeedbackRun()
    if not groups:
        return found
    reports = run / "reports"
    reports.mkdir(parents=True)
    for _, students in groups:
        for student in students:
            (reports / f"{student}.log").touch(mode=0o600)
    scratch = Path(tempfile.mkdtemp(prefix="abk-run-"))  # the kernels' scratch: not the course's disk
    try:
        jupyter = _kernel_spec(course, run, assignment, layers, scratch, reports)
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["JUPYTER_PATH"] = os.pathsep.join([str(jupyter), env.get("JUPYTER_PATH", "")]
                                              ).rstrip(os.pathsep)
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        env["OMP_NUM_THREADS"] = "1" if len(groups) > 1 else env.get("OMP_NUM_THREADS", "")
        if not env["OMP_NUM_THREADS"]:
            del env["OMP_NUM_THREADS"]
        supervisors = []
        for index, (staged, _) in enumerate(groups):
            command = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--force",
                       f"--CourseDirectory.submitted_directory={staged.relative_to(course)}",
                       f"--Execute.kernel_name={KERNEL_NAME}", f"--Execute.timeout={cell_timeout}",
                       "--Execute.interrupt_on_timeout=True",
                       "--Execute.raise_on_iopub_timeout=False"]
            log, result = run / f"nbgrader-{index}.log", run / f"nbgrader-{index}.json"
            supervisors.append((subprocess.Popen(  # a script: no import of the package, no cache
                [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []),
                 processes.__file__, "--timeout",
                 f"{timeout:g}", "--output", str(log), "--result", str(result), "--", *command],
                cwd=course, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL), log, result))
        logs = []
        for (_, students), (supervisor, log, result) in zip(groups, supervisors,
                                                                  strict=True):
            try:
                supervisor.wait(timeout=timeout + 120)
            except subprocess.TimeoutExpired:
                supervisor.terminate()  # it ends nbgrader and everything below it
                supervisor.wait()
            try:
                outcome = json.loads(result.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                outcome = {"status": None, "timed_out": True, "left_behind": 0}
            try:
                logs.append(log.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                logs.append("")
            explained = 0
            for student in students:
                lines = _report_lines(reports / f"{student}.log")
                found.reports[student] = lines
                explained += sum(_ended_count(line) for line in lines)
                made = sorted((course / "autograded" / student / assignment).glob("*.ipynb"))
                if made:
                    if _interrupted(made[0]):  # the student's own notebook: theirs alone
                        found.failures[student] = (
                            f"nbgrader's feedback run stopped a cell after its {cell_timeout} s "
                            "(an endless loop, or a very slow step); the cells after it ran")
                    continue
                stops = [line.removeprefix("stopped: ") for line in lines
                         if line.startswith("stopped: ")]
                if outcome.get("timed_out") and not stops:
                    found.failures[student] = (f"nbgrader's feedback run was stopped after "
                                               f"{timeout:g} s before it finished this notebook")
                else:  # a stop in the kernel's report is named on a line of its own
                    found.failures[student] = (
                        "nbgrader's feedback run made no notebook"
                        + ("" if stops else f" (nbgrader's log: logs/autograde-{assignment}.log)"))
            unexplained = int(outcome.get("left_behind") or 0) - explained
            if unexplained > 0:
                found.problems.append(
                    f"{unexplained} process(es) were still running when nbgrader's run of "
                    f"{', '.join(students)} ended; they were ended (no kernel's report names "
                    "them)")
        (course / "logs").mkdir(exist_ok=True)
        (course / "logs" / f"autograde-{assignment}.log").write_text("\n".join(logs),
                                                                     encoding="utf-8")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return found


def _interrupted(path: Path) -> bool:
    """Whether nbgrader's run interrupted a cell of this notebook (its time was up)."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return any(isinstance(output, dict) and output.get("ename") == "KeyboardInterrupt"
               for cell in notebook.get("cells", []) if isinstance(cell, dict)
               for output in cell.get("outputs", []) or [])


def _report_lines(path: Path) -> list[str]:
    """A student's report: its lines, cut to a reasonable size (a student writes it too)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(64 * 1024)
    except OSError:
        return []
    return [shorten_paths(line.decode(errors="replace"))[:300]
            for line in data.splitlines()[:200] if line.strip()]


def _ended_count(line: str) -> int:
    match = re.match(r"ended: (\d+) process", line)
    return int(match[1]) if match else 0


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
    """Make a notebook inert, cap printed output and drop any output that repeats a hidden
    test line.

    The notebook is first reduced to what cannot act when shown as HTML
    (:func:`.sanitise.inert_notebook`: text and images only, markdown escaped, no widget
    state), since the formgrader shows it on the instructor's origin.

    Args:
        notebook: a notebook as a dict (changed in place and returned).
        hidden_lines: the hidden tests' lines (:func:`_hidden_lines`).

    Returns:
        The notebook.
    """
    inert_notebook(notebook)
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
            for mime in ("text/plain",):  # the only text type an inert output keeps
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
            except Exception:  # noqa: BLE001 - whatever failed, the notebook must not stay
                # A notebook that could not be made inert is not left for the formgrader to
                # show: the student's feedback page is then the plain one (scores, comments).
                path.unlink(missing_ok=True)


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
    """Refuse the package after a run without kernel isolation, or one that changed it.

    Such a run let a student's code write wherever the instructor can: the book's package,
    its bytecode caches, the environment. Only a reinstallation makes them trustworthy again,
    and only the instructor knows it happened: the record stays until they delete it.
    """
    path = _package_record(course)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if record.get("protected", True):
        return
    changed = integrity.changed_files(record.get("fingerprint", {}), fingerprint)
    raise integrity.PackageChanged(
        "the last autograde of this course ran without kernel isolation, or changed the "
        "book's package (a student's code could have changed the package, its bytecode or the "
        "environment" + (": " + ", ".join(changed[:5]) + " differ" if changed else "")
        + "). Reinstall the environment from a clean copy (git checkout, then make "
        f"autograde's environment anew, or pip install --force-reinstall), then delete {path} "
        "to grade again")


# --------------------------------------------------------------------------- the gradebook


def _each_grade(course: Path, assignment: str):
    """``(student id, grade)`` for every grade cell of every notebook of ``assignment``."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(_db_url(course)) as gradebook:
        try:
            record = gradebook.find_assignment(assignment)
        except MissingEntry:
            return
        for submission in record.submissions:
            for notebook in submission.notebooks:
                for grade in sorted(notebook.grades, key=lambda g: g.name):
                    yield submission.student.id, grade


def _manual_scores(course: Path, assignment: str) -> dict[tuple[str, str], tuple]:
    return {(student, grade.name): (grade.manual_score, grade.extra_credit)
            for student, grade in _each_grade(course, assignment)}


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
            if row.manual_score is not None:
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
        feedback = _FeedbackRun()
        if feedback_run:  # after the clean grade: nothing it runs can reach a grade
            run = _grading_dir(course) / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            try:
                groups = _stage(run, assignment, notebooks, source, problems, jobs)
                feedback = _nbgrader_feedback_run(
                    course, assignment, run, groups, layers, cell_timeout,
                    feedback_timeout if feedback_timeout is not None
                    else 600.0 * max(1, -(-len(notebooks) // jobs)))
                _bound_autograded(course, assignment, [s for _, g in groups for s in g], source)
            finally:
                shutil.rmtree(run, ignore_errors=True)
                with contextlib.suppress(OSError):
                    run.parent.rmdir()  # grading/runs/, when no other run is there
            for student, cause in feedback.failures.items():
                if student in problems:
                    problems[student].append(cause)
        grades = _grades(assignment, notebooks, graded, problems, feedback.reports)
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
        if not layers.protected:  # a student's code could have planted bytecode anywhere
            integrity.remove_bytecode_caches()
        _write_atomically(_package_record(course), json.dumps(
            {"fingerprint": fingerprint, "protected": layers.protected and not changed}))
        if changed or source_changed:
            what = ", ".join(changed[:5]) if changed else str(source_path)
            raise integrity.PackageChanged(
                f"{what} changed during this run (after the clean grade, which used the "
                "files as they were at its start): reinstall the package or restore the "
                "instructor notebook before the next run")
    return AutogradeReport(assignment, grades, layers.protected, summary,
                           time.monotonic() - start, layers, jobs, feedback.problems)


def _grades(assignment: str, notebooks: dict[str, Path], graded: dict,
            problems: dict[str, list[str]], reports: dict[str, list[str]]) -> list[StudentGrade]:
    grades = []
    for student in notebooks:
        grade = StudentGrade(student, assignment, exercises=graded[student],
                             problems=problems[student])
        for result in grade.exercises:
            for flag in result.flags:
                grade.flags.setdefault(result.key, []).append(flag)
        for line in reports.get(student, []):  # this student's own report, and only theirs
            kind, _, text = line.partition(": ")
            if kind in ("stopped", "ended"):
                grade.problems.append(f"nbgrader's feedback run: {line}")
            elif kind == "refused":
                grade.flags.setdefault(FEEDBACK_RUN, []).append(
                    "in nbgrader's feedback run (no points at stake), the sandbox refused "
                    + text)
        grade.problems = list(dict.fromkeys(grade.problems))
        grades.append(grade)
    return grades


def _recorded_scores(course: Path, assignment: str) -> dict[str, list[RecordedScore]]:
    """Every grade cell of every student's notebook of ``assignment``, from the gradebook."""
    recorded: dict[str, list[RecordedScore]] = {}
    for student, grade in _each_grade(course, assignment):
        recorded.setdefault(student, []).append(RecordedScore(
            grade.name, "autograded" if grade.cell.cell_type == "code" else "written",
            grade.auto_score, grade.manual_score, grade.extra_credit,
            float(grade.max_score or 0.0)))
    return recorded


def _manual_text(scores: list[RecordedScore]) -> str:
    return " | ".join(f"{r.grade_id}: {r.manual:g} of {r.max_score:g}"
                      + (f" + {r.extra:g} extra" if r.extra else "")
                      for r in scores if r.manual is not None)


def _write_summary(course: Path, assignment: str, grades: list[StudentGrade],
                   layers: sandbox.Layers) -> Path:
    """``grading/summary-<assignment>.csv``: every exercise of every student graded here
    (earlier rows of the others kept), with the clean grade (``score``), the score of record
    in the gradebook (``score_of_record``: a manual score wins; written answers too) and
    every manual score; fills each grade's :attr:`StudentGrade.recorded`."""
    path = _grading_dir(course) / f"summary-{assignment}.csv"
    graded = {grade.student for grade in grades}
    header = ["student", "assignment", "exercise", "score", "max_score", "cause", "flags",
              "isolation", "score_of_record", "manual_scores"]
    recorded = _recorded_scores(course, assignment)
    kept = []  # the rows of students this run did not grade (STUDENT=… runs)
    if path.exists():
        with path.open(encoding="utf-8") as handle:
            kept = [row for row in csv.reader(handle)][1:]
        kept = [row + [""] * (len(header) - len(row)) for row in kept
                if row and row[0] not in graded]
    isolation = layers.describe()
    rows = []
    for grade in grades:
        grade.recorded = recorded.get(grade.student, [])
        cells: dict[str, list[RecordedScore]] = {}
        for cell in grade.recorded:
            cells.setdefault(exercise_of(cell.grade_id), []).append(cell)
        for exercise in grade.exercises:
            flags = grade.flags.get(exercise.key, [])
            score = 0.0 if flags else exercise.score
            mine = cells.pop(exercise.key, [])
            rows.append([grade.student, assignment, exercise.key, f"{score:g}",
                         f"{exercise.points:g}", exercise.cause, " | ".join(flags), isolation,
                         f"{sum(r.score for r in mine):g}" if mine else "", _manual_text(mine)])
        for key, mine in sorted(cells.items()):  # written answers, scored in the formgrader
            rows.append([grade.student, assignment, key, "", f"{sum(r.max_score for r in mine):g}",
                         "written answer: scored by hand" if any(r.kind == "written" for r in mine)
                         else "", "", isolation, f"{sum(r.score for r in mine):g}",
                         _manual_text(mine)])
        for problem in grade.problems:
            rows.append([grade.student, assignment, "", "", "", problem, "", isolation, "", ""])
        for key in (FEEDBACK_RUN, "gradebook"):
            if grade.flags.get(key):
                rows.append([grade.student, assignment, key, "", "", "",
                             " | ".join(grade.flags[key]), isolation, "", ""])
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(kept)
    writer.writerows(rows)
    _write_atomically(path, buffer.getvalue())
    return path


def autograde_summary(report: AutogradeReport) -> list[str]:
    """Lines for the instructor: each student's autograded points and score of record, every
    manual score, every cause of a lost point, every flag and problem.

    Args:
        report: from :func:`autograde`.

    Returns:
        Human-readable lines, one per student and exercise that needs a word.
    """
    lines = []
    differs = False
    for grade in report.students:
        total = sum(e.points for e in grade.exercises)
        line = f"{grade.student}: {grade.score:g} / {total:g}"
        if grade.recorded:  # what the gradebook counts, and export writes
            of_record = sum(r.score for r in grade.recorded)
            most = sum(r.max_score for r in grade.recorded)
            line += f" autograded; score of record {of_record:g} / {most:g}"
            differs |= (of_record, most) != (grade.score, total) or any(
                r.manual is not None for r in grade.recorded)
        lines.append(line)
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
        manual = [r for r in grade.recorded if r.manual is not None]
        for cell in manual:  # every manual score of an autograded cell, whatever the run gave
            if cell.kind == "autograded":
                lines.append(f"  {cell.grade_id}: keeps your manual score {cell.manual:g} of "
                             f"{cell.max_score:g} (autograded: {cell.auto or 0:g})"
                             + (f", + {cell.extra:g} extra credit" if cell.extra else ""))
        written = [r for r in manual if r.kind != "autograded"]
        if written:
            lines.append(f"  written answers, scored by hand: {_manual_text(written)}")
        for grade_id in grade.kept_manual:  # a gradebook that could not be read back
            if grade_id not in {cell.grade_id for cell in manual}:
                lines.append(f"  {grade_id}: keeps your manual score")
    if differs:
        lines.append("score of record: what the gradebook counts and `export` writes (a manual "
                     "score wins over the autograded one; written answers included); every "
                     "manual score is listed under its student")
    lines += [f"run: {problem}" for problem in report.problems]
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

