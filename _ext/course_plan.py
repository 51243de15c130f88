"""Each chapter's time and what it needs first, from one file: ``course_plan.yml``.

"Plan your path", the instructor guide and every chapter page show the same times and the same
prerequisites, so they come from one place:

* the directive ``course-plan-table`` writes the plan's table (each chapter, linked by its own
  title, with its study and exercise minutes, "60 + 50 min", and what it needs first);
* MyST substitutions give the totals and routes (``{{ book_total }}``, ``{{ route_core }}``,
  ``{{ route_core_days }}``, ...), the course length (``{{ course_weeks }}``,
  ``{{ session_minutes }}``) and each chapter's times (``{{ study_07 }}``,
  ``{{ exercises_07 }}``);
* each chapter page gets a line with its time after its "You should already know" paragraph
  (after its first paragraph where there is none).

The build warns (an error under ``-W``) when a chapter in ``_toc.yml`` has no row, a row names
a chapter the book does not have, or a route takes a chapter before one it needs.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

PLAN_FILE = "course_plan.yml"
PLAN_DOC = "plan_your_path"
_CHAPTER_DOC = re.compile(r"^chapters/(\d\d)_")
_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
          "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = {20: "twenty", 30: "thirty", 40: "forty"}


def words(number: int) -> str:
    """An English number word, up to 49: 21 -> "twenty-one"."""
    if number < 20:
        return _WORDS[number]
    tens, ones = divmod(number, 10)
    return _TENS[tens * 10] + (f"-{_WORDS[ones]}" if ones else "")


def minutes(total: int, hours: bool = True) -> str:
    """45 -> "45 min", 90 -> "1 h 30 min" ("90 min" with ``hours=False``), 480 -> "8 h"."""
    hours, rest = divmod(total, 60) if hours else (0, total)
    if not hours:
        return f"{rest} min"
    return f"{hours} h" + (f" {rest} min" if rest else "")


def chapter_list(numbers: list[int]) -> str:
    """[1, 2, 3, 5, 7, 8] -> "1–3, 5, 7, 8": runs of three or more become ranges."""
    numbers = sorted(numbers)
    parts, start = [], 0
    while start < len(numbers):
        end = start
        while end + 1 < len(numbers) and numbers[end + 1] == numbers[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{numbers[start]}–{numbers[end]}")
        else:
            parts += [str(n) for n in numbers[start:end + 1]]
        start = end + 1
    return ", ".join(parts)


def and_list(items: list) -> str:
    items = [str(item) for item in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def load_plan(srcdir: str | Path) -> dict:
    path = Path(srcdir) / PLAN_FILE
    plan = yaml.safe_load(path.read_text(encoding="utf-8"))
    plan["chapters"] = {int(number): row for number, row in plan["chapters"].items()}
    return plan


def _route_text(plan: dict, name: str) -> tuple[str, int, int]:
    chapters = plan["routes"][name]["chapters"]
    study = sum(plan["chapters"][n]["study"] for n in chapters)
    exercises = sum(plan["chapters"][n]["exercises"] for n in chapters)
    text = (f"Chapters {' → '.join(map(str, chapters))}: {minutes(study + exercises)} "
            f"({minutes(study)} of study, {minutes(exercises)} of exercises)")
    return text, study, exercises


def substitutions(plan: dict) -> dict[str, str]:
    """Every value the pages take from the plan, by its substitution name."""
    rows = plan["chapters"]
    numbers = sorted(rows)
    study = sum(row["study"] for row in rows.values())
    exercises = sum(row["exercises"] for row in rows.values())
    values = {
        "book_chapters": f"{words(len(numbers))} chapters, {numbers[0]} to {numbers[-1]}",
        "book_total": (f"about {round((study + exercises) / 60)} hours: {round(study / 60)} of "
                       f"study and {round(exercises / 60)} of exercises"),
        "course_weeks": words(len(numbers)),
        "session_minutes": str(plan["session_minutes"]),
    }
    for number, row in rows.items():
        values[f"study_{number:02d}"] = minutes(row["study"], hours=False)
        values[f"exercises_{number:02d}"] = minutes(row["exercises"], hours=False)
    for name, route in plan["routes"].items():
        values[f"route_{name}"], route_study, route_exercises = _route_text(plan, name)
        days = route.get("days")
        if days:
            lines = []
            for index, day in enumerate(days, 1):
                total = sum(rows[n]["study"] + rows[n]["exercises"] for n in day)
                which = f"chapter {day[0]}" if len(day) == 1 else f"chapters {and_list(day)}"
                end = "." if index == len(days) else ";"
                lines.append(f"- day {index}: {which} ({minutes(total)}){end}")
            values[f"route_{name}_days"] = "\n".join(lines)
            values[f"route_{name}_day_count"] = words(len(days)).capitalize()
            values[f"route_{name}_day_hours"] = words(round((route_study + route_exercises)
                                                            / 60 / len(days)))
    after_core = [set(route["chapters"]) for route in plan["routes"].values() if route.get("after")]
    if len(after_core) >= 2:
        shared = sorted(set.intersection(*after_core))
        values["routes_shared"] = and_list(shared) if shared else "none"
    return values


def problems(plan: dict) -> list[str]:
    """Routes that take a chapter before one it needs, and needs that name no chapter."""
    found = []
    rows = plan["chapters"]
    for number, row in rows.items():
        for need in row.get("needs", []) + row.get("helps", []):
            if need not in rows:
                found.append(f"chapter {number} needs chapter {need}, which has no row")
    for name, route in plan["routes"].items():
        read = set(plan["routes"][route["after"]]["chapters"]) if route.get("after") else set()
        for number in route["chapters"]:
            missing = sorted(set(rows[number].get("needs", [])) - read)
            if missing:
                found.append(f"the {name} route takes chapter {number} before chapters {missing}, "
                             "which it needs")
            read.add(number)
        for day in route.get("days", []):
            for number in day:
                if number not in route["chapters"]:
                    found.append(f"the {name} route's days name chapter {number}, not in the route")
    return found


def _on_config_inited(app: Sphinx, config) -> None:
    plan = load_plan(app.srcdir)
    config.myst_substitutions = {**(config.myst_substitutions or {}), **substitutions(plan)}
    # A change to the plan rebuilds every page (the chapter pages show their own time).
    config.course_plan_digest = hashlib.sha256(
        (Path(app.srcdir) / PLAN_FILE).read_bytes()).hexdigest()
    for problem in problems(plan):
        logger.warning(f"{PLAN_FILE}: {problem}")


def _doc_link(target: str, text: str | None = None) -> addnodes.pending_xref:
    """A link to a page, titled with the page's own title unless ``text`` is given."""
    xref = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget=f"/{target}",
                                 refexplicit=text is not None, refwarn=True)
    xref += nodes.inline(text or target, text or target)
    return xref


class CoursePlanTable(Directive):
    """The table of every chapter: its own title (a link), study time, exercise time, needs."""

    has_content = False

    def run(self):
        env = self.state.document.settings.env
        plan = load_plan(env.srcdir)
        env.note_dependency(str(Path(env.srcdir) / PLAN_FILE))
        docs = {int(m.group(1)): doc for doc in env.found_docs
                if (m := _CHAPTER_DOC.match(doc))}
        table = nodes.table(classes=["ab-course-plan"])
        group = nodes.tgroup(cols=3)
        table += group
        for width in (60, 20, 20):
            group += nodes.colspec(colwidth=width)

        def row(cells):
            line = nodes.row()
            for cell in cells:
                entry = nodes.entry()
                paragraph = nodes.paragraph()
                paragraph += cell if isinstance(cell, nodes.Node) else nodes.Text(cell)
                entry += paragraph
                line += entry
            return line

        head = nodes.thead()
        head += row(["Chapter", "Study + exercises", "Needs first"])
        group += head
        body = nodes.tbody()
        for number, item in sorted(plan["chapters"].items()):
            if number not in docs:
                logger.warning(f"{PLAN_FILE}: chapter {number} has a row but no notebook in "
                               "chapters/", location=(env.docname, self.lineno))
                continue
            needs = chapter_list(item.get("needs", [])) or "nothing"
            if item.get("helps"):
                needs += f" ({and_list(item['helps'])} help)"
            body += row([_doc_link(docs[number]),
                         f"{item['study']} + {minutes(item['exercises'], hours=False)}", needs])
        group += body
        return [table]


def _on_doctree_read(app: Sphinx, doctree: nodes.document) -> None:
    docname = app.env.docname
    match = _CHAPTER_DOC.match(docname)
    if not match:
        return
    number = int(match.group(1))
    plan = load_plan(app.srcdir)
    row = plan["chapters"].get(number)
    if row is None:  # reported once, by _on_env_check_consistency
        return
    paragraphs = list(doctree.findall(nodes.paragraph))
    anchor = next((p for p in paragraphs if p.astext().startswith("You should already know")),
                  paragraphs[0] if paragraphs else None)
    if anchor is None:
        return
    line = nodes.paragraph(classes=["ab-chapter-time"])
    line += nodes.strong("Time:", "Time:")
    line += nodes.Text(f" about {minutes(row['study'], hours=False)} of study and "
                       f"{minutes(row['exercises'], hours=False)} of exercises (")
    line += _doc_link(PLAN_DOC, "Plan your path")
    line += nodes.Text(" gives every chapter's time and routes through the book).")
    anchor.parent.insert(anchor.parent.index(anchor) + 1, line)


def _on_env_check_consistency(app: Sphinx, env) -> None:
    """Every chapter of the book has a row in the plan."""
    plan = load_plan(app.srcdir)
    for doc in sorted(env.found_docs):
        match = _CHAPTER_DOC.match(doc)
        if match and int(match.group(1)) not in plan["chapters"]:
            logger.warning(f"{PLAN_FILE}: chapter {int(match.group(1))} ({doc}) has no row: add "
                           "its study and exercise minutes and what it needs first", location=doc)


def setup(app: Sphinx) -> dict:
    app.add_config_value("course_plan_digest", "", "env")
    app.add_directive("course-plan-table", CoursePlanTable)
    app.connect("config-inited", _on_config_inited)
    app.connect("doctree-read", _on_doctree_read)
    app.connect("env-check-consistency", _on_env_check_consistency)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
