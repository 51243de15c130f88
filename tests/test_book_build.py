"""The website builds with warnings as errors and not a single warning, and has what a newcomer
looks for: the API reference, the glossary, the changelog, and each chapter's time.

These read the pages of the one build the test session makes (``built_book``): no browser.
"""

import html
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_book_builds_without_warnings(built_book):
    warnings = [line for line in built_book.log.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert built_book.returncode == 0, f"jupyter-book build failed:\n{built_book.log[-4000:]}"
    assert warnings == [], "the book build printed warnings:\n" + "\n".join(warnings)
    assert (built_book.html_dir / "index.html").is_file()


def _text(path: Path) -> str:
    """A page's main column as text."""
    page = path.read_text(encoding="utf-8")
    main = page[page.index("<main"):page.index("</main>")]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", main)))


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_documents_every_public_module_from_its_docstrings(built_book):
    """api.html has a section for every public module (_ext/api_reference.py lists them) and the
    docstrings' own words: autodoc read the package, with torch mocked."""
    page = (built_book.html_dir / "api.html").read_text(encoding="utf-8")
    for module in _module("api_reference").public_modules():
        documented = any(f'id="module-{name}"' in page
                         for name in [module, *(module.rsplit(".", n)[0] for n in (1, 2))])
        assert documented, f"api.html has no section for {module}"
    assert 'id="attention_book.attention.scaled_dot_product_attention"' in page
    assert "Scaled dot-product attention that returns its weights." in _text(
        built_book.html_dir / "api.html")


def test_glossary_links_each_term_to_the_section_that_teaches_it(built_book):
    page = (built_book.html_dir / "glossary.html").read_text(encoding="utf-8")
    terms = re.findall(r'<dt id="term-([^"]+)"', page)
    entries = re.split(r'<dt id="term-', page)[1:]
    assert len(terms) >= 40 and len(entries) == len(terms)
    for term, entry in zip(terms, entries, strict=True):
        links = re.findall(r'href="(chapters/\d\d_[^"#]+\.html(?:#[^"]+)?)"', entry)
        assert links, f"the glossary's {term} links to no chapter"
    # The anchors exist: tests/test_browser.py checks every link of every page in the browser.


def test_changelog_is_a_page_of_the_book(built_book):
    text = _text(built_book.html_dir / "CHANGELOG.html")
    assert "Changelog" in text and "Unreleased" in text


def test_every_chapter_page_shows_its_time_from_the_course_plan(built_book):
    """Each chapter page says how long it takes, the plan's table lists every chapter with the
    same times, and no substitution is left unreplaced (course_plan.yml is the one source)."""
    course_plan = _module("course_plan")
    plan = course_plan.load_plan(ROOT)
    plan_text = _text(built_book.html_dir / "plan_your_path.html")
    for number, row in plan["chapters"].items():
        page = next((built_book.html_dir / "chapters").glob(f"{number:02d}_*.html"))
        study = course_plan.minutes(row["study"], hours=False)
        exercises = course_plan.minutes(row["exercises"], hours=False)
        assert f"Time: about {study} of study and {exercises} of exercises" in _text(page), page.name
        needs = course_plan.chapter_list(row["needs"]) or "nothing"
        assert re.search(rf"{number}\. [^|]*? {row['study']} \+ {exercises} {re.escape(needs)}",
                         plan_text), (
            f"the plan's table lacks chapter {number} with {study}, {exercises}, needs {needs}")
    for name in ("plan_your_path.html", "instructor_guide.html", "intro.html"):
        assert "{{" not in _text(built_book.html_dir / name), f"{name} shows a raw substitution"
    weeks = course_plan.words(len(plan["chapters"]))
    for name in ("plan_your_path.html", "instructor_guide.html"):
        assert f"about {weeks} weeks" in _text(built_book.html_dir / name), name
