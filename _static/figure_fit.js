/* Figures on phones and tablets: read them at their readable width, or see them whole.

   Below 992 px every figure keeps the width at which its smallest text is 9 CSS px
   (custom.css, with --ab-readable-width from _ext/figure_links.py). A figure's box,
   div.ab-figure, too narrow for that width gets the class `ab-figure-wide`: the figure scrolls
   sideways, a line under it says so, and a tap on the figure toggles `ab-fit`, which fits the
   whole figure to the column (a second tap brings the readable width back) instead of following
   the link to the image file. Other figures, and every figure on a desktop, keep the link.
   tests/test_browser.py taps one. */
(() => {
  const SMALL = window.matchMedia("screen and (max-width: 991.98px)");

  function markWide() {
    document.querySelectorAll("main div.ab-figure").forEach(box => {
      const readable = parseFloat(getComputedStyle(box).getPropertyValue("--ab-readable-width"));
      const wide = SMALL.matches && readable > box.clientWidth + 1;
      box.classList.toggle("ab-figure-wide", wide);
      if (!wide) { box.classList.remove("ab-fit"); }
    });
  }

  document.addEventListener("click", event => {
    const box = event.target.closest && event.target.closest("main div.ab-figure.ab-figure-wide");
    const link = box && event.target.closest("a.ab-full-size");
    if (!link || event.ctrlKey || event.metaKey || event.shiftKey) { return; }
    event.preventDefault();
    box.classList.toggle("ab-fit");
    // The box no longer scrolls (or scrolls again): wide_outputs.js marks it again.
    window.dispatchEvent(new Event("resize"));
  });

  let pending = null;
  function soon() {
    clearTimeout(pending);
    pending = setTimeout(markWide, 100);
  }
  function start() {
    markWide();
    window.addEventListener("resize", soon);
    window.addEventListener("load", soon);
    SMALL.addEventListener("change", soon);
    document.addEventListener("toggle", soon, true);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
