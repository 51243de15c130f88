/* The "Toggle primary sidebar" button (the table of contents) works on every screen.

   A patch of a theme bug, to delete once the theme is fixed. pydata-sphinx-theme 0.17 added a
   second `.primary-toggle` button (in its top navigation bar, hidden by sphinx-book-theme), and
   both themes wire their click handlers with `document.querySelector(".primary-toggle")`: the
   first button in the page, the hidden one. The button a reader sees (sphinx-book-theme's, in
   the article header) gets no handler, so below 992 px it never opens the sidebar dialog and
   above it never hides the sidebar (upstream: pydata/pydata-sphinx-theme issue 2451; also
   executablebooks/sphinx-book-theme issue 935 and pull requests 991 and 1000). As of this
   writing no release fixes it: pydata-sphinx-theme 0.24.0 and sphinx-book-theme 1.4.0 still
   bind the first button only, and sphinx-book-theme 1.4.0 needs Sphinx 8.2, which
   jupyter-book 1.x cannot use. The book builds with sphinx-book-theme 1.3.0, which pins
   pydata-sphinx-theme 0.17.1.

   The patch: a click on any other `.primary-toggle` button is handed to the first one, which
   runs the themes' own handlers (the dialog on narrow screens, hiding the sidebar on wide
   ones). tests/test_browser.py clicks the visible button at 390, 768 and 1280 px wide: if a
   fixed theme binds every button, each click would act twice and that test fails, which is the
   signal to delete this file (and its line in _config.yml). */
(() => {
  function forwardClicks() {
    const toggles = [...document.querySelectorAll(".primary-toggle")];
    const wired = toggles[0];
    toggles.slice(1).forEach(button => {
      button.addEventListener("click", event => {
        event.preventDefault();
        event.stopPropagation();
        wired.click();
      });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", forwardClicks);
  } else {
    forwardClicks();
  }
})();
