"""The website, tested in a real browser: it stands on its own, works without a kernel, is accessible.

Every page listed in ``_toc.yml`` is loaded in Debian's Chromium (driven by Playwright) from a
static server on 127.0.0.1, with every request to another host blocked and recorded. Each page
is visited once (``page_report``) and every test below reads what that visit saw, so a failure
names both the page and the property. A full-page screenshot of each page is saved under
``_build/screenshots/`` for a person to look at.

The same visit then narrows the window to a tablet (768 x 1024) and a phone (390 x 844), without
reloading the page: at each size (and on the desktop) the visible button opens the table of
contents, no page is wider than the screen, printed outputs wrap, every box that scrolls
sideways shows its cue, and every demo (chapter 9's probabilities included) is on screen. The
phone-size screenshots are saved under ``_build/screenshots/phone/``. The accessibility scan
runs at desktop size only.

Still in the same visit: on the phone, every figure's smallest text must be at least 9 CSS px
as drawn (its font size and dpi, measured by ``tools/figure_text.py``, times the width the
browser gives it; ``_ext/figure_links.py``); printed on A4 (print media, a 718 px column), no
line of code may run past the page; and in dark mode every text of a demo must reach a
contrast of 4.5:1 (WCAG AA). Two tests make visits of their own: the search page (snippets
quote the sentence with the word typed, ``_static/search_summary.js``) and two taps on a wide
figure on a phone (it fits the screen, then comes back to its readable width).

Chromium: ``tools/ensure_chromium.sh`` (run by ``make test``) installs Debian's ``chromium`` when
it is missing; set ``CHROMIUM`` to use another Chromium or Chrome binary. A missing browser is a
test failure, never a skip.
"""

from __future__ import annotations

import functools
import hashlib
import html.parser
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest
import yaml
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

ROOT = Path(__file__).resolve().parents[1]
# Each page's total transfer: the HTML and everything it loads, as compressed on the wire
# (the test server gzips text files as GitHub Pages and other hosts do).
MAX_PAGE_BYTES = 3_000_000
# Every wait below ends as soon as its condition holds; these are only the limits, set for a
# busy machine (at a load average of 20 on 2 cores a page took over 30 s to load and to
# screenshot). WAIT_MS: the longest a page may take to typeset its math or draw a view (what is
# still missing then is what the tests report); STEP_MS: any one step of Playwright (a load, a
# click, a screenshot); SETTLE_MS: a transition or a resize to settle.
WAIT_MS = 120_000
STEP_MS = 180_000
SETTLE_MS = 30_000
DESKTOP = (1280, 900)
SMALL_SCREENS = ((768, 1024), (390, 844))  # a tablet, a phone
PHONE = (390, 844)
# --------------------------------------------------------------------------------------
# Which pages: everything the table of contents lists, read afresh on every run.


def _toc_files(entry) -> list[str]:
    files: list[str] = []
    if isinstance(entry, dict):
        if "glob" in entry:
            raise ValueError(f"list pages with `file:` in _toc.yml, not `glob:` ({entry})")
        if "file" in entry:
            files.append(re.sub(r"\.(md|ipynb|rst)$", "", str(entry["file"])))
        for key in ("parts", "chapters", "sections", "subtrees", "entries"):
            for child in entry.get(key) or []:
                files += _toc_files(child)
    return files


def toc_pages() -> list[str]:
    """The docnames of every page in ``_toc.yml``: the root first, then in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return [re.sub(r"\.(md|ipynb|rst)$", "", str(toc["root"]))] + _toc_files(toc)


PAGES = toc_pages()


def book_config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------
# One visit per page; the tests read its report.


@dataclass
class PageReport:
    docname: str
    url: str
    status: int | None = None
    blocked: list[str] = field(default_factory=list)  # requests to another host (aborted)
    failed: list[str] = field(default_factory=list)  # local requests that did not succeed
    console_errors: list[str] = field(default_factory=list)
    transfer_bytes: int = 0
    largest: list[str] = field(default_factory=list)  # the heaviest responses, for the message
    math: dict = field(default_factory=dict)
    bertviz: list[dict] = field(default_factory=list)
    bertviz_outputs: int = 0  # bertviz parameter scripts in the page: one per stored view
    widgets: list[dict] = field(default_factory=list)
    demos: list[dict] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    axe_violations: list[dict] = field(default_factory=list)
    launch_links: list[str] = field(default_factory=list)
    run_hints_shown: int = 0  # "Run this cell ..." lines still on screen once the scripts ran
    check_cells: list[dict] = field(default_factory=list)  # each exercise check cell: folded?
    hidden_tests_shown: bool = False  # "BEGIN HIDDEN TESTS" in the text a reader sees
    screens: dict = field(default_factory=dict)  # width -> what that screen size showed
    printed: dict = field(default_factory=dict)  # the page as printed on A4
    dark_contrast: list[dict] = field(default_factory=list)  # each demo text in dark mode
    dark_axe_violations: list[dict] = field(default_factory=list)  # axe on the demos, dark mode
    answer_toggles: list[str] = field(default_factory=list)  # what each answer's toggle says
    title: str = ""
    footer: str = ""
    screenshot: Path | None = None


MATH_JS = r"""() => {
  const sources = [...document.querySelectorAll("span.math, div.math")];
  const unrendered = sources.filter(el => !el.querySelector("mjx-container"))
                            .map(el => el.textContent.trim().slice(0, 80));
  const errors = [...document.querySelectorAll("mjx-merror")]
                   .map(el => el.getAttribute("data-mjx-error") || el.textContent);
  const main = document.querySelector("main") || document.body;
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  const raw = [];
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (node.parentElement.closest("pre, code, script, style, textarea, mjx-container")) continue;
    if (node.nodeValue.includes("$$")) raw.push(node.nodeValue.trim().slice(0, 80));
  }
  // A backslash MathJax printed as text (as in \text{head\_dim}) is TeX it did not understand.
  const backslashes = [...document.querySelectorAll("mjx-assistive-mml mtext")]
                        .map(el => el.textContent).filter(text => text.includes("\\"));
  return {sources: sources.length, rendered: document.querySelectorAll("mjx-container").length,
          unrendered, errors, raw, backslashes};
}"""

MATH_READY_JS = """() => !document.querySelector("span.math, div.math") ||
  !!(window.MathJax && MathJax.startup && MathJax.startup.promise)"""

# MathJax's startup promise settles once the first typesetting pass is done.
MATH_TYPESET_JS = """() => window.MathJax && MathJax.startup && MathJax.startup.promise
  ? MathJax.startup.promise.then(() => true, () => false) : true"""

BERTVIZ_JS = r"""(clickDetail) => [...document.querySelectorAll('div[id^="bertviz-"]')].map(root => {
  // The view's parameters (tokens included) sit in the script bertviz wrote after it.
  let tokens = [];
  for (const script of document.scripts) {
    const m = script.textContent.match(/const params = (\{.*\});\s*\/\/ HACK/);
    if (!m || !m[1].includes(root.id)) continue;
    const attention = JSON.parse(m[1]).attention;
    const view = attention[Object.keys(attention)[0]];
    tokens = [...new Set([...(view.left_text || []), ...(view.right_text || [])])];
  }
  if (clickDetail) {  // the model view shows a head's tokens once its thumbnail is clicked
    const region = root.querySelector('svg rect[style*="opacity: 0"]');
    if (region) region.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  }
  const visible = [...root.querySelectorAll("svg text")].filter(t => {
    const box = t.getBoundingClientRect();
    const style = getComputedStyle(t);
    return box.width > 0 && box.height > 0 && style.visibility !== "hidden" &&
           style.display !== "none" && t.textContent.trim() !== "";
  }).map(t => t.textContent.trim());
  const labels = [...new Set(visible)];
  return {id: root.id, tokens, labels,
          missing: tokens.filter(tok => !labels.includes(tok.trim()))};
})"""

WIDGETS_JS = """() => [...document.querySelectorAll(
    'script[type="application/vnd.jupyter.widget-view+json"]')].map(tag => {
  const area = tag.previousElementSibling;
  const box = area && area.classList.contains("widget-subarea")
              ? area.getBoundingClientRect() : null;
  return {model_id: JSON.parse(tag.textContent).model_id,
          rendered: !!box && box.width > 0 && box.height > 0 && area.children.length > 0};
})"""

WIDGETS_READY_JS = """() => [...document.querySelectorAll(
    'script[type="application/vnd.jupyter.widget-view+json"]')].every(tag => {
  const area = tag.previousElementSibling;
  return area && area.classList.contains("widget-subarea") && area.children.length > 0;
})"""

BERTVIZ_OUTPUTS_JS = r"""() => [...document.scripts]
  .filter(script => /const params = \{.*\};\s*\/\/ HACK/.test(script.textContent)).length"""

BERTVIZ_READY_JS = """() => [...document.querySelectorAll('div[id^="bertviz-"]')]
  .every(root => root.querySelector("svg text"))"""

IMAGES_JS = """() => [...document.querySelectorAll("img")].map(img => ({
  src: img.getAttribute("src"), alt: img.getAttribute("alt"),
  loaded: img.complete && img.naturalWidth > 0,
  content: !!img.closest("article.bd-article"),
  linked: !!img.closest("a[href]") && img.closest("a[href]").href === img.src}))"""

# How wide each figure of the article is shown (CSS px), against its natural width and the
# column's; `file`: its image file, whose name is the SHA-256 of the PNG.
FIGURES_JS = """() => {
  const article = document.querySelector("article.bd-article");
  if (!article) { return []; }
  const style = getComputedStyle(article);
  const column = article.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return [...article.querySelectorAll("img")].filter(img => img.checkVisibility()).map(img => {
    const link = img.closest("a[href]");
    return {file: img.getAttribute("src").split("/").pop(),
            width: img.getBoundingClientRect().width, natural: img.naturalWidth,
            column: Math.round(column), linked: !!link && link.href === img.src};
  });
}"""

# The page printed on A4: the print stylesheet, a 718 px column (210 mm at 96 px per inch,
# less Chromium's default margins), every fold open. A line of code runs past the page when
# its box scrolls or clips it, or it reaches past the page's edge.
PRINT_JS = r"""() => {
  document.querySelectorAll("main details").forEach(fold => { fold.open = true; });
  const width = document.documentElement.clientWidth;
  const code = [...document.querySelectorAll("main pre")].filter(pre => pre.checkVisibility());
  const cut = code.filter(pre => {
    const r = pre.getBoundingClientRect();
    if (pre.scrollWidth > pre.clientWidth + 1 || r.right > width + 0.5) { return true; }
    for (let box = pre.parentElement; box && box !== document.body; box = box.parentElement) {
      if (getComputedStyle(box).overflowX !== "visible" &&
          r.right > box.getBoundingClientRect().right + 0.5) { return true; }
    }
    return false;
  }).map(pre => pre.innerText.split("\n").reduce((a, b) => (b.length > a.length ? b : a)).slice(0, 70));
  return {width, code: code.length, cut};
}"""
PRINT_PAGE = (718, 1000)

# Dark mode as the theme's switch sets it, then the contrast of every text in a demo against
# what is behind it (WCAG 2: (L1 + 0.05) / (L2 + 0.05), semi-transparent layers composited).
DARK_MODE_JS = """() => { document.documentElement.dataset.theme = "dark";
  document.documentElement.dataset.mode = "dark"; }"""
DEMO_CONTRAST_JS = r"""() => {
  const rgba = text => {
    const v = text.match(/[\d.]+/g).map(Number);
    return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1];
  };
  const over = (top, below) =>
    [0, 1, 2].map(i => top[i] * top[3] + below[i] * (1 - top[3])).concat([1]);
  const luminance = colour => colour.slice(0, 3).map(c => { c /= 255;
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; })
    .reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
  function behind(el) {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const colour = rgba(getComputedStyle(e).backgroundColor);
      if (colour[3] > 0) { layers.push(colour); }
      if (colour[3] >= 1) { break; }
    }
    return layers.reverse().reduce((below, layer) => over(layer, below), [255, 255, 255, 1]);
  }
  return [...document.querySelectorAll(".ab-demo")].flatMap(demo => [...demo.querySelectorAll("*")]
    .filter(el => el.checkVisibility() &&
                  [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim()))
    .map(el => {
      const background = behind(el);
      const [light, dark] = [luminance(over(rgba(getComputedStyle(el).color), background)),
                             luminance(background)].sort((a, b) => b - a);
      return {demo: demo.dataset.demo, tag: el.tagName.toLowerCase(),
              text: el.textContent.trim().slice(0, 40),
              ratio: Math.round(100 * (light + 0.05) / (dark + 0.05)) / 100};
    }));
}"""

ANSWER_TOGGLES_JS = """() => [...document.querySelectorAll(".cell.tag_hide-input")]
  .map(cell => { const fold = cell.querySelector("details summary");
                 return fold ? fold.innerText.trim() : ""; })"""

LINKS_JS = """() => [...document.querySelectorAll("a[href]")].map(a => a.href)"""

PAGE_TEXT_JS = """() => ({
  title: document.title,
  footer: [...document.querySelectorAll("footer")].map(f => f.innerText).join("\\n"),
  launch: [...document.querySelectorAll("a[href]")].map(a => a.href)
            .filter(h => h.includes("colab.research.google.com") || h.includes("mybinder.org")),
})"""


# The line a stored demo or bertviz view shows until its script runs (for Jupyter, where the
# scripts of a notebook it does not trust do not run).
RUN_HINTS_JS = """() => [...document.querySelectorAll(
    '.ab-run-hint, p[id^="bertviz-"][id$="-hint"]')].filter(p => p.checkVisibility()).length"""

CHECK_CELLS_JS = """() => ({
  cells: [...document.querySelectorAll(".cell.tag_exercise-check")].map(cell => {
    const fold = cell.querySelector("details");
    const parts = [...cell.querySelectorAll(".cell_input, .cell_output")];
    return {folded: !!fold && !fold.open && parts.length > 0 && parts.every(p => fold.contains(p)),
            shown: parts.filter(p => p.checkVisibility()).map(p => p.innerText.trim().slice(0, 80))};
  }),
  hiddenTestsShown: (document.querySelector("main") || document.body).innerText
    .includes("BEGIN HIDDEN TESTS"),
})"""

# What one screen size shows. A box "cuts" an element when the element reaches past the box's
# left or right edge and the box clips (overflow other than visible), or past the window.
SCREEN_JS = r"""() => {
  const width = document.documentElement.clientWidth;
  const describe = el => {
    const where = el.closest(".cell") ? "a cell's " : "";
    return `${where}${el.tagName.toLowerCase()}.${[...el.classList].slice(0, 3).join(".")}: ` +
      JSON.stringify(el.innerText.trim().slice(0, 60));
  };
  function cut(el) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) { return false; }
    if (r.left < -0.5 || r.right > width + 0.5) { return true; }
    for (let box = el.parentElement; box && box !== document.body; box = box.parentElement) {
      if (getComputedStyle(box).overflowX === "visible") { continue; }
      const b = box.getBoundingClientRect();
      if (r.left < b.left - 0.5 || r.right > b.right + 0.5) { return true; }
    }
    return false;
  }
  const demoParts = [...document.querySelectorAll(".ab-demo")].flatMap(demo =>
    [...demo.querySelectorAll("th, td, .ab-message, .ab-prediction, input, label")]
      .map(el => [demo.dataset.demo, el]));
  const scrollers = [...document.querySelectorAll(
      "main div, main pre, main mjx-container, main table, main section")]
    .filter(el => ["auto", "scroll"].includes(getComputedStyle(el).overflowX) &&
                  el.scrollWidth > el.clientWidth + 1);
  return {
    width, scrollWidth: document.documentElement.scrollWidth,
    demoCut: demoParts.filter(([, el]) => cut(el)).map(([demo, el]) =>
      `${demo}: ${el.tagName.toLowerCase()} ${JSON.stringify(el.innerText.trim().slice(0, 40))}`),
    demos: demoParts.length,
    probabilities: [...document.querySelectorAll(".ab-sentence-demo table")]
      .filter(table => (table.caption || {}).textContent === "Probability of each sense")
      .flatMap(table => [...table.querySelectorAll("tbody td:last-child")])
      .map(td => ({text: td.innerText.trim(), cut: cut(td)})),
    viewsCut: [...document.querySelectorAll('div[id^="bertviz-"] svg')].filter(cut).length,
    uncued: scrollers.filter(el => !el.classList.contains("ab-scrolls-x")).map(describe),
    cued: scrollers.length,
    outputsScrolling: [...document.querySelectorAll("main .cell_output pre")]
      .filter(pre => pre.scrollWidth > pre.clientWidth + 1).map(describe),
  };
}"""

# wide_outputs.js marks the boxes that scroll a moment after a resize: wait for it.
SCREEN_SETTLED_JS = """() => [...document.querySelectorAll(
    "main div, main pre, main mjx-container, main table, main section")]
  .every(el => !["auto", "scroll"].includes(getComputedStyle(el).overflowX) ||
               el.scrollWidth <= el.clientWidth + 1 || el.classList.contains("ab-scrolls-x"))"""

TOC_JS = """() => {
  const dialog = document.getElementById("pst-primary-sidebar-modal");
  const sidebar = document.getElementById("pst-primary-sidebar");
  const where = dialog && dialog.open ? dialog : sidebar;
  const links = where ? [...where.querySelectorAll(".bd-docs-nav a[href]")] : [];
  const box = sidebar ? sidebar.getBoundingClientRect() : null;
  return {dialogOpen: !!dialog && dialog.open,
          sidebarShown: !!box && box.width > 50 && box.right > 0 && box.left < innerWidth &&
                        sidebar.checkVisibility({visibilityProperty: true}),
          links: links.filter(a => a.checkVisibility({visibilityProperty: true}) &&
                                   a.getBoundingClientRect().width > 0 &&
                                   a.getBoundingClientRect().right <= innerWidth + 0.5)
                      .map(a => a.href)};
}"""


NEXT_FRAMES_JS = """() => new Promise(done =>
  requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"""

TRANSITIONS_DONE_JS = """() => document.getAnimations()
  .every(a => !(a instanceof CSSTransition) || a.playState !== "running")"""


def _settle(page) -> None:
    """Wait until the page's CSS transitions (the sidebar's slide) have finished."""
    page.evaluate(NEXT_FRAMES_JS)  # a transition starts on the next frame
    try:
        page.wait_for_function(TRANSITIONS_DONE_JS, timeout=SETTLE_MS)
    except PlaywrightTimeoutError:
        pass  # what is still moving is what the tests report


def _visible_toggle(page):
    """The first ``.primary-toggle`` button a reader can see (the theme draws two)."""
    buttons = page.locator(".primary-toggle")
    for index in range(buttons.count()):
        if buttons.nth(index).is_visible():
            return buttons.nth(index)
    return None


def _use_table_of_contents(page, desktop: bool) -> dict:
    """Click the visible navigation button and record what it did.

    On a phone or tablet it must open the sidebar dialog with every page's link (Escape closes
    it); on a desktop the sidebar is open already, and the button hides it and shows it again.
    """
    button = _visible_toggle(page)
    if button is None:
        return {"button": False}
    result = {"button": True, "before": page.evaluate(TOC_JS)}
    button.click()
    _settle(page)
    result["after"] = page.evaluate(TOC_JS)
    if desktop:
        button.click()
    else:
        page.keyboard.press("Escape")
    _settle(page)
    result["again"] = page.evaluate(TOC_JS)
    return result


# A full-page screenshot stops here: the API reference is some 300,000 px tall on a phone, and
# a picture of all of it would take long to make and nobody would look at it.
MAX_SCREENSHOT_PX = 40_000


def _screenshot(page, path: Path) -> None:
    """A screenshot of the whole page, or of its first MAX_SCREENSHOT_PX if it is taller."""
    width, height = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    clip = ({"x": 0, "y": 0, "width": width, "height": MAX_SCREENSHOT_PX}
            if height > MAX_SCREENSHOT_PX else None)
    # JPEG: a third to a half of the time PNG takes for a page this tall (a person looks at it)
    page.screenshot(path=str(path), full_page=True, clip=clip, type="jpeg", quality=80)


def _on_screen(page, site, report: PageReport, width: int, height: int) -> dict:
    """Narrow (or widen) the window to ``width`` x ``height`` and record what the reader sees."""
    page.set_viewport_size({"width": width, "height": height})
    _settle(page)
    try:
        page.wait_for_function(SCREEN_SETTLED_JS, timeout=SETTLE_MS)
    except PlaywrightTimeoutError:
        pass  # the boxes still unmarked are what the test reports
    shown = page.evaluate(SCREEN_JS)
    shown["toc"] = _use_table_of_contents(page, desktop=width >= 992)
    shown["figures"] = page.evaluate(FIGURES_JS)
    if (width, height) == PHONE:
        folder = site.screenshots / "phone"
        folder.mkdir(exist_ok=True)
        shown["screenshot"] = folder / f"{report.docname.replace('/', '__')}.jpg"
        _screenshot(page, shown["screenshot"])
    return shown


def _exercise_demos(page) -> list[dict]:
    """Move each kernel-free demo's control and record what its output showed before and after."""
    results = []
    demos = page.locator(".ab-demo")
    for index in range(demos.count()):
        demo = demos.nth(index)
        demo.scroll_into_view_if_needed()
        name = demo.get_attribute("data-demo") or f"#{index}"
        output = demo.locator(".ab-demo-output")
        result = {"demo": name, "controls": [], "has_output": output.count() > 0}
        if not result["has_output"]:
            results.append(result)
            continue
        sliders = demo.locator('input[type="range"]')
        for s in range(sliders.count()):
            slider = sliders.nth(s)
            before = output.first.inner_text()
            at_max = slider.input_value() == slider.get_attribute("max")
            slider.focus()
            page.keyboard.press("Home" if at_max else "End")  # a reader's key press
            after = output.first.inner_text()
            result["controls"].append({"control": f"slider {s}", "changed": after != before})
        boxes = demo.locator('input[type="text"]')
        for s in range(boxes.count()):
            before = output.first.inner_text()
            boxes.nth(s).focus()
            page.keyboard.press("End")
            page.keyboard.type(" the")  # a reader typing one more word
            after = output.first.inner_text()
            result["controls"].append({"control": f"text box {s}", "changed": after != before})
        cells = demo.locator(".ab-mask-cell")
        if cells.count():
            # Unblocking a blocked pair changes its row, unless that key's weight is too small
            # to show in the printed digits; so try a few cells, each a reader's mouse click.
            order = sorted(
                range(cells.count()),
                key=lambda c: cells.nth(c).get_attribute("aria-pressed") != "false",
            )
            changed = False
            for c in order[:6]:
                before = output.first.inner_text()
                cells.nth(c).click()
                changed = output.first.inner_text() != before
                if changed:
                    break
            result["controls"].append({"control": "mask cells", "changed": changed})
        results.append(result)
    return results


# Code is most of a page's elements (some 8,000 highlighted spans in chapter 15, the signatures
# of the API reference) and most of axe's time, in its colour-contrast rule. Every span of one
# token kind, in code on the same background, has the same contrast: the same colour and font,
# and the same backgrounds behind it. SAME_CONTRAST_JS marks each such element whose (colour,
# font size, font weight, text shadow, and every background colour, image and opacity behind
# it up to the first opaque background) was seen before; only elements in normal flow (static,
# inline) count. The contrast rule then runs with the marked ones hidden (`visibility: hidden`
# keeps the layout), so it checks one element of each kind, on the page as drawn; every other
# rule runs on the whole page, with nothing hidden. Checked on chapter 15 and the API page: the
# same findings as one scan of everything, in about half the time.
SAME_CONTRAST_JS = """() => {
  const seen = new Set();
  const marked = [];
  for (const el of document.querySelectorAll("pre span, code, code span, .sig span, .sig em")) {
    const own = getComputedStyle(el);
    if (own.position !== "static" || own.display !== "inline") continue;
    const key = [own.color, own.fontSize, own.fontWeight, own.textShadow];
    for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
      const style = node === el ? own : getComputedStyle(node);
      key.push(style.backgroundColor, style.backgroundImage, style.opacity);
      if (/^rgb\\(/.test(style.backgroundColor) && style.backgroundImage === "none") break;
    }
    const text = key.join("|");
    if (seen.has(text)) marked.push(el); else seen.add(text);
  }
  window.__abSameContrast = marked.map(el => [el, el.style.visibility]);
  return marked.length;
}"""
HIDE_SAME_CONTRAST_JS = """hide => window.__abSameContrast.forEach(([el, before]) => {
  el.style.visibility = hide ? "hidden" : before;
})"""


def _run_axe(page, include: str | None = None) -> list[dict]:
    """Run axe-core (shipped by axe-playwright-python) and keep serious and critical findings.

    ``include``: a CSS selector to scan only what matches it (the whole document by default).
    Every rule runs on every element, except that colour contrast skips the elements of code
    whose contrast equals one it checks (``SAME_CONTRAST_JS``).
    """
    # axe registers itself as an anonymous AMD module when require.js (bertviz) is on the
    # page; hide `define` while it loads so it lands on window.axe.
    page.evaluate("() => { window.__abDefine = window.define; window.define = undefined; }")
    page.evaluate(Axe().axe_script)
    page.evaluate("() => { window.define = window.__abDefine; }")
    # preload: false stops axe fetching the stylesheets itself; it resolves the theme's
    # `@import "../basic.css"` against the page instead of the stylesheet and asks for a file
    # that does not exist.
    scan = """async ([include, rules]) => (await axe.run(include ? {include: [[include]]} : document,
      {resultTypes: ['violations'], preload: false, ...rules})).violations"""
    violations = page.evaluate(scan, [include, {"rules": {"color-contrast": {"enabled": False}}}])
    page.evaluate(SAME_CONTRAST_JS)
    page.evaluate(HIDE_SAME_CONTRAST_JS, True)
    try:
        violations += page.evaluate(
            scan, [include, {"runOnly": {"type": "rule", "values": ["color-contrast"]}}])
    finally:
        page.evaluate(HIDE_SAME_CONTRAST_JS, False)
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "nodes": [" ".join(map(str, n["target"])) for n in v["nodes"]][:5],
        }
        for v in violations
        if v["impact"] in ("serious", "critical")
    ]


def _context(browser, **options):
    """A browser context whose every step may take STEP_MS on a busy machine."""
    context = browser.new_context(**options)
    context.set_default_timeout(STEP_MS)
    context.set_default_navigation_timeout(STEP_MS)
    return context


def visit(browser, site, docname: str) -> PageReport:
    """Load one page with the network closed and record everything the tests check."""
    url = urljoin(site.base_url, f"{docname}.html")
    report = PageReport(docname=docname, url=url)
    local = urlsplit(site.base_url).netloc
    context = _context(browser, viewport={"width": DESKTOP[0], "height": DESKTOP[1]})
    finished = []

    def route(route_obj):
        request_url = route_obj.request.url
        if urlsplit(request_url).netloc == local:
            route_obj.continue_()
        else:
            report.blocked.append(request_url)
            route_obj.abort("blockedbyclient")

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and report.console_errors.append(m.text))
    page.on("pageerror", lambda e: report.console_errors.append(f"uncaught: {e}"))
    page.on("requestfinished", lambda request: finished.append(request))

    def on_failed(request):
        if urlsplit(request.url).netloc == local:
            report.failed.append(f"{request.url} ({request.failure})")

    page.on("requestfailed", on_failed)

    def on_response(response):
        if response.status >= 400 and urlsplit(response.url).netloc == local:
            report.failed.append(f"{response.url} (HTTP {response.status})")

    page.on("response", on_response)
    try:
        response = page.goto(url, wait_until="load")
        report.status = response.status if response else None
        # Wait for MathJax, the widget manager and bertviz to finish drawing. What is still
        # missing after WAIT_MS is what the tests report, so a timeout is not an error here.
        for ready in (MATH_READY_JS, WIDGETS_READY_JS, BERTVIZ_READY_JS):
            try:
                page.wait_for_function(ready, timeout=WAIT_MS)
            except PlaywrightTimeoutError:
                pass
        page.evaluate(MATH_TYPESET_JS)
        page.evaluate("document.fonts.ready.then(() => true)")
        report.math = page.evaluate(MATH_JS)
        report.widgets = page.evaluate(WIDGETS_JS)
        report.images = page.evaluate(IMAGES_JS)
        report.links = page.evaluate(LINKS_JS)
        texts = page.evaluate(PAGE_TEXT_JS)
        report.title, report.footer, report.launch_links = (
            texts["title"],
            texts["footer"],
            texts["launch"],
        )
        report.axe_violations = _run_axe(page)
        report.screenshot = site.screenshots / f"{docname.replace('/', '__')}.jpg"
        _screenshot(page, report.screenshot)
        # Interacting changes the page, so it comes after the scan and the screenshot.
        report.bertviz = page.evaluate(BERTVIZ_JS, False)
        report.bertviz_outputs = page.evaluate(BERTVIZ_OUTPUTS_JS)
        if any(view["missing"] for view in report.bertviz):
            report.bertviz = page.evaluate(BERTVIZ_JS, True)
        report.demos = _exercise_demos(page)
        page.wait_for_load_state("networkidle")
        sizes = []
        for request in finished:
            size = request.sizes()
            sizes.append((size["responseBodySize"] + size["responseHeadersSize"], request.url))
        report.transfer_bytes = sum(size for size, _ in sizes)
        report.largest = [f"{size / 1e3:.0f} kB {url}" for size, url in sorted(sizes)[::-1][:6]]
        report.run_hints_shown = page.evaluate(RUN_HINTS_JS)
        folds = page.evaluate(CHECK_CELLS_JS)
        report.check_cells, report.hidden_tests_shown = folds["cells"], folds["hiddenTestsShown"]
        # The same page at every screen size, widest first, without reloading it.
        for width, height in (DESKTOP, *SMALL_SCREENS):
            report.screens[width] = _on_screen(page, site, report, width, height)
        report.answer_toggles = page.evaluate(ANSWER_TOGGLES_JS)
        # Printed, then in dark mode: both change the page, so they come last.
        page.set_viewport_size({"width": PRINT_PAGE[0], "height": PRINT_PAGE[1]})
        page.emulate_media(media="print")
        report.printed = page.evaluate(PRINT_JS)
        page.emulate_media(media="screen")
        page.evaluate(DARK_MODE_JS)
        report.dark_contrast = page.evaluate(DEMO_CONTRAST_JS)
        if report.demos:  # axe's own contrast check, on the demos, in dark mode
            report.dark_axe_violations = _run_axe(page, include=".ab-demo")
    finally:
        context.close()
    return report


@pytest.fixture(scope="session")
def page_report(browser, site):
    """``page_report(docname)``: the report of that page's visit (each page visited once)."""
    cache: dict[str, PageReport | Exception] = {}

    def get(docname: str) -> PageReport:
        if docname not in cache:
            try:
                cache[docname] = visit(browser, site, docname)
            except Exception as error:  # noqa: BLE001 - every test of this page reports it
                cache[docname] = error
        result = cache[docname]
        if isinstance(result, Exception):
            raise AssertionError(f"visiting {docname} failed: {result}") from result
        return result

    return get


# --------------------------------------------------------------------------------------
# The tests, one property per test, each over every page.

pages = pytest.mark.parametrize("docname", PAGES)


@pages
def test_page_loads_and_is_screenshotted(page_report, docname):
    report = page_report(docname)
    assert report.status == 200, f"{report.url} answered {report.status}"
    assert report.screenshot is not None and report.screenshot.stat().st_size > 0
    phone = report.screens[PHONE[0]]["screenshot"]
    assert phone.stat().st_size > 0 and phone.parent.parent == report.screenshot.parent


@pages
def test_no_request_leaves_the_site(page_report, docname):
    report = page_report(docname)
    assert report.blocked == [], (
        f"{docname} asked another host for: {report.blocked}. Serve it from _static/npm/ "
        "(see _ext/static_site.py)."
    )
    assert report.failed == [], f"{docname}: these local requests failed: {report.failed}"


@pages
def test_no_javascript_errors(page_report, docname):
    report = page_report(docname)
    assert report.console_errors == [], f"{docname} logged errors: {report.console_errors}"


@pages
def test_math_is_rendered(page_report, docname):
    math = page_report(docname).math
    assert math["unrendered"] == [], f"{docname}: MathJax left these untypeset: {math['unrendered']}"
    assert math["rendered"] >= math["sources"], f"{docname}: MathJax output missing: {math}"
    assert math["errors"] == [], f"{docname}: TeX errors: {math['errors']}"
    assert math["raw"] == [], f"{docname}: raw $$ left in the text: {math['raw']}"
    assert math["backslashes"] == [], (
        f"{docname}: MathJax shows these backslashes as text: {math['backslashes']} "
        "(inside \\text{...} write head_dim, not head\\_dim)"
    )


@pages
def test_attention_views_draw_their_tokens(page_report, docname):
    report = page_report(docname)
    assert len(report.bertviz) == report.bertviz_outputs, (
        f"{docname}: {report.bertviz_outputs} bertviz outputs but {len(report.bertviz)} views "
        "found by their id (attention_book.viz names them bertviz-<element_id>)"
    )
    for view in report.bertviz:
        assert view["tokens"], f"{docname}: no tokens found for the bertviz view {view['id']}"
        assert view["missing"] == [], (
            f"{docname}: the bertviz view {view['id']} does not show the tokens "
            f"{view['missing']} (visible labels: {view['labels']})"
        )


@pages
def test_stored_widgets_render(page_report, docname):
    unrendered = [w["model_id"] for w in page_report(docname).widgets if not w["rendered"]]
    assert unrendered == [], f"{docname}: these stored widgets did not render: {unrendered}"


@pages
def test_demos_change_when_their_control_moves(page_report, docname):
    for demo in page_report(docname).demos:
        assert demo["has_output"], f"{docname}: demo {demo['demo']} has no .ab-demo-output"
        assert demo["controls"], f"{docname}: demo {demo['demo']} has no control to move"
        frozen = [c["control"] for c in demo["controls"] if not c["changed"]]
        assert frozen == [], (
            f"{docname}: moving {frozen} of demo {demo['demo']} did not change what it shows"
        )


@pages
def test_stored_demos_and_views_lose_their_run_hint(page_report, site, docname):
    """Every stored demo and bertviz view carries the line "Run this cell ..." for Jupyter, and
    on the website, where their scripts run, none of those lines is left on screen."""
    report = page_report(docname)
    source = (site.html_dir / f"{docname}.html").read_text(encoding="utf-8")
    hints = source.count('class="ab-run-hint"') + len(re.findall(r'<p id="bertviz-[\w-]+-hint"', source))
    assert hints == len(report.demos) + report.bertviz_outputs, (
        f"{docname}: {hints} run hints for {len(report.demos)} demos and "
        f"{report.bertviz_outputs} bertviz views (re-execute the chapter?)")
    assert report.run_hints_shown == 0, f"{docname}: {report.run_hints_shown} run hints still shown"


_GENERIC_ALT = re.compile(
    r"^(image|img|figure|fig|picture|photo|graphic|plot|chart|output|png|svg|untitled|alt)?\s*\d*$",
    re.IGNORECASE,
)


@pages
def test_images_have_meaningful_alt_text(page_report, docname):
    for image in page_report(docname).images:
        alt = (image["alt"] or "").strip()
        name = Path(urlsplit(image["src"] or "").path).name
        assert image["loaded"], f"{docname}: the image {image['src']} did not load"
        assert not _GENERIC_ALT.match(alt) and alt != name and not re.search(
            r"\.(png|jpe?g|svg|gif)$", alt, re.IGNORECASE
        ), f"{docname}: the image {image['src']} has no meaningful alt text (alt={alt!r})"


@pages
def test_no_serious_accessibility_violations(page_report, docname):
    violations = page_report(docname).axe_violations
    assert violations == [], f"{docname}: axe-core found: {json.dumps(violations, indent=1)}"


class _Anchors(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.anchors: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key == "id" or (tag == "a" and key == "name"):
                self.anchors.add(value or "")


@functools.cache
def _anchors_in(path: Path) -> frozenset[str]:
    parser = _Anchors()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.anchors)


@pages
def test_internal_links_and_anchors_resolve(page_report, site, docname):
    report = page_report(docname)
    local = urlsplit(site.base_url).netloc
    broken = []
    for href in report.links:
        parts = urlsplit(href)
        if parts.scheme not in ("http", "https") or parts.netloc != local:
            continue
        path = unquote(parts.path).lstrip("/") or "index.html"
        target = site.html_dir / path
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{href} (no such file)")
        elif parts.fragment and target.suffix == ".html":
            if unquote(parts.fragment) not in _anchors_in(target):
                broken.append(f"{href} (no such anchor)")
    assert broken == [], f"{docname} links to: {broken}"


@pages
def test_page_weight_is_under_budget(page_report, docname):
    size = page_report(docname).transfer_bytes
    assert 0 < size < MAX_PAGE_BYTES, (
        f"{docname} transfers {size / 1e6:.2f} MB, more than {MAX_PAGE_BYTES / 1e6:.0f} MB; "
        f"the largest responses: {page_report(docname).largest}"
    )


@pages
def test_title_and_footer_are_the_books_own(page_report, docname):
    report = page_report(docname)
    config = book_config()
    assert report.title.endswith(config["title"]), f"{docname}: title {report.title!r}"
    assert config["author"] in report.footer, f"{docname}: footer {report.footer!r}"
    assert str(config["copyright"]) in report.footer, f"{docname}: footer {report.footer!r}"
    for template_text in ("Jupyter Book Community", "Executable Books", "The Jupyter Book"):
        assert template_text not in report.footer, f"{docname}: template footer {report.footer!r}"


@pytest.mark.parametrize("docname", [p for p in PAGES if (ROOT / f"{p}.ipynb").is_file()])
def test_chapters_have_colab_and_binder_buttons(page_report, docname):
    config = book_config()
    repo = urlsplit(config["repository"]["url"]).path.strip("/")
    branch = config["repository"]["branch"]
    book_path = (config["repository"].get("path_to_book") or "").strip("/")
    # The buttons open the practice version (answers taken out), not the chapter itself.
    practice = f"practice/{docname.split('/')[-1]}.ipynb"
    notebook = "/".join(p for p in (book_path, practice) if p)
    expected = [
        f"https://colab.research.google.com/github/{repo}/blob/{branch}/{notebook}",
        f"https://mybinder.org/v2/gh/{repo}/{branch}?urlpath=tree/{notebook}",
    ]
    links = page_report(docname).launch_links
    for url in expected:
        assert url in links, f"{docname}: no launch button to {url} (found {links})"


# --------------------------------------------------------------------------------------
# Every screen: the desktop (1280 x 900), a tablet (768 x 1024) and a phone (390 x 844).


def _page_url(href: str) -> str:
    return href.split("#", 1)[0]


@pages
def test_a_visible_button_opens_the_table_of_contents(page_report, site, docname):
    every_page = {urljoin(site.base_url, f"{page}.html") for page in PAGES}
    for width, shown in page_report(docname).screens.items():
        toc = shown["toc"]
        assert toc["button"], f"{docname} at {width} px: no visible button opens the contents"
        if width >= 992:  # the sidebar is there; the button hides it, and shows it again
            assert toc["before"]["sidebarShown"] and not toc["before"]["dialogOpen"], (docname, toc)
            assert not toc["after"]["sidebarShown"], f"{docname} at {width} px: {toc}"
            assert toc["again"]["sidebarShown"], f"{docname} at {width} px: {toc}"
            continue
        assert not toc["before"]["dialogOpen"] and not toc["before"]["sidebarShown"], (docname, toc)
        assert toc["after"]["dialogOpen"], (
            f"{docname} at {width} px: the navigation button did not open the table of contents "
            "(see _static/primary_toggle.js)")
        missing = every_page - {_page_url(href) for href in toc["after"]["links"]}
        assert not missing, f"{docname} at {width} px: the contents lack links to {sorted(missing)}"
        assert not toc["again"]["dialogOpen"], f"{docname} at {width} px: Escape did not close it"


@pages
def test_no_page_is_wider_than_the_screen(page_report, docname):
    for shown in page_report(docname).screens.values():
        assert shown["scrollWidth"] <= shown["width"], (
            f"{docname} is {shown['scrollWidth']} px wide on a {shown['width']} px screen: "
            "something does not wrap or scroll in its own box")


@pages
def test_outputs_wrap_and_boxes_that_scroll_show_a_cue(page_report, docname):
    for width, shown in page_report(docname).screens.items():
        assert shown["outputsScrolling"] == [], (
            f"{docname} at {width} px: these printed outputs scroll sideways instead of "
            f"wrapping: {shown['outputsScrolling']}")
        assert shown["uncued"] == [], (
            f"{docname} at {width} px: these boxes scroll sideways with no cue (the fade of "
            f"_static/wide_outputs.js): {shown['uncued']}")


@pages
def test_demos_and_attention_views_are_on_screen(page_report, docname):
    for width, shown in page_report(docname).screens.items():
        assert shown["demoCut"] == [], f"{docname} at {width} px: cut off: {shown['demoCut']}"
        if width >= 768:  # on a phone the widest view may scroll, with its cue
            assert shown["viewsCut"] == 0, (
                f"{docname} at {width} px: {shown['viewsCut']} attention views do not fit their "
                "box (_static/wide_outputs.js scales them)")


SMALLEST_TEXT_CSS_PX = 9.0


def _figure_text() -> dict[str, dict]:
    """Each figure's smallest text (points) and dpi, by PNG SHA-256 (tools/figure_text.py)."""
    table = json.loads((ROOT / "_ext" / "figure_text.json").read_text(encoding="utf-8"))
    return table["figures"]


def _png_dpi(data: bytes) -> float | None:
    """The dpi a PNG records in its pHYs chunk (pixels per metre), None without one."""
    at = 8
    while at + 8 <= len(data):
        length = int.from_bytes(data[at:at + 4], "big")
        kind = data[at + 4:at + 8]
        if kind == b"pHYs" and data[at + 16] == 1:  # unit 1: the metre
            return round(int.from_bytes(data[at + 8:at + 12], "big") * 0.0254, 2)
        if kind == b"IDAT":
            return None
        at += 12 + length
    return None


def test_every_figure_is_readable_on_a_phone(page_report, site):
    """On a 390 px phone no figure's smallest text is under 9 CSS px, counted over the book.

    A figure's smallest text is ``pt`` points drawn at ``dpi`` dots per inch: ``pt * dpi / 72``
    pixels of its PNG (tools/figure_text.py measured both when it ran the chapters; the dpi is
    also the one the PNG records). Shown ``width`` CSS px wide, the PNG's ``natural`` pixels are
    scaled by ``width / natural``, so that text is ``pt * dpi / 72 * width / natural`` CSS px.
    No figure may be narrower than half the column either: a figure that small is a thumbnail.
    """
    measured = _figure_text()
    too_small, unmeasured, narrow, figures = [], [], [], 0
    smallest = None
    for docname in PAGES:
        for figure in page_report(docname).screens[PHONE[0]]["figures"]:
            figures += 1
            data = (site.html_dir / "_images" / figure["file"]).read_bytes()
            row = measured.get(hashlib.sha256(data).hexdigest())
            if row is None:
                unmeasured.append(f"{docname}: {figure['file']}")
                continue
            assert _png_dpi(data) == row["dpi"], (docname, figure["file"], _png_dpi(data), row)
            text_px = row["smallest_pt"] * row["dpi"] / 72 * figure["width"] / figure["natural"]
            smallest = text_px if smallest is None else min(smallest, text_px)
            if text_px < SMALLEST_TEXT_CSS_PX:
                too_small.append(f"{docname} figure {row['index']}: {row['smallest_pt']} pt "
                                 f"text ({row['smallest_text']!r}) at {text_px:.1f} px, the figure "
                                 f"{figure['width']:.0f} of its {figure['natural']} px wide")
            if figure["width"] < figure["column"] / 2:
                narrow.append(f"{docname}: {figure}")
    assert figures >= 50, f"only {figures} figures on the phone: were the pages' images loaded?"
    assert unmeasured == [], (
        f"{len(unmeasured)} of {figures} figures have no measured text size (a chapter's figure "
        "changed?): run tools/figure_text.py on their chapters. " + ", ".join(unmeasured))
    assert too_small == [], (
        f"{len(too_small)} of {figures} figures show text under {SMALLEST_TEXT_CSS_PX} CSS px on "
        f"a {PHONE[0]} px phone: {too_small}")
    assert narrow == [], (
        f"{len(narrow)} of {figures} figures are narrower than half the {PHONE[0]} px phone's "
        f"column: {narrow}")
    assert smallest is not None and smallest >= SMALLEST_TEXT_CSS_PX


@pages
def test_every_figure_links_to_its_full_size_image(page_report, docname):
    """On every screen: a figure of the article is a link to its own image file."""
    unlinked = [image["src"] for image in page_report(docname).images
                if image["content"] and not image["linked"]]
    assert unlinked == [], f"{docname}: these figures are not links to their image: {unlinked}"


def test_one_tap_fits_a_wide_figure_and_another_brings_it_back(browser, site):
    """On a touch phone, chapter 3's 1584 px heatmaps show at their readable width and scroll;
    a tap fits the whole figure to the column, a second tap brings the readable width back,
    and neither leaves the page (_static/figure_fit.js)."""
    context = _context(browser, viewport={"width": PHONE[0], "height": PHONE[1]},
                       is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        url = urljoin(site.base_url, "chapters/03_trainable_qkv.html")
        page.goto(url, wait_until="load")
        page.wait_for_function("() => [...document.querySelectorAll('a.ab-full-size img')]"
                               ".every(img => img.complete && img.naturalWidth > 0)")
        box = page.locator("article.bd-article div.ab-figure.ab-figure-wide").first
        box.wait_for()
        image = box.locator("a.ab-full-size img")
        width_js = "img => img.getBoundingClientRect().width"
        readable, column = image.evaluate(width_js), box.evaluate("box => box.clientWidth")
        assert readable > column + 1, (readable, column)  # wider than its box: it scrolls
        image.scroll_into_view_if_needed()
        image.tap()  # a reader taps the picture
        page.wait_for_function("box => box.classList.contains('ab-fit')", arg=box.element_handle())
        fitted = image.evaluate(width_js)
        assert fitted <= column + 1 and page.url == url, (fitted, column, page.url)
        image.tap()
        page.wait_for_function("box => !box.classList.contains('ab-fit')", arg=box.element_handle())
        assert image.evaluate(width_js) == readable and page.url == url
    finally:
        context.close()


@pages
def test_printed_code_lines_stay_on_the_page(page_report, docname):
    """With the print stylesheet on A4 every line of code wraps: none is cut at the page edge."""
    printed = page_report(docname).printed
    assert printed["cut"] == [], (
        f"{docname}: printed on A4 ({printed['width']} px), these lines of code run past the "
        f"page: {printed['cut'][:5]} (of {len(printed['cut'])}; see @media print in custom.css)")


def test_printing_was_tested_on_code(page_report):
    assert sum(page_report(docname).printed["code"] for docname in PAGES) > 500


@pages
def test_demo_text_is_readable_in_dark_mode(page_report, docname):
    """Every text of a demo reaches 4.5:1 against its background in dark mode (WCAG AA)."""
    texts = page_report(docname).dark_contrast
    faint = [text for text in texts if text["ratio"] < 4.5]
    assert faint == [], f"{docname}: in dark mode these demo texts are below 4.5:1: {faint}"


@pages
def test_demos_pass_axe_in_dark_mode(page_report, docname):
    """axe-core's scan (its colour-contrast rule included) of the demos, in dark mode."""
    violations = page_report(docname).dark_axe_violations
    assert violations == [], f"{docname}: in dark mode axe finds in the demos: {violations}"


def test_dark_mode_was_measured_on_every_demo_caption(page_report):
    """The captions the trial measured at about 1.7:1 in dark mode ("Probability of each
    sense", "Mask (1 = may attend)", "softmax(scores / τ) for each key") reach 4.5:1."""
    captions = [text for docname in PAGES for text in page_report(docname).dark_contrast
                if text["tag"] == "caption"]
    demos = {text["demo"] for text in captions}
    assert {"temperature", "mask-editor", "ambiguity"} <= demos, demos
    faint = [caption for caption in captions if caption["ratio"] < 4.5]
    assert faint == [], f"demo captions below 4.5:1 in dark mode: {faint}"


@pytest.mark.parametrize("docname", [p for p in PAGES if (ROOT / f"{p}.ipynb").is_file()])
def test_answer_toggles_say_what_they_hide(page_report, docname):
    notebook = json.loads((ROOT / f"{docname}.ipynb").read_text(encoding="utf-8"))
    answers = sum(map(_exercise_checks().is_answer_cell, notebook["cells"]))
    toggles = page_report(docname).answer_toggles
    assert toggles.count("Show the model answer") == answers > 0, (docname, answers, toggles)


# A page's result gets a snippet (p.context) once its page is fetched; a result that is an
# entry of the API reference (a function, a class) gets Sphinx's description of it instead
# ("Python function, in The package: API reference"), and its title is the entry's name.
SEARCH_DONE_JS = """() => /Search finished/.test((document.querySelector("#search-results") ||
    document.body).innerText) && [...document.querySelectorAll("#search-results li")]
    .every(item => item.querySelector("p.context") || item.querySelector(":scope > span"))"""


def _search(page, site, query: str) -> dict[str, str]:
    """{page: its snippet} for the pages found, and {page#entry: its name} for API entries."""
    page.goto(urljoin(site.base_url, f"search.html?q={query}"), wait_until="load")
    page.wait_for_function(SEARCH_DONE_JS)
    return dict(page.evaluate("""() => [...document.querySelectorAll("#search-results li")]
        .map(item => { const link = item.querySelector("a"), snippet = item.querySelector("p.context");
          return snippet ? [link.getAttribute("href").split("#")[0], snippet.innerText]
                         : [link.getAttribute("href"), link.innerText]; })"""))


def test_search_snippets_quote_the_sentence_with_the_word(browser, site):
    """'rotary' is stemmed to 'rotari', which Sphinx's own snippet never finds: the snippet
    must be a sentence of chapter 12 with the word, not the page's buttons or contents list.
    The API reference's entries are found by name (rotary_embedding)."""
    context = _context(browser, viewport={"width": DESKTOP[0], "height": DESKTOP[1]})
    try:
        page = context.new_page()
        snippets = _search(page, site, "rotary")
        chapter = snippets.get("chapters/12_positions_in_attention.html", "")
        assert re.search(r"\brotary\b", chapter, re.I) and len(chapter) > 40, snippets
        assert "api.html#attention_book.positions.rotary_embedding" in snippets, snippets
        for snippet in snippets.values():
            assert "rotary" in snippet.lower() and not re.match(r"\W*(Binder|Repository)", snippet), (
                snippets)
        snippets = _search(page, site, "softmax temperature")
        assert snippets and all("temperature" in s.lower() or "softmax" in s.lower()
                                for s in snippets.values()), snippets
        assert not any("\\(" in s or "\\sqrt" in s for s in snippets.values()), snippets
    finally:
        context.close()


def test_chapter_9_demo_shows_every_probability_on_every_screen(page_report):
    report = page_report("chapters/09_training_attention")
    for width, shown in report.screens.items():
        probabilities = shown["probabilities"]
        assert len(probabilities) >= 2, f"at {width} px the demo shows no probabilities"
        assert all(re.fullmatch(r"[01]\.\d{3}", p["text"]) for p in probabilities), probabilities
        assert [p for p in probabilities if p["cut"]] == [], f"at {width} px: {probabilities}"


def _exercise_checks():
    spec = importlib.util.spec_from_file_location(
        "exercise_checks", ROOT / "_ext" / "exercise_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("docname", [p for p in PAGES if (ROOT / f"{p}.ipynb").is_file()])
def test_exercise_checks_are_folded_with_their_answers(page_report, docname):
    """A check cell's hidden tests and stored "Correct: ..." give the answer away: on the
    website each one is folded (_ext/exercise_checks.py), and none shows unfolded."""
    notebook = json.loads((ROOT / f"{docname}.ipynb").read_text(encoding="utf-8"))
    expected = sum(map(_exercise_checks().is_check_cell, notebook["cells"]))
    report = page_report(docname)
    assert expected > 0 and len(report.check_cells) == expected, (
        f"{docname}: {expected} check cells in the notebook, {len(report.check_cells)} folded "
        "as checks on the page")
    for index, cell in enumerate(report.check_cells):
        assert cell["folded"] and cell["shown"] == [], f"{docname}: check cell {index}: {cell}"
    assert not report.hidden_tests_shown, f"{docname}: hidden tests are visible"


def test_book_has_the_temperature_and_mask_demos(page_report):
    """Both kernel-free demos are on the website; the tests above prove they react."""
    found = {demo["demo"] for docname in PAGES for demo in page_report(docname).demos}
    missing = {"temperature", "mask-editor"} - found
    assert not missing, f"no page in _toc.yml has the kernel-free demos {sorted(missing)}"


# --------------------------------------------------------------------------------------
# The build step itself, without a browser: bertviz's CDN addresses become local files.


def _static_site():
    spec = importlib.util.spec_from_file_location(
        "static_site", ROOT / "_ext" / "static_site.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bertviz_output_is_rewritten_to_local_files_and_labelled_menus(site):
    import torch
    from bertviz import head_view, model_view

    attention = (torch.full((1, 1, 2, 2), 0.5),)
    module = _static_site()
    for view in (head_view, model_view):
        markup = view(attention, ["a", "b"], html_action="return").data
        assert "cdnjs.cloudflare.com" in markup  # the rewrite has something to do
        local = module.label_bertviz_menus(module.rewrite_cdn_urls(markup, "_static/"))
        assert re.findall(r"<select[^>]*>", local) == re.findall(
            r"<select[^>]*aria-label=[^>]*>", local
        ), "every bertviz menu needs an accessible name"
        assert "cdnjs" not in local
        assert not module._EXTERNAL_RESOURCE.search(local)
        for address in re.findall(r"_static/npm/[\w./-]+", local):
            file = address if address.endswith(".js") else f"{address}.js"
            assert (site.html_dir / file).is_file(), f"{file} is not in the built site"
