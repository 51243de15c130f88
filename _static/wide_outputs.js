/* Wide things fit the screen, or say that they scroll (with custom.css).

   The text column is about 690 px wide on a desktop and 350 px on a phone. What is wider:
   * bertviz's attention views are SVG drawings of a fixed size (the model view is 970 px wide):
     they are scaled down to the column, to 60 % at most (below that their labels could not be
     read); what is still wider scrolls;
   * a box that scrolls sideways (a code cell, display maths, a view scaled as far as it goes,
     a figure shown at its readable width on a phone: figure_fit.js)
     gets the class `ab-scrolls-x`: custom.css fades its right edge, the cue that there is more,
     until the reader has scrolled to the end (`ab-scrolled-to-end`); it is also made
     focusable, so the keyboard can scroll it.
   Text outputs wrap instead (custom.css), so they never need this.
   tests/test_browser.py checks every page at 390, 768 and 1280 px. */
(() => {
  const MIN_SCALE = 0.6;
  const SCROLLERS = "main pre, main div.math, main mjx-container[display=\"true\"], " +
    "main .cell_output > .output, main .pst-scrollable-table-container, main div.ab-figure";

  // Give a drawn bertviz SVG a viewBox, so that CSS can scale it between MIN_SCALE and 1.
  function fitBertviz(root) {
    root.querySelectorAll("svg").forEach(svg => {
      if (svg.closest("svg") !== svg || svg.dataset.abFitted === "1") { return; }
      let width = Number(svg.getAttribute("width"));
      const height = Number(svg.getAttribute("height"));
      if (!width) {  // the head view draws at width="100%": measure what it drew
        const box = svg.getBBox();
        width = Math.ceil(box.x + box.width) + 4;
      }
      if (!width || !height) { return; }
      svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
      svg.style.width = `clamp(${Math.round(MIN_SCALE * width)}px, 100%, ${width}px)`;
      svg.style.height = "auto";
      svg.style.display = "block";
      svg.dataset.abFitted = "1";
    });
  }

  function markScrollers() {
    document.querySelectorAll('div[id^="bertviz-"]').forEach(fitBertviz);
    document.querySelectorAll(SCROLLERS).forEach(box => {
      const overflowX = getComputedStyle(box).overflowX;
      const scrolls = (overflowX === "auto" || overflowX === "scroll") &&
        box.scrollWidth > box.clientWidth + 1;
      box.classList.toggle("ab-scrolls-x", scrolls);
      if (scrolls) {
        if (!box.hasAttribute("tabindex")) { box.tabIndex = 0; }
        box.classList.toggle("ab-scrolled-to-end",
          box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
        if (!box.dataset.abWatched) {
          box.dataset.abWatched = "1";
          box.addEventListener("scroll", () => box.classList.toggle("ab-scrolled-to-end",
            box.scrollLeft + box.clientWidth >= box.scrollWidth - 1), {passive: true});
        }
      }
    });
  }

  let pending = null;
  function soon() {
    clearTimeout(pending);
    pending = setTimeout(markScrollers, 150);
  }
  function start() {
    markScrollers();
    // Whatever changes what is wide: the window, the column (the sidebar hidden or shown),
    // new content (MathJax, bertviz, the widgets), a fold opened, the last font or image.
    window.addEventListener("resize", soon);
    window.addEventListener("load", soon);
    document.addEventListener("toggle", soon, true);
    const main = document.querySelector("main") || document.body;
    new ResizeObserver(soon).observe(main);
    new MutationObserver(mutations => {
      // Our own class changes are attribute mutations: only new content counts.
      if (mutations.some(m => m.type === "childList")) { soon(); }
    }).observe(main, {childList: true, subtree: true});
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(soon);
    }
    if (document.fonts && document.fonts.ready) { document.fonts.ready.then(soon); }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
