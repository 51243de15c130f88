// Shared by every kernel-free demo of attention_book.demos.
//
// Python (demos/page.py) writes each demo's script as one function scope:
//
//   (function () {
//     const root = document.getElementById(<element id>);  // the demo's element
//     if (!root) { return; }
//     const data = <the demo's numbers, as JSON>;
//     const CELL_RGB = <the shade of a weight of 1, as [r, g, b]>;
//     <this file> <the demo's own file>
//     <the demo's function>(root, data);
//   })();
//
// so this file only declares functions; it reads CELL_RGB when they are called.
/* global CELL_RGB */
/* exported softmax, cellColour, removeRunHint */

// The softmax of one row; -Infinity (a blocked position) gets weight 0, and a row with no
// finite score gets zeros, as attention_book.softmax does.
function softmax(row) {
  const finite = row.filter(Number.isFinite);
  if (finite.length === 0) { return row.map(() => 0); }
  const top = Math.max(...finite);
  const exps = row.map(v => (Number.isFinite(v) ? Math.exp(v - top) : 0));
  const total = exps.reduce((a, b) => a + b, 0);
  return exps.map(v => v / total);
}

// The background of a cell holding weight w: white at 0, CELL_RGB at 1.
function cellColour(w) {
  const c = CELL_RGB.map(x => Math.round(255 + (x - 255) * w));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// The line "run the cell to bring this demo to life" is for a notebook whose scripts do not
// run (Jupyter does not run the stored scripts of a notebook it does not trust): once this
// script runs, the demo is alive and the line goes.
function removeRunHint(root) {
  root.querySelectorAll(".ab-run-hint").forEach(line => line.remove());
}
