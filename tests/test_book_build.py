"""The website builds with warnings as errors and not a single warning."""

import re


def test_book_builds_without_warnings(built_book):
    warnings = [line for line in built_book.log.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert built_book.returncode == 0, f"jupyter-book build failed:\n{built_book.log[-4000:]}"
    assert warnings == [], "the book build printed warnings:\n" + "\n".join(warnings)
    assert (built_book.html_dir / "index.html").is_file()
