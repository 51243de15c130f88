"""What publishing the book needs: one repository setting, licences, citation, Binder, clean re-runs.

* **One setting.** ``repository.url`` and ``repository.branch`` in ``_config.yml`` name the
  book's repository; ``make practice`` writes them everywhere else (the help link and the clone
  command of ``plan_your_path.md`` included). A test changes them in a copy of the repository,
  runs ``make practice``'s command there, builds two pages, and checks that every place
  follows and the old address is left nowhere.
* **Plan your path** (``plan_your_path.md``): its times are the instructor guide's, its
  prerequisites are what each chapter's "You should already know" names, and every route's
  total adds up and never uses a chapter before the chapters it needs.
* **The Colab install cell** says what went wrong when the package cannot be installed.
* **Licences and citation:** ``LICENSE`` (MIT, the code), ``LICENSE-TEXT`` (CC BY 4.0, the
  text), ``CITATION.cff`` (Citation File Format 1.2.0).
* **Binder** (``binder/``): the practice notebooks' environment, with the CPU build of torch.
* **Re-executing is clean:** every stored notebook is already in the form that ``make execute``
  stores (``tools/normalize_notebooks.py``), and the executor records no timing, joins split
  streams and starts its kernel without a warning.
* **Docs that match the tree:** every file the docs name exists; `tools/which_tests.py` works.

The deploy workflow's build steps run in ``test_pages_workflow.py`` (they build the website,
so they belong to the tests of the built book).
"""

from __future__ import annotations

import html as html_lib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tomllib
import yaml
from repository_files import copy_repository, repository_files

from attention_book.classroom.format import find_chapters
from attention_book.classroom.practice import PLAN_PAGE, install_cell_source, repository_setting

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = find_chapters(ROOT)
NOTEBOOKS = [*CHAPTERS, *sorted((ROOT / "practice").glob("*.ipynb"))]

_spec = importlib.util.spec_from_file_location("normalize_notebooks",
                                               ROOT / "tools" / "normalize_notebooks.py")
normalize_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(normalize_notebooks)


def _first_code_cell(path: Path) -> str:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return "".join(next(c for c in notebook["cells"] if c["cell_type"] == "code")["source"])


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.split("#", 1)[0].strip())
        if match:
            pins[_canonical(match.group(1))] = match.group(2)
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --------------------------------------------------------------------------------------
# One setting.

NEW_URL, NEW_BRANCH = "https://github.com/example-org/renamed-book", "published"


def test_the_repository_setting_reaches_every_place(tmp_path):
    """Change the setting in a copy, run `make practice`'s command, build a page: all follow."""
    old_url, _ = repository_setting(ROOT)
    copy = copy_repository(tmp_path / "book")
    config = copy / "_config.yml"
    text = config.read_text()
    assert text.count(old_url) == 1
    config.write_text(text.replace(old_url, NEW_URL).replace("  branch: main", f"  branch: {NEW_BRANCH}"))
    assert repository_setting(copy) == (NEW_URL, NEW_BRANCH)

    # `make practice` runs this command (checked below, so the test runs what the Makefile runs).
    recipe = re.search(r"^practice:.*\n\t\$\(BIN\)/python (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and recipe.group(1) == "-m attention_book.classroom.practice", recipe
    result = subprocess.run([sys.executable, "-m", "attention_book.classroom.practice"], cwd=copy,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr

    package = f"attention-book[book] @ git+{NEW_URL}@{NEW_BRANCH}"
    cell = install_cell_source(copy)
    assert json.dumps(package) in cell
    for chapter in CHAPTERS:
        for notebook in (copy / "chapters" / chapter.name, copy / "practice" / chapter.name):
            assert _first_code_cell(notebook) == cell, f"{notebook.relative_to(copy)} did not follow"
    citation = yaml.safe_load((copy / "CITATION.cff").read_text())
    assert citation["repository-code"] == NEW_URL
    workflow = yaml.safe_load((copy / ".github" / "workflows" / "pages.yml").read_text())
    assert workflow[True]["push"]["branches"] == [NEW_BRANCH]  # PyYAML reads the key `on` as True
    plan = (copy / PLAN_PAGE).read_text()
    assert f"\ngit clone {NEW_URL}.git\n" in plan
    assert f"[the book's issue tracker]({NEW_URL}/issues)" in plan

    # The website's buttons and the help link: build one chapter's page and the plan from the copy.
    (copy / "_toc.yml").write_text(
        f"format: jb-book\nroot: intro\nchapters:\n  - file: chapters/{CHAPTERS[2].stem}\n"
        f"  - file: {Path(PLAN_PAGE).stem}\n")
    (copy / "node_modules").symlink_to(ROOT / "node_modules")
    build = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")), "build", str(copy)],
                           cwd=copy, capture_output=True, text=True, timeout=600)
    page = copy / "_build" / "html" / "chapters" / f"{CHAPTERS[2].stem}.html"
    assert build.returncode == 0 and page.is_file(), build.stdout[-3000:] + build.stderr[-3000:]
    html = page.read_text()
    owner_name = NEW_URL.removeprefix("https://github.com/")
    practice = f"practice/{CHAPTERS[2].name}"
    assert f"https://colab.research.google.com/github/{owner_name}/blob/{NEW_BRANCH}/{practice}" in html
    assert f"https://mybinder.org/v2/gh/{owner_name}/{NEW_BRANCH}?urlpath=tree/{practice}" in html
    assert f'href="{NEW_URL}"' in html and f"{NEW_URL}/issues/new" in html
    plan_html = (copy / "_build" / "html" / f"{Path(PLAN_PAGE).stem}.html").read_text()
    plan_text = html_lib.unescape(re.sub(r"<[^>]+>", "", plan_html))  # code is split into spans
    assert f'href="{NEW_URL}/issues"' in plan_html and f"git clone {NEW_URL}.git" in plan_text

    # And the old address is left nowhere: not in a file of the repository, not on the page.
    stale = [name for name in repository_files()
             if (copy / name).suffix not in {".png", ".svg", ".ico"}
             and old_url in (copy / name).read_text(encoding="utf-8", errors="replace")]
    assert stale == [] and old_url not in html + plan_html, f"still naming {old_url}: {stale}"


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match="repository.url"):
        _setting_of("repository:\n  url: git@github.com:owner/name.git\n  branch: main\n")
    with pytest.raises(ValueError, match="repository.branch"):
        _setting_of("repository:\n  url: https://github.com/owner/name\n  branch: 'main; rm'\n")
    assert _setting_of("repository:\n  url: https://github.com/owner/name/\n  branch: main\n") == (
        "https://github.com/owner/name", "main")


def _setting_of(config: str):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "_config.yml").write_text(config)
        return repository_setting(folder)


def test_the_docs_do_not_repeat_the_address():
    url, _ = repository_setting(ROOT)
    for name in ("README.md", "CONTRIBUTING.md", "intro.md", "instructor_guide.md"):
        assert url not in (ROOT / name).read_text(), f"{name} names {url}: say `_config.yml` instead"


# --------------------------------------------------------------------------------------
# The install cell.


def _run_install_cell(source: str, colab: bool, package: bool = True) -> subprocess.CompletedProcess:
    fake = "import sys, types; sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
    missing = "import sys; sys.modules['attention_book'] = None  # the import fails\n"
    return subprocess.run([sys.executable, "-c", (fake if colab else "") + ("" if package else missing)
                           + source], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("colab", [False, True], ids=["elsewhere", "colab"])
def test_the_install_cell_does_nothing_where_the_package_imports(colab):
    result = _run_install_cell(install_cell_source(ROOT), colab=colab)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_install_cell_says_what_failed_and_how_to_fix_it(tmp_path):
    """On Colab, an address that cannot be installed gives a message, not a bare pip traceback."""
    (tmp_path / "_config.yml").write_text(
        "repository:\n  url: https://example.invalid/nobody/attention-book\n  branch: main\n")
    result = _run_install_cell(install_cell_source(tmp_path), colab=True, package=False)
    assert result.returncode != 0
    message = result.stderr
    assert "RuntimeError: Could not install the book's package, which every cell below needs." in message
    assert ("pip tried: pip install 'attention-book[book] @ "
            "git+https://example.invalid/nobody/attention-book@main'") in message
    assert "check the connection" in message and "new address" in message
    assert "CalledProcessError" not in message


def test_off_colab_a_missing_package_gets_the_install_command_not_a_bare_import_error():
    """Kaggle, a university hub, a plain Jupyter: the cell names the one line to run."""
    url, branch = repository_setting(ROOT)
    result = _run_install_cell(install_cell_source(ROOT), colab=False, package=False)
    assert result.returncode != 0 and result.stdout == ""
    message = result.stderr
    assert "ModuleNotFoundError: This notebook needs the book's package, attention_book" in message
    assert f"%pip install 'attention-book[book] @ git+{url}@{branch}'" in message
    assert "restart the kernel" in message and "download.pytorch.org/whl/cpu" in message
    assert "Traceback" in message and message.count("File ") == 1  # one frame: the cell itself


# --------------------------------------------------------------------------------------
# Licences, citation.


def test_the_licences_are_there():
    code = (ROOT / "LICENSE").read_text()
    assert code.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in code
    text = (ROOT / "LICENSE-TEXT").read_text()
    assert text.startswith("Attribution 4.0 International\n")
    for part in ("Creative Commons Attribution 4.0 International Public License",
                 "Section 8 -- Interpretation.", "Creative Commons may be contacted at creativecommons.org."):
        assert part in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    readme = (ROOT / "README.md").read_text()
    assert "`LICENSE`" in readme and "`LICENSE-TEXT`" in readme


def test_the_citation_file_is_cff_1_2_0_and_names_the_repository():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    for key in ("message", "title"):
        assert isinstance(citation[key], str) and citation[key].strip()
    assert citation["authors"] and all(
        isinstance(author, dict) and (author.get("name") or author.get("family-names"))
        for author in citation["authors"])
    assert citation["repository-code"] == repository_setting(ROOT)[0]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert citation["version"] == project["version"]
    assert citation["type"] in ("software", "dataset")


# --------------------------------------------------------------------------------------
# Binder.


def test_binder_installs_the_package_and_cpu_torch_at_the_book_versions():
    binder = ROOT / "binder"
    requirements = (binder / "requirements.txt").read_text()
    assert re.search(r"^--(extra-)?index-url https://download\.pytorch\.org/whl/cpu$", requirements, re.M)
    pins, book_pins = _pins(binder / "requirements.txt"), _pins(ROOT / "requirements.txt")
    assert pins["torch"] == book_pins["torch"] + "+cpu"
    assert {name: version for name, version in pins.items() if name != "torch"} == {
        name: book_pins[name] for name in pins if name != "torch"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = [*project["dependencies"], *project["optional-dependencies"]["book"]]
    needed = {_canonical(re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0]) for spec in needed}
    assert needed <= set(pins), f"binder/requirements.txt lacks {sorted(needed - set(pins))}"
    # No local path in requirements.txt (repo2docker can then install it before copying the
    # clone, and cache it): postBuild installs the package itself, from the clone.
    assert not re.search(r"^\s*(-e\s+)?\.(\[|\s|$)", requirements, re.M)
    post_build = binder / "postBuild"
    assert os.access(post_build, os.X_OK) and post_build.read_text().startswith("#!/bin/bash")
    assert re.search(r"^python -m pip install --no-cache-dir --no-deps \.$", post_build.read_text(), re.M)
    runtime = (binder / "runtime.txt").read_text().strip()
    assert runtime == "python-3.11" and project["requires-python"] == ">=3.10"


def test_binder_covers_every_import_of_the_practice_notebooks():
    import ast

    pins = _pins(ROOT / "binder" / "requirements.txt")
    distributions = importlib.metadata.packages_distributions()
    missing = set()
    for path in sorted((ROOT / "practice").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            source = "\n".join(line for line in cell.source.splitlines()
                               if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                         else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top == "attention_book":
                        continue
                    if not {_canonical(d) for d in distributions.get(top, [top])} & set(pins):
                        missing.add(f"{top} ({path.name})")
    assert not missing, f"binder/requirements.txt does not install {sorted(missing)}"


# --------------------------------------------------------------------------------------
# Re-executing is clean.


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_stored_notebook_is_normalised(path, tmp_path):
    """Normalising a copy changes nothing: re-running the chapter with `make execute` won't either."""
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    assert normalize_notebooks.main([str(copy)]) == 0
    assert copy.read_bytes() == path.read_bytes(), (
        f"{path.relative_to(ROOT)} is not stored normalised (timestamps, split streams, random "
        "widget ids): run `python tools/normalize_notebooks.py` on it, or re-run it with "
        "`make execute NB=...`")


def _run_of(seed: int) -> dict:
    """A notebook as an executor stores it, with timestamps, split streams and random widget ids."""
    import random

    rng = random.Random(seed)
    ids = ["".join(rng.choice("0123456789abcdef") for _ in range(32)) for _ in range(3)]
    box, bar, layout = ids
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("train()", execution_count=1, id="train-cell")
    cell.metadata["execution"] = {"iopub.status.busy": f"2026-01-0{seed % 9 + 1}T00:00:00Z"}
    text = "step 1\nstep 2\nstep 3\n"
    cut = 3 + seed % 10
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text[:cut]),
                    nbformat.v4.new_output("stream", name="stdout", text=text[cut:]),
                    nbformat.v4.new_output("display_data", data={
                        "application/vnd.jupyter.widget-view+json": {"model_id": box},
                        "text/plain": "HBox()"}),
                    nbformat.v4.new_output("stream", name="stdout", text="done\n")]
    notebook.cells = [cell]
    state = {box: {"model_name": "HBoxModel", "state": {"children": [f"IPY_MODEL_{bar}"]}},
             bar: {"model_name": "FloatProgressModel", "state": {"layout": f"IPY_MODEL_{layout}"}},
             layout: {"model_name": "LayoutModel", "state": {}}}
    items = list(state.items())
    rng.shuffle(items)
    notebook.metadata["widgets"] = {normalize_notebooks.WIDGET_STATE: {"state": dict(items)}}
    return notebook


def test_the_normaliser_makes_two_runs_identical_and_keeps_what_they_show():
    first, second = (nbformat.writes(normalize_notebooks.normalize(_run_of(seed))) for seed in (1, 6))
    assert first == second
    notebook = nbformat.reads(first, as_version=4)
    cell = notebook.cells[0]
    assert "execution" not in cell.metadata
    assert [output.get("text") for output in cell.outputs] == ["step 1\nstep 2\nstep 3\n", None, "done\n"]
    state = notebook.metadata["widgets"][normalize_notebooks.WIDGET_STATE]["state"]
    view = cell.outputs[1].data["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert state[view]["model_name"] == "HBoxModel"
    bar = state[view]["state"]["children"][0].removeprefix("IPY_MODEL_")
    assert state[bar]["model_name"] == "FloatProgressModel"
    assert normalize_notebooks.normalized_text(first + "\n") == first + "\n"  # idempotent


def test_make_execute_records_no_timing_joins_streams_and_warns_of_nothing(tmp_path):
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell(
        "import sys, time\nfor step in range(4):\n    print('step', step, flush=True)\n"
        "    time.sleep(0.05)"), nbformat.v4.new_code_cell("print('done')")]
    path = tmp_path / "run.ipynb"
    nbformat.write(notebook, path)
    recipe = re.search(r"^execute:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "tools/with_numerics pinned $(BIN)/python tools/execute_notebook.py $$nb" in recipe
    runs = []
    for _ in range(2):
        result = subprocess.run([str(ROOT / "tools" / "with_numerics"), "pinned", sys.executable,
                                 str(ROOT / "tools" / "execute_notebook.py"), str(path)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "WARNING" not in result.stderr and "encryption" not in result.stderr, result.stderr
        runs.append(path.read_bytes())
    assert runs[0] == runs[1]
    stored = nbformat.reads(runs[0].decode(), as_version=4)
    assert [cell.execution_count for cell in stored.cells] == [1, 2]
    assert all("execution" not in cell.metadata for cell in stored.cells)
    assert [[(o.output_type, o.get("text")) for o in cell.outputs] for cell in stored.cells] == [
        [("stream", "step 0\nstep 1\nstep 2\nstep 3\n")], [("stream", "done\n")]]
    assert not list(tmp_path.glob("kernel-*")), "the kernel's sockets were left beside the notebook"


# --------------------------------------------------------------------------------------
# Plan your path, the instructor guide and every chapter page: each chapter's time and what it
# needs first come from one file, course_plan.yml (_ext/course_plan.py writes them into the
# pages; tests/test_book_build.py reads the built pages).

_RANGE = r"\d+(?:\s*[–-]\s*\d+)?"


def _numbers(text: str) -> set[int]:
    """The chapter numbers in a list such as "2–4, 7" or "5 and 6"."""
    numbers: set[int] = set()
    for item in re.findall(_RANGE, text):
        ends = [int(end) for end in re.split(r"[–-]", item)]
        numbers.update(range(ends[0], ends[-1] + 1))
    return numbers


def _named_in_should_know(chapter: Path) -> set[int]:
    """The chapters that a chapter's "You should already know" names."""
    first = "".join(nbformat.read(chapter, as_version=4).cells[0].source)
    known = first.split("**You should already know**", 1)[1]
    lists = re.findall(rf"chapters?\s+({_RANGE}(?:(?:,\s*|\s+and\s+){_RANGE})*)", known)
    return set().union(*map(_numbers, lists)) if lists else set()


def _minutes(text: str) -> int:
    match = re.fullmatch(r"(\d+) h(?: (\d+) min)?|(\d+) min", text.strip())
    assert match, f"not a time: {text!r}"
    hours, minutes, only = match.groups()
    return int(only) if only else 60 * int(hours) + int(minutes or 0)


def _course_plan():
    """The extension that reads course_plan.yml, and the plan it reads."""
    spec = importlib.util.spec_from_file_location("course_plan", ROOT / "_ext" / "course_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.load_plan(ROOT)


def test_every_chapter_has_a_row_in_the_course_plan():
    _, plan = _course_plan()
    numbers = {int(path.name[:2]) for path in CHAPTERS}
    assert set(plan["chapters"]) == numbers, (
        f"course_plan.yml has rows for {sorted(plan['chapters'])}, the book chapters "
        f"{sorted(numbers)}")
    for number, row in plan["chapters"].items():
        assert row["study"] > 0 and row["exercises"] > 0, (number, row)


def test_the_plan_names_what_each_chapter_says_it_needs():
    _, plan = _course_plan()
    for chapter in CHAPTERS:
        row = plan["chapters"][int(chapter.name[:2])]
        named = set(row["needs"]) | set(row.get("helps", []))
        assert named == _named_in_should_know(chapter), (
            f"course_plan.yml, chapter {chapter.name[:2]}: needs and helps {sorted(named)}, its "
            f"'You should already know' names {sorted(_named_in_should_know(chapter))}")
    assert _named_in_should_know(CHAPTERS[12]) == {1, 2, 3, 4, 5, 7, 10, 11}  # ranges, links


def test_every_route_reads_each_chapter_after_what_it_needs():
    module, plan = _course_plan()
    assert module.problems(plan) == []
    core = plan["routes"]["core"]
    assert [n for day in core["days"] for n in day] == core["chapters"]
    # The check can fail: chapter 11 taken before chapter 7, which it needs.
    broken = {**plan, "routes": {"core": {"chapters": [0, 1, 2, 3, 4, 5, 6, 11, 7]}}}
    assert module.problems(broken) == [
        "the core route takes chapter 11 before chapters [7], which it needs"]


def test_the_totals_add_up():
    module, plan = _course_plan()
    values = module.substitutions(plan)
    rows = plan["chapters"]
    for name, route in plan["routes"].items():
        match = re.fullmatch(r"Chapters ((?:\d+ → )+\d+): (.+) \((.+) of study, (.+) of exercises\)",
                             values[f"route_{name}"])
        chapters, total, study, exercises = match.groups()
        assert [int(n) for n in chapters.split(" → ")] == route["chapters"]
        assert _minutes(study) == sum(rows[n]["study"] for n in route["chapters"])
        assert _minutes(exercises) == sum(rows[n]["exercises"] for n in route["chapters"])
        assert _minutes(total) == _minutes(study) + _minutes(exercises)
    days = re.findall(r"day \d: chapters? ([\d, and]+) \(([\d a-z]+)\)", values["route_core_days"])
    for chapters, time in days:
        assert _minutes(time) == sum(rows[n]["study"] + rows[n]["exercises"] for n in _numbers(chapters))
    study = sum(row["study"] for row in rows.values())
    exercises = sum(row["exercises"] for row in rows.values())
    assert values["book_total"] == (f"about {round((study + exercises) / 60)} hours: "
                                    f"{round(study / 60)} of study and {round(exercises / 60)} of "
                                    "exercises")
    assert values["course_weeks"] == module.words(len(rows))
    assert [module.words(n) for n in (18, 20, 21, 34)] == [
        "eighteen", "twenty", "twenty-one", "thirty-four"]
    assert module.chapter_list([1, 2, 3, 5, 7, 8]) == "1–3, 5, 7, 8"
    assert module.minutes(90) == "1 h 30 min" and module.minutes(90, hours=False) == "90 min"


def test_times_and_needs_are_written_only_in_the_course_plan():
    """No page writes a time, a course length or a chapter's needs by hand: each takes them
    from course_plan.yml (substitutions, the plan's table directive)."""
    plan = (ROOT / PLAN_PAGE).read_text()
    guide = (ROOT / "instructor_guide.md").read_text()
    for name, text in ((PLAN_PAGE, plan), ("instructor_guide.md", guide)):
        assert not re.search(r"\b\d+ (h|min)\b", text), f"{name} writes a time by hand"
        assert not re.search(r"\b(\w+|\d+) weeks\b(?<!course_weeks \}\} weeks)", text.replace(
            "{{ course_weeks }} weeks", "")), f"{name} writes the course length by hand"
        assert "{{ course_weeks }} weeks" in text, name
    assert "```{course-plan-table}" in plan and "{{ book_total }}" in plan
    assert all(f"{{{{ route_{name} }}}}" in plan for name in ("core", "models", "systems"))
    rows = re.findall(r"^\| (\d+)\. [^|]+\|[^|]+\| ([^|]+) \| ([^|]+) \|$", guide, re.M)
    assert len(rows) >= 20, f"the guide's table of chapters was not found ({len(rows)} rows)"
    for number, study, exercises in rows:
        assert (study.strip(), exercises.strip()) == (
            f"{{{{ study_{int(number):02d} }}}}", f"{{{{ exercises_{int(number):02d} }}}}"), (
            f"instructor_guide.md, chapter {number}: write its times as the substitutions")


# --------------------------------------------------------------------------------------
# Docs that match the tree.

_DOCS = ("README.md", "CONTRIBUTING.md", "intro.md", PLAN_PAGE, "tools/numerics/README.md",
         "tools/numerics/pinned.env", "tools/numerics/alternate.env", "requirements.txt",
         "requirements-book.txt", "binder/requirements.txt", "_config.yml")
_PATH = re.compile(r"(?<![\w/.-])((?:\.\./)*(?:[\w.-]+/)+[\w.-]+\.(?:py|md|txt|yml|yaml|env|cfg|"
                   r"json|toml|ipynb|sh|cff|csv)|(?:[\w.-]+/){1,}[\w.-]+/)(?![\w/-])")


def _named_paths(text: str) -> set[str]:
    names = set()
    for match in _PATH.finditer(text):
        name = match.group(1)
        if re.search(r"NN|chNN|\bx\.ipynb|_x\.|\*|…|<|\{|https?:|//", name) or name.startswith(
                ("_build/", "node_modules/", ".venv/", "_static/npm/")):
            continue
        names.add(name)
    return names


def _exists_in_the_repository(name: str, doc: str) -> bool:
    # relative to the document, to the root, or (a link written in a chapter) to chapters/
    for base in (ROOT / Path(doc).parent, ROOT, ROOT / "chapters"):
        path = (base / name).resolve()
        if path.is_relative_to(ROOT) and path.exists():
            return True
    return False


@pytest.mark.parametrize("doc", _DOCS)
def test_the_docs_name_only_files_that_exist(doc):
    """No dangling reference: each path a doc names is in the repository (a clone has nothing else)."""
    text = (ROOT / doc).read_text()
    missing = sorted(name for name in _named_paths(text) if not _exists_in_the_repository(name, doc))
    assert not missing, f"{doc} names files that are not in the repository: {missing}"


def test_package_json_describes_the_real_folders():
    description = json.loads((ROOT / "package.json").read_text())["description"]
    for name in re.findall(r"[\w.-]*/[\w./-]*", description):
        assert (ROOT / name.rstrip("/")).exists() or name.rstrip("/").startswith("_static/npm"), name
    assert "_static/npm/" in description and "_ext/static_site.py" in description


def test_the_readme_lists_every_everyday_command():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("book", "test", "lab", "lab-chapters", "execute", "practice", "lint"):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
        assert f"`make {target}" in readme, f"README: `make {target}` is not explained"


def test_which_tests_names_the_tests_and_chapters_of_a_module():
    """The README's `tools/which_tests.py`: positions.py -> its tests, the chapter that teaches it."""
    spec = importlib.util.spec_from_file_location("which_tests", ROOT / "tools" / "which_tests.py")
    which_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(which_tests)
    tests, direct, indirect = which_tests.users(["attention_book.positions"])["attention_book.positions"]
    assert "tests/test_positions.py" in tests and "tests/test_attention.py" not in tests
    teaching = [c for c in direct if re.match(r"chapters/12_", c)]
    assert teaching and not set(direct) & set(indirect)
    assert "attention_book.positions" in which_tests.all_modules()
