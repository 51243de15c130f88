"""On the website, Colab, Binder and the download button open a chapter's practice version.

The page itself keeps the solutions behind their toggles; only the buttons that hand the
reader a notebook to run point at ``practice/NN_name.ipynb`` (``_ext/practice_links.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attention_book.classroom.format import find_chapters

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = find_chapters(ROOT)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_launch_buttons_open_the_practice_notebook(built_book, chapter):
    html = (built_book.html_dir / "chapters" / f"{chapter.stem}.html").read_text()
    launch = re.findall(r'href="(https://(?:colab\.research\.google\.com|mybinder\.org)[^"]+)"',
                        html)
    assert len(launch) == 2, launch
    for url in launch:
        assert url.endswith(f"practice/{chapter.name}"), url


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_the_download_button_serves_the_practice_notebook(built_book, chapter):
    html = (built_book.html_dir / "chapters" / f"{chapter.stem}.html").read_text()
    assert f'href="../_sources/chapters/{chapter.name}"' in html
    served = built_book.html_dir / "_sources" / "chapters" / chapter.name
    assert served.read_bytes() == (ROOT / "practice" / chapter.name).read_bytes()
