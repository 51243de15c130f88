// The mask editor (attention_book.demos.mask_editor_demo, chapter 5): each cell of a boolean
// mask is a toggle button; the weights beside it are the softmax of the scores with the
// blocked positions at -Infinity (a row with every key blocked gets zeros).
// data: {scores: [[T x T]], mask: [[T x T booleans]]}. Weight cells: <root id>-w-<i>-<j>.
/* global softmax, cellColour, removeRunHint */
/* exported maskEditorDemo */

function maskEditorDemo(root, data) {
  const id = root.id;
  const T = data.scores.length;
  const mask = data.mask.map(row => row.slice());
  function update() {
    for (let i = 0; i < T; i++) {
      const row = data.scores[i].map((s, j) => (mask[i][j] ? s : -Infinity));
      softmax(row).forEach((w, j) => {
        const cell = root.querySelector(`#${id}-w-${i}-${j}`);
        cell.textContent = w.toFixed(3);
        cell.style.background = cellColour(w);
      });
    }
  }
  root.querySelectorAll("button.ab-mask-cell").forEach(button => {
    button.addEventListener("click", () => {
      const i = Number(button.dataset.row), j = Number(button.dataset.col);
      mask[i][j] = !mask[i][j];
      button.setAttribute("aria-pressed", String(mask[i][j]));
      button.textContent = mask[i][j] ? "1" : "0";
      update();
    });
  });
  removeRunHint(root);
}
