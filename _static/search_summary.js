/* Search results show a sentence of the page around the word the reader typed.

   A patch of Sphinx's search (searchtools.js, Sphinx 7.4), like primary_toggle.js patches the
   theme. Sphinx's `Search.makeSearchSummary` looks for the *stemmed* query words in the page
   ("rotari" for "rotary") and, when it finds none, shows the start of `[role="main"]`, which
   on this theme is the launch and repository buttons ("...Binder", "...Repository"); when it
   finds one it is often in the page's list of contents. This override

   * looks for the words as typed (from the page's `?q=`), then for their stems, at the start
     of a word;
   * reads only the article's prose first (no buttons, contents lists, code cells or their
     outputs), then the whole article when the prose has no match; for a result that points at
     an entry of the API reference or a section, only that entry or section;
   * shows the first sentence with the most of the words (up to 240 characters around the
     match), with inline maths written plainly (`√d_k`, not `\(\sqrt{d_k}\)`) and display
     maths as "(a formula)";
   * falls back to Sphinx's own summary when nothing matches.

   tests/test_browser.py searches for "rotary" and checks that chapter 12's result quotes a
   sentence with the word. Delete this file (and its line in _config.yml) if a Sphinx release
   fixes the summary. */
(() => {
  const LENGTH = 240;
  const NOT_TEXT = ".headerlink, script, style, .bd-header-article, .header-article-items, " +
    ".bd-sidebar-secondary, .toctree-wrapper, .prev-next-area, nav, footer, .d-print-none";
  const NOT_PROSE = ".cell_input, .cell_output, .output, pre, .highlight";

  function typedWords() {
    const query = new URLSearchParams(window.location.search).get("q") || "";
    return query.toLowerCase().split(/[^\p{L}\p{N}_-]+/u).filter(word => word.length > 1);
  }

  const BREAK = "\uE000";  // marks the end of a block (not whitespace, so it survives)

  // Inline TeX as a reader would write it: \sqrt{d_k} -> √d_k, \frac{a}{b} -> a/b.
  function plainTeX(tex) {
    return tex.replace(/\\frac\{([^{}]*)\}\{([^{}]*)\}/g, "$1/$2")
      .replace(/\\sqrt\{([^{}]*)\}/g, "√$1").replace(/\\sqrt/g, "√")
      .replace(/\\(cdot|times)/g, (_, op) => (op === "cdot" ? "·" : "×"))
      .replace(/\^\{?\\top\}?/g, "ᵀ").replace(/\\(mathrm|text|operatorname|mathbf|left|right)\b/g, "")
      .replace(/\\[,;!]/g, "").replace(/[{}]/g, "").replace(/\\/g, "");
  }

  function textOf(root, drop) {
    const copy = root.cloneNode(true);
    copy.querySelectorAll(drop).forEach(el => el.remove());
    copy.querySelectorAll("div.math").forEach(el => { el.textContent = " (a formula) "; });
    copy.querySelectorAll("span.math").forEach(el => {
      el.textContent = plainTeX(el.textContent.trim().replace(/^\\\(/, "").replace(/\\\)$/, ""));
    });
    // Block elements end a sentence even without a full stop (a heading, a list item).
    copy.querySelectorAll("h1, h2, h3, h4, h5, h6, p, li, dt, dd, td, th, caption, figcaption")
      .forEach(el => el.append(` ${BREAK} `));
    return copy.textContent.replace(/\s+/g, " ");
  }

  function startsWord(sentence, word) {
    const escaped = word.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    return new RegExp(`(^|[^\\p{L}\\p{N}])${escaped}`, "u").exec(sentence.toLowerCase());
  }

  // The first sentence with the most of the words (as typed or stemmed), cut to LENGTH
  // characters around its first match.
  function bestSentence(text, words) {
    let best = null;
    let bestScore = 0;
    for (const sentence of text.split(new RegExp(`(?<=[.!?])\\s+|${BREAK}`))) {
      const clean = sentence.trim();
      const score = words.filter(word => startsWord(clean, word)).length;
      if (score > bestScore) {
        best = clean;
        bestScore = score;
      }
    }
    if (!best || best.length <= LENGTH) { return best; }
    const at = Math.min(...words.map(word => startsWord(best, word))
      .filter(Boolean).map(found => found.index));
    let start = Math.max(0, Math.min(at - LENGTH / 3, best.length - LENGTH));
    if (start > 0) { start = best.indexOf(" ", start) + 1 || start; }  // at a word's start
    return (start > 0 ? "..." : "") + best.slice(start, start + LENGTH).trim() +
      (start + LENGTH < best.length ? "..." : "");
  }

  // Each result fetches its page, and many results can share one (the API reference, 1.3 MB,
  // holds every function): parse each page once.
  const parsed = new Map();
  function parse(htmlText) {
    if (!parsed.has(htmlText)) {
      parsed.set(htmlText, new DOMParser().parseFromString(htmlText, "text/html"));
    }
    return parsed.get(htmlText);
  }

  // The part of the page a result points at: an API entry (its signature and description, by
  // its id, which has dots: not a CSS selector) or a section; the article when there is none.
  function target(page, main, anchor) {
    const element = anchor && anchor.startsWith("#") ? page.getElementById(anchor.slice(1)) : null;
    if (element && element.tagName === "DT" && element.parentElement.tagName === "DL") {
      return element.parentElement;
    }
    return (element && main.contains(element) && element) || main.querySelector("article") || main;
  }

  function summary(htmlText, keywords, anchor) {
    const page = parse(htmlText);
    const main = page.querySelector('[role="main"]');
    if (!main) { return null; }
    const article = target(page, main, anchor);
    const words = [...new Set([...typedWords(), ...[...keywords].map(k => k.toLowerCase())])];
    for (const drop of [`${NOT_TEXT}, ${NOT_PROSE}`, NOT_TEXT]) {
      const sentence = bestSentence(textOf(article, drop), words);
      if (sentence) {
        const paragraph = document.createElement("p");
        paragraph.classList.add("context");
        paragraph.textContent = sentence;
        return paragraph;
      }
    }
    return null;
  }

  function install() {
    if (typeof Search === "undefined" || Search.abSummary) { return; }
    const sphinxSummary = Search.makeSearchSummary;
    Search.makeSearchSummary = (htmlText, keywords, anchor) =>
      summary(htmlText, keywords, anchor) || sphinxSummary(htmlText, keywords, anchor);
    Search.abSummary = true;
  }
  // searchtools.js declares `Search` in a script of its own; the summaries are made only after
  // the result pages have been fetched, so installing once the document is parsed is in time.
  install();
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", install);
  }
})();
