"""Make the static website stand on its own: local libraries, no CDN, markup that passes axe.

Three things on the book's pages would otherwise load JavaScript from public CDNs, so with
the network blocked (a school proxy, a CDN outage, reading offline) they would stay blank:

* MathJax, which Sphinx loads from jsDelivr by default;
* the ipywidgets HTML manager, which myst-nb loads (with require.js) from jsDelivr and cdnjs
  to render the widget state stored in a notebook;
* bertviz's attention views, whose stored output loads require.js, d3 and jQuery from cdnjs.

The libraries come from npm: ``package.json`` and ``package-lock.json`` at the repository root
pin them, and ``npm ci`` (run by ``make book`` and ``make test``) installs them into
``node_modules/``. This extension then

1. points Sphinx's ``mathjax_path`` and myst-nb's ``nb_ipywidgets_js`` at the local copies
   (``config-inited``), so this file is the one place that names them;
2. rewrites the CDN addresses inside stored notebook outputs (raw HTML such as bertviz's
   ``<script src=...>`` and its ``require.config`` paths) to page-relative local paths
   (``doctree-resolved``), and warns about any other external script or stylesheet it finds,
   so a ``-W`` build fails instead of publishing a page that needs the network;
3. copies the needed files, with each package's licence, into ``_static/npm/``
   (``build-finished``).

It also fixes what the browser tests found wrong in markup the book does not write itself:
bertviz's unlabelled ``<select>`` menus get an ``aria-label``; ipywidgets get a stand-in for
MathJax 2's ``MathJax.Hub.Queue`` (they call it to typeset labels and threw under MathJax 3)
and their slider handles get the widget's label as accessible name; the bibliography's entries
get the ``listitem`` role their list needs; the theme gets a valid default colour mode (an
empty one logs a console error on a first visit), and a script that an extension registers
twice is written once (sphinx-thebe's ``const`` declarations threw on the second copy).

``tests/test_browser.py`` proves the result in Chromium with every non-local request blocked.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.osutil import relative_uri

logger = logging.getLogger(__name__)

VENDOR = "npm"  # the folder under _static/ that holds the copies (the theme owns vendor/)

# What to copy: folder under _static/npm/ -> (npm package, folder inside it, glob patterns).
COPIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "requirejs": ("requirejs", "", ("require.js",)),
    "d3": ("d3", "dist", ("d3.min.js",)),
    "jquery": ("jquery", "dist", ("jquery.min.js",)),
    # embed.js renders the standard widgets without require.js (1.9 MB, not the 3.6 MB AMD
    # bundle); the fonts are the icons its CSS refers to (woff2, with woff and ttf fallbacks).
    "html-manager": (
        "@jupyter-widgets/html-manager",
        "dist",
        ("embed.js", "embed.js.LICENSE.txt", "*.woff2", "*.woff", "*.ttf"),
    ),
    # The TeX-to-HTML component, plus what it loads on demand: TeX extensions (autoload),
    # its fonts, and the accessibility and menu components a reader can switch on.
    "mathjax": (
        "mathjax",
        "es5",
        (
            "tex-chtml.js",
            "input/tex/extensions/*",
            "output/chtml/fonts/woff-v2/*",
            "a11y/*",
            "ui/*",
            "sre/*",
        ),
    ),
}

MATHJAX_PATH = f"{VENDOR}/mathjax/tex-chtml.js"  # relative to _static/, as Sphinx wants it
WIDGET_MANAGER_PATH = f"{VENDOR}/html-manager/embed.js"

# CDN addresses found in stored outputs -> the local file (under _static/npm/), without
# ".js": require.config paths name modules without it, <script src> names carry it.
_CDN_REWRITES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"https?://cdnjs\.cloudflare\.com/ajax/libs/require\.js/[\w.-]+/require(?:\.min)?"),
        "requirejs/require",
    ),
    (re.compile(r"https?://cdnjs\.cloudflare\.com/ajax/libs/d3/[\w.-]+/d3\.min"), "d3/d3.min"),
    (
        re.compile(r"https?://cdnjs\.cloudflare\.com/ajax/libs/jquery/[\w.-]+/jquery\.min"),
        "jquery/jquery.min",
    ),
]

# After rewriting, any of these in raw HTML would still make the browser leave the site.
_EXTERNAL_RESOURCE = re.compile(
    r"""<(?:script|img|iframe|audio|video|source)\b[^>]*\bsrc\s*=\s*["']?(?:https?:)?//"""
    r"""|<link\b[^>]*\bhref\s*=\s*["']?(?:https?:)?//"""
    r"""|@import\s+(?:url\()?["']?(?:https?:)?//"""
    r"""|["'](?:https?:)?//(?:cdnjs\.cloudflare\.com|cdn\.jsdelivr\.net|unpkg\.com"""
    r"""|ajax\.googleapis\.com|code\.jquery\.com|d3js\.org)/""",
    re.IGNORECASE,
)


# bertviz writes its menus as `Layer: <select id="layer">` with no label element.
_BERTVIZ_SELECTS = {
    re.compile(r'<select id="layer"(?![^>]*aria-label)'): '<select id="layer" aria-label="Layer"',
    re.compile(r'<select id="filter"(?![^>]*aria-label)'): (
        '<select id="filter" aria-label="Attention"'
    ),
}

# Two fixes for ipywidgets on a static page, run before the widget manager draws (on "load"):
# * its controls typeset their labels with MathJax 2's `MathJax.Hub.Queue`, which MathJax 3
#   lacks, so a labelled widget threw "Cannot read properties of undefined (reading 'Queue')";
# * its sliders draw their handle as a div with role="slider" and no accessible name; name it
#   after the widget's description (or its kind).
WIDGET_SHIM_JS = """(() => {
  document.addEventListener("DOMContentLoaded", () => {
    const mathjax = window.MathJax;
    if (mathjax && !mathjax.Hub && mathjax.typesetPromise) {
      mathjax.Hub = {Queue: command => {
        const element = Array.isArray(command) ? command[2] : undefined;
        mathjax.startup.promise.then(() => mathjax.typesetPromise(element ? [element] : []));
      }};
    }
  });
  function nameSliderHandles() {
    document.querySelectorAll(".noUi-handle[role=slider]:not([aria-label])").forEach(handle => {
      const widget = handle.closest(".jupyter-widgets") || handle.parentElement;
      const label = widget.querySelector(".widget-label");
      const text = label && label.textContent.trim();
      handle.setAttribute("aria-label", text || "slider");
    });
  }
  new MutationObserver(nameSliderHandles)
    .observe(document.documentElement, {childList: true, subtree: true});
})();"""


def node_modules(app: Sphinx) -> Path:
    """The ``node_modules/`` folder that ``npm ci`` fills next to ``package.json``."""
    return Path(app.srcdir) / "node_modules"


def _package_dir(app: Sphinx, package: str) -> Path:
    path = node_modules(app) / package
    if not (path / "package.json").is_file():
        raise ExtensionError(
            f"static_site: the npm package {package!r} is not installed in {path.parent}. "
            "Run `npm ci` in the repository root first (`make book` does it)."
        )
    return path


def _files_to_copy(app: Sphinx) -> list[tuple[Path, str]]:
    """Every (source file, destination relative to _static/npm/) pair, checked to exist."""
    pairs: list[tuple[Path, str]] = []
    for target, (package, folder, patterns) in COPIES.items():
        package_dir = _package_dir(app, package)
        base = package_dir / folder
        files = sorted(p for p in base.rglob("*") if p.is_file())
        for pattern in patterns:
            matched = [p for p in files if fnmatch.fnmatch(p.relative_to(base).as_posix(), pattern)]
            if not matched:
                raise ExtensionError(
                    f"static_site: nothing in {base} matches {pattern!r}; "
                    "did the npm package's layout change?"
                )
            pairs += [(p, f"{target}/{p.relative_to(base).as_posix()}") for p in matched]
        licence = min(package_dir.glob("LICEN[CS]E*"), default=None)
        if licence is not None:
            pairs.append((licence, f"{target}/{licence.name}"))
        version = json.loads((package_dir / "package.json").read_text())["version"]
        pairs.append((package_dir / "package.json", f"{target}/package.json"))
        logger.verbose("static_site: %s@%s -> _static/%s/%s", package, version, VENDOR, target)
    return pairs


def configure(app: Sphinx, config) -> None:
    """Point MathJax and the widget manager at the local copies."""
    config.mathjax_path = MATHJAX_PATH
    # myst-nb adds these to every page that stores widget state; no require.js is needed.
    config.nb_ipywidgets_js = {WIDGET_MANAGER_PATH: {}}
    # The theme's default colour mode is empty, which logs "Got invalid theme mode" on a first
    # visit; light suits the figures and bertviz's black labels.
    config.html_context.setdefault("default_mode", "light")


def prepare_html_build(app: Sphinx) -> None:
    """Fail early, with the fix in the message, when ``npm ci`` has not been run; add the shim."""
    if app.builder.format == "html":
        _files_to_copy(app)
        app.add_js_file(None, body=WIDGET_SHIM_JS)


def rewrite_cdn_urls(text: str, static_prefix: str) -> str:
    """Replace the known CDN addresses in ``text`` by paths under ``static_prefix``.

    Args:
        text: raw HTML or JavaScript from a stored notebook output.
        static_prefix: the page-relative URL of ``_static/`` ending in ``/``,
            e.g. ``"../_static/"``.

    Returns:
        The text with every known CDN address pointing at ``_static/npm/``.
    """
    for pattern, local in _CDN_REWRITES:
        text = pattern.sub(f"{static_prefix}{VENDOR}/{local}", text)
    return text


def label_bertviz_menus(text: str) -> str:
    """Give bertviz's ``<select>`` menus an accessible name (axe: select-name, critical)."""
    for pattern, labelled in _BERTVIZ_SELECTS.items():
        text = pattern.sub(labelled, text)
    return text


def localise_raw_html(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Rewrite CDN addresses in the raw HTML of one page; warn about any left over."""
    if app.builder.format != "html":
        return
    page = app.builder.get_target_uri(docname)
    static_prefix = relative_uri(page, "_static/")
    for node in list(doctree.findall(nodes.raw)):
        if "html" not in node.get("format", "").split():
            continue
        old = node.astext()
        new = label_bertviz_menus(rewrite_cdn_urls(old, static_prefix))
        if new != old:
            node[0] = nodes.Text(new)
        leftover = _EXTERNAL_RESOURCE.search(new)
        if leftover:
            start = max(leftover.start() - 40, 0)
            logger.warning(
                "static_site: raw HTML loads a resource from another site, which breaks "
                "the offline website: ...%s...",
                new[start : leftover.end() + 60].replace("\n", " "),
                location=node,
            )


def write_each_script_once(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """Drop the second copy of a script registered twice with the same content."""
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, unique = set(), []
    for script in scripts:
        key = (  # the registry and the builder spell "no file" as None and as ""
            str(getattr(script, "filename", script) or ""),
            json.dumps(getattr(script, "attributes", {}), sort_keys=True, default=str),
        )
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


def fix_citation_roles(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """List entries of the bibliography get ``role="listitem"`` (axe: aria-required-children).

    docutils writes ``<div role="list">`` around citations marked ``role="doc-biblioentry"``,
    a role DPUB-ARIA 1.1 deprecated in favour of ``listitem``.
    """
    if isinstance(context.get("body"), str):
        context["body"] = context["body"].replace('role="doc-biblioentry"', 'role="listitem"')


def copy_assets(app: Sphinx, exception: Exception | None) -> None:
    """Copy the npm libraries into ``_static/npm/`` of the built site."""
    if exception is not None or app.builder.format != "html":
        return
    destination = Path(app.outdir) / "_static" / VENDOR
    if destination.exists():
        shutil.rmtree(destination)
    for source, relative in _files_to_copy(app):
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def setup(app: Sphinx) -> dict:
    # After myst-nb (which registers nb_ipywidgets_js) and Sphinx's own config defaults.
    app.connect("config-inited", configure, priority=900)
    app.connect("builder-inited", prepare_html_build)
    app.connect("doctree-resolved", localise_raw_html)
    # After myst-nb and the theme have added this page's scripts.
    app.connect("html-page-context", write_each_script_once, priority=900)
    app.connect("html-page-context", fix_citation_roles)
    app.connect("build-finished", copy_assets)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
