// The query picker (attention_book.demos.query_picker_demo, chapter 2): a slider picks the
// query token; the demo shows its dot-product scores with every key, their softmax and the
// context vector (plain dot-product attention: no trainable weights, no scaling).
// data: {inputs: [[T x d]], tokens: [T strings]}. Element ids: <root id>-slider, -query,
// -s-<k>, -w-<k>, -bar-<k>, -context.
/* global softmax, removeRunHint */
/* exported queryPickerDemo */

function queryPickerDemo(root, data) {
  const id = root.id;
  const part = name => root.querySelector(`#${id}-${name}`);
  const slider = part("slider");
  const fmt = v => `[${v.map(x => x.toFixed(4)).join(", ")}]`;
  function update() {
    const q = Number(slider.value);
    const x = data.inputs;
    const scores = x.map(row => row.reduce((a, v, i) => a + v * x[q][i], 0));
    const w = softmax(scores);
    const context = x[0].map((_, i) => x.reduce((a, row, k) => a + w[k] * row[i], 0));
    part("query").textContent = data.tokens[q];
    scores.forEach((s, k) => {
      part(`s-${k}`).textContent = s.toFixed(4);
      part(`w-${k}`).textContent = w[k].toFixed(4);
      part(`bar-${k}`).style.width = `${(100 * w[k]).toFixed(1)}%`;
    });
    part("context").textContent = fmt(context);
  }
  slider.addEventListener("input", update);
  removeRunHint(root);
}
