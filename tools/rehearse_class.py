#!/usr/bin/env python3
"""Time the autograding of a whole class: N synthetic students of one chapter, JOBS at once.

An instructor planning a course asks how long `make autograde` takes for a class. This tool
builds a throw-away course folder (outside the clone, in a temporary folder unless
``--course-dir`` names one), hands in ``--students`` notebooks of one chapter, derived from the
instructor notebook as the classroom rehearsal does (:mod:`attention_book.classroom.simulate`):
in turn a right answer to every exercise, every exercise but the largest, and the blank student
version. It then runs the same command as ``make autograde ASSIGNMENT=NN JOBS=N`` and reports
the wall-clock time of that command, the time per student, and whether every student got the
points their answers deserve (full, all but the largest exercise, zero).

Run it from the repository root, on a machine doing nothing else:

    .venv/bin/python tools/rehearse_class.py --chapter 02 --students 30 --jobs 2

Options: ``--keep`` keeps the course folder. The exit status is 1 when any student's points differ from
what their answers deserve.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from attention_book.classroom import build_assignments, exercise_scores
from attention_book.classroom.simulate import blank_answers, code_exercises, hand_in

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapter", default="02", help="chapter number, e.g. 02")
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--course-dir", help="an empty folder outside the clone")
    parser.add_argument("--keep", action="store_true")
    options = parser.parse_args(argv)
    scratch = None
    if options.course_dir:
        course = Path(options.course_dir).resolve()
    else:
        scratch = Path(tempfile.mkdtemp(prefix="rehearse-class-"))
        course = scratch / "course"
    try:
        chapter = next(p.stem for p in sorted((ROOT / "chapters").glob(f"{options.chapter}_*.ipynb")))
        build = build_assignments(ROOT, course, [options.chapter], new=True)
        if build.skipped:
            print(f"could not build {chapter}: {build.skipped}", file=sys.stderr)
            return 1
        instructor = nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4)
        release = json.loads((course / "release" / chapter / f"{chapter}.ipynb").read_text())
        exercises = code_exercises(instructor)
        right = {e.answer_id: e.solution for e in exercises}
        largest = max(exercises, key=lambda e: e.points)
        blank = blank_answers(instructor)
        total = sum(e.points for e in exercises)
        kinds = [("right", right, total),
                 ("partial", {**right, largest.answer_id: blank[largest.answer_id]},
                  total - largest.points),
                 ("blank", blank, 0.0)]
        deserved = {}
        for index in range(options.students):
            kind, answers, points = kinds[index % len(kinds)]
            student = f"s{index:03d}_{kind}"
            folder = course / "submitted" / student / chapter
            folder.mkdir(parents=True)
            (folder / f"{chapter}.ipynb").write_text(json.dumps(hand_in(release, answers)),
                                                     encoding="utf-8")
            deserved[student] = points
        command = [sys.executable, "-m", "attention_book.classroom", "autograde",
                   "--course-dir", str(course), options.chapter, "--jobs", str(options.jobs)]
        start = time.monotonic()
        run = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - start
        if run.returncode != 0:
            print(run.stdout[-4000:], run.stderr[-4000:], sep="\n", file=sys.stderr)
            return 1
        got_points = {}
        for row in exercise_scores(course, [chapter]):
            got_points[row["student"]] = got_points.get(row["student"], 0.0) + row["score"]
        wrong = {}
        for student, points in deserved.items():
            got = got_points.get(student, 0.0)
            if abs(got - points) > 1e-9:
                wrong[student] = (got, points)
        print(f"chapter {options.chapter}: {options.students} students, JOBS={options.jobs}, "
              f"{os.cpu_count()} cores, with nbgrader's feedback run")
        print(f"autograde took {seconds:.0f} s: {seconds / options.students:.1f} s per student")
        print("every student got the points their answers deserve" if not wrong
              else f"points differ (got, deserved): {wrong}")
        return 1 if wrong else 0
    finally:
        if scratch is not None and not options.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
