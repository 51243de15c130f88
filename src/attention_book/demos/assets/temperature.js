// The temperature demo (attention_book.demos.temperature_demo, chapter 4): a slider for the
// temperature t redraws softmax(scores / t) as bars, with the entropy of the weights.
// data: {scores: [T numbers]}. Element ids: <root id>-slider, -value, -bar-<k>, -w-<k>, -entropy.
/* global softmax, removeRunHint */
/* exported temperatureDemo */

function temperatureDemo(root, data) {
  const id = root.id;
  const part = name => root.querySelector(`#${id}-${name}`);
  const slider = part("slider");
  function update() {
    const t = Number(slider.value);
    const w = softmax(data.scores.map(s => s / t));
    part("value").textContent = t.toFixed(2);
    w.forEach((v, i) => {
      part(`bar-${i}`).style.width = `${(100 * v).toFixed(1)}%`;
      part(`w-${i}`).textContent = v.toFixed(4);
    });
    const h = -w.filter(v => v > 0).reduce((a, v) => a + v * Math.log(v), 0);
    part("entropy").textContent = h.toFixed(3);
  }
  slider.addEventListener("input", update);
  removeRunHint(root);
}
