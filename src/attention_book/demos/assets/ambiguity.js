// Chapter 9's ambiguity demo (attention_book.demos.ambiguity_demo): the trained classifier runs
// in the page. ambiguityModel(data) decodes the weights and repeats AttentionClassifier's forward
// pass (no page needed: the tests run it in Node too); ambiguityDemo(root, data) redraws the
// markup of the Python side (demos/ambiguity.py, _render_reading) on every keystroke.
//
// data: {model: export_classifier's payload, cues: {word: [its cue words]}, focus: the smallest
// mean weight that earns a star}. The Python side is the reference: read_sentence computes what
// read() computes, and the browser tests compare the two.
/* global softmax, cellColour, removeRunHint */
/* exported ambiguityModel, ambiguityDemo */

function ambiguityModel(data) {
  const M = data.model;
  const d = M.d_model, H = M.num_heads, hd = d / H, L = M.context_length;
  const labels = M.labels, known = M.vocab.slice(1);
  const stoi = new Map(known.map((w, i) => [w, i + 1]));  // id 0 is padding, never a word
  const ambiguous = [];
  labels.forEach(l => { const w = l.split("/")[0]; if (!ambiguous.includes(w)) { ambiguous.push(w); } });
  const replacements = known.filter(w => !ambiguous.includes(w));  // never offer an ambiguous word
  const cues = data.cues || {};
  // The weights: little-endian int32, value * 10^decimals, in the order of M.layout.
  const bytes = Uint8Array.from(atob(M.weights), c => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const unit = Math.pow(10, M.decimals);
  const P = {};
  let offset = 0;
  M.layout.forEach(([name, rows, cols]) => {
    const n = rows * Math.max(cols, 1);
    const values = new Float64Array(n);
    for (let i = 0; i < n; i++) { values[i] = view.getInt32(4 * (offset + i), true) / unit; }
    P[name] = values;
    offset += n;
  });
  // The sinusoidal positional encoding, as attention_book.train computes it.
  const pe = new Float64Array(L * d);
  for (let p = 0; p < L; p++) {
    for (let i = 0; i < d; i += 2) {
      const f = Math.exp(i * (-Math.log(10000) / d));
      pe[p * d + i] = Math.sin(p * f);
      pe[p * d + i + 1] = Math.cos(p * f);
    }
  }
  function linear(W, b, x, rows, cols) {  // W x + b, W stored row-major (rows, cols)
    const out = new Float64Array(rows);
    for (let o = 0; o < rows; o++) {
      let s = 0;
      for (let i = 0; i < cols; i++) { s += W[o * cols + i] * x[i]; }
      out[o] = b ? s + b[o] : s;
    }
    return out;
  }
  // AttentionClassifier.forward for one sentence, padded to the context length like a batch.
  function forward(ids, wordIndex) {
    const T = ids.length;
    const xs = [];
    for (let t = 0; t < L; t++) {
      const id = t < T ? ids[t] : 0;  // padding beyond the sentence
      const x = new Float64Array(d);
      for (let i = 0; i < d; i++) {
        x[i] = P.embedding[id * d + i] + (M.positional_encoding ? pe[t * d + i] : 0);
      }
      xs.push(x);
    }
    // The head reads only the ambiguous word's context vector: one query is enough.
    const q = linear(P.W_query, null, xs[wordIndex], d, d);
    const keys = xs.map(x => linear(P.W_key, null, x, d, d));
    const values = xs.map(x => linear(P.W_value, null, x, d, d));
    const scale = 1 / Math.sqrt(hd);
    const context = new Float64Array(d);
    const attention = [];
    for (let h = 0; h < H; h++) {
      const scores = keys.map((k, t) => {
        if (t >= T) { return -Infinity; }  // the padding mask: True only for real tokens
        let s = 0;
        for (let j = 0; j < hd; j++) { s += q[h * hd + j] * k[h * hd + j]; }
        return s * scale;
      });
      const w = softmax(scores);
      for (let j = 0; j < hd; j++) {
        let s = 0;
        for (let t = 0; t < L; t++) { s += w[t] * values[t][h * hd + j]; }
        context[h * hd + j] = s;
      }
      attention.push(w.slice(0, T));
    }
    const mixed = linear(P.out_proj_weight, P.out_proj_bias, context, d, d);
    const logits = linear(P.head_weight, P.head_bias, mixed, labels.length, d);
    return {probabilities: softmax(Array.from(logits)), attention};
  }
  function split(text) {
    return text.toLowerCase().split(/\s+/)
      .map(w => w.replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, "")).filter(w => w.length > 0);
  }
  // What read_sentence returns, field for field (camelCase), notes included.
  function read(text) {
    const words = split(text);
    const tokens = words.filter(w => stoi.has(w));
    const unknown = [...new Set(words.filter(w => !stoi.has(w)))];
    const r = {words, unknown, tokens, status: "ok", wordIndex: -1, attendedIndex: -1,
               probabilities: null, attention: null, mean: null, ambiguousIndices: [],
               cueIndices: [], notes: []};
    if (words.length === 0) { r.status = "empty"; return r; }
    if (tokens.length > L) { r.status = "too-long"; return r; }
    tokens.forEach((w, t) => { if (ambiguous.includes(w)) { r.ambiguousIndices.push(t); } });
    if (r.ambiguousIndices.length === 0) { r.status = "no-ambiguous-word"; return r; }
    r.wordIndex = r.ambiguousIndices[0];
    const out = forward(tokens.map(w => stoi.get(w)), r.wordIndex);
    r.probabilities = out.probabilities;
    r.attention = out.attention;
    r.mean = tokens.map((_, t) => out.attention.reduce((a, row) => a + row[t], 0) / H);
    let best = -Infinity;
    r.mean.forEach((m, t) => {
      if (t !== r.wordIndex && m > best) { best = m; r.attendedIndex = t; }
    });
    const word = tokens[r.wordIndex];
    const cueWords = cues[word];
    if (cueWords) {
      tokens.forEach((w, t) => { if (cueWords.includes(w)) { r.cueIndices.push(t); } });
    }
    if (r.ambiguousIndices.length > 1) { r.notes.push("several-ambiguous"); }
    if (cueWords && r.cueIndices.length === 0) { r.notes.push("no-cue"); }
    if (r.attendedIndex >= 0 && r.mean[r.attendedIndex] < data.focus) { r.notes.push("no-clear-focus"); }
    return r;
  }
  function editDistance(a, b) {
    let previous = Array.from({length: b.length + 1}, (_, j) => j);
    for (let i = 1; i <= a.length; i++) {
      const current = [i];
      for (let j = 1; j <= b.length; j++) {
        current.push(Math.min(previous[j] + 1, current[j - 1] + 1,
                              previous[j - 1] + (a[i - 1] !== b[j - 1] ? 1 : 0)));
      }
      previous = current;
    }
    return previous[b.length];
  }
  // The three known words closest to `word` (ties: vocabulary order), never an ambiguous one.
  function suggestions(word) {
    return replacements.map((w, i) => [editDistance(word, w), i])
      .sort((x, y) => x[0] - y[0] || x[1] - y[1]).slice(0, 3).map(pair => replacements[pair[1]]);
  }
  return {read, split, suggestions, labels, known, ambiguous, cues, contextLength: L, numHeads: H};
}

function ambiguityDemo(root, data) {
  const model = ambiguityModel(data);
  const {labels, ambiguous, cues} = model;
  const H = model.numHeads, L = model.contextLength;
  const listed = ambiguous.length > 1
    ? `${ambiguous.slice(0, -1).join(", ")} or ${ambiguous[ambiguous.length - 1]}` : ambiguous[0];
  function esc(s) {
    const table = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"};
    return String(s).replace(/[&<>"']/g, c => table[c]);
  }
  const strong = w => `<strong>${esc(w)}</strong>`;
  function and(items) {  // "a", "a and b", "a, b and c"
    return items.length > 1 ? `${items.slice(0, -1).join(", ")} and ${items[items.length - 1]}` : items[0];
  }
  function message(kind, text) { return `<p class="ab-message" data-message="${kind}">${text}</p>`; }
  function chips(word) {
    return model.suggestions(word).map(s => `<button type="button" class="ab-chip" ` +
      `data-replace="${esc(word)}" data-word="${esc(s)}">${esc(s)}</button>`).join("");
  }
  function unknownMessage(unknown) {
    const list = "(or pick one from the list of all its words below)";
    if (unknown.length === 1) {
      const w = unknown[0];
      return message("unknown", `The model has never seen ${strong(w)}, so it reads the sentence ` +
        `without it. Replace it with a word it knows: ${chips(w)} ${list}.`);
    }
    const items = unknown.map(w => `<span class="ab-replace">${strong(w)}: ${chips(w)}</span>`);
    return message("unknown", `The model has never seen ${and(unknown.map(strong))}, so it reads ` +
      `the sentence without them. Replace each with a word it knows ${list}: ${items.join(" ")}`);
  }
  function bar(p) {
    return `<td><div class="ab-bar-track"><div class="ab-bar" style="width:${(100 * p).toFixed(1)}%">` +
      `</div></div></td><td>${p.toFixed(3)}</td>`;
  }
  function renderPrediction(r) {
    const p = r.probabilities;
    let best = 0;
    p.forEach((v, c) => { if (v > p[best]) { best = c; } });
    const word = esc(r.tokens[r.wordIndex]);
    const focused = r.attendedIndex >= 0 && !r.notes.includes("no-clear-focus");
    let summary = `The model reads <strong>${word}</strong> as <strong>${esc(labels[best])}` +
      `</strong> (probability ${p[best].toFixed(3)})`;
    if (focused) {
      summary += `; it attends most to ${strong(r.tokens[r.attendedIndex])} (★ below).`;
    } else if (r.attendedIndex >= 0) {
      summary += `; no other word stands out: the most attention any other word gets is ` +
        `${r.mean[r.attendedIndex].toFixed(2)} (${strong(r.tokens[r.attendedIndex])}), less than ` +
        `${data.focus.toFixed(2)}, so no word has a ★.`;
    } else {
      summary += "; there is no other word to attend to.";
    }
    const notes = [];
    if (r.notes.includes("several-ambiguous")) {
      const found = r.ambiguousIndices.map(t => strong(r.tokens[t]));
      notes.push(message("several-ambiguous", `This sentence has ${found.length} ambiguous words ` +
        `(${found.join(", then ")}): the model classifies only the first, <strong>${word}</strong>, ` +
        "and reads the others as ordinary words."));
    }
    if (r.notes.includes("no-cue")) {
      const words = cues[r.tokens[r.wordIndex]];
      notes.push(message("no-cue", `No word here is one of the ${words.length} cue words the model ` +
        `learned for <strong>${word}</strong> (${words.map(esc).join(", ")}): nothing in this ` +
        "sentence decides its sense, yet the model must answer with one of its labels, so the " +
        "probability above is a guess, however high."));
    }
    const own = [];
    labels.forEach((l, c) => { if (l.split("/")[0] === r.tokens[r.wordIndex]) { own.push(c); } });
    const rows = own.map(c => `<tr><th scope="row">${esc(labels[c])}</th>${bar(p[c])}</tr>`);
    if (own.length < labels.length) {
      let rest = 0;
      p.forEach((v, c) => { if (!own.includes(c)) { rest += v; } });
      rows.push(`<tr><th scope="row">the other ${labels.length - own.length} labels</th>${bar(rest)}</tr>`);
    }
    let headCols = "";
    for (let h = 0; h < H; h++) { headCols += `<th scope="col">head ${h}</th>`; }
    const weightRows = r.tokens.map((token, t) => {
      let label = esc(token);
      if (t === r.wordIndex) { label = `<strong>${label}</strong> (itself)`; }
      const starred = focused && t === r.attendedIndex;
      if (starred) {
        label = `<span aria-hidden="true">★ </span>${label}<span class="ab-sr-only"> (most attention)</span>`;
      }
      const cells = [...r.attention.map(row => row[t]), r.mean[t]]
        .map(w => `<td style="background:${cellColour(w)}">${w.toFixed(2)}</td>`).join("");
      return `<tr${starred ? ' class="ab-attended"' : ""}><th scope="row">${label}</th>${cells}</tr>`;
    });
    const starNote = focused || r.attendedIndex < 0
      ? `★ marks the word that <strong>${word}</strong> attends to most: the largest mean weight ` +
        "over the heads, the word itself left out, when it is at least " +
        `${data.focus.toFixed(2)}. Each column of weights sums to 1.`
      : `No ★: no word but <strong>${word}</strong> itself gets a mean weight of ` +
        `${data.focus.toFixed(2)} or more. Each column of weights sums to 1.`;
    return `<p class="ab-prediction">${summary}</p>${notes.join("")}` +
      `<div class="ab-side-by-side"><table><caption>Probability of each sense</caption>` +
      `<thead><tr><th scope="col">label</th><th scope="col">probability as a bar</th>` +
      `<th scope="col">probability</th></tr></thead><tbody>${rows.join("")}</tbody></table>` +
      `<table><caption>Attention from <strong>${word}</strong> to each word</caption>` +
      `<thead><tr><th scope="col">word</th>${headCols}<th scope="col">mean</th></tr></thead>` +
      `<tbody>${weightRows.join("")}</tbody></table></div>` +
      `<p class="ab-note">${starNote}</p>`;
  }
  function render(r) {
    const parts = [];
    if (r.words.length) {
      const spans = r.words.map(w => (r.unknown.includes(w)
        ? `<span class="ab-word-unknown">${esc(w)} <span class="ab-tag">unknown</span></span>`
        : (r.status === "ok" && w === r.tokens[r.wordIndex])
          ? `<span><strong>${esc(w)}</strong></span>` : `<span>${esc(w)}</span>`));
      parts.push(`<p class="ab-words">Words: ${spans.join(" ")}</p>`);
    }
    if (r.status === "empty") { parts.push(message("empty", `Type a sentence with ${esc(listed)}.`)); }
    if (r.unknown.length) { parts.push(unknownMessage(r.unknown)); }
    if (r.status === "too-long") {
      parts.push(message("too-long",
        `This sentence has ${r.tokens.length} words the model knows; it reads at most ${L} ` +
        `(its context length). Remove ${r.tokens.length - L} of them.`));
    }
    if (r.status === "no-ambiguous-word") {
      parts.push(message("no-ambiguous-word",
        `No ambiguous word: the model tells the senses of ${esc(listed)} apart. Add one of them.`));
    }
    if (r.status === "ok") { parts.push(renderPrediction(r)); }
    return parts.join("");
  }
  const input = root.querySelector("input.ab-sentence-input");
  const output = root.querySelector(".ab-demo-output");
  const live = root.querySelector(".ab-live");
  const wordList = root.querySelector("details.ab-word-list");
  function update() {
    const start = performance.now();
    const r = model.read(input.value);
    const computed = performance.now();
    output.innerHTML = render(r);
    const drawn = performance.now();
    // What the page computed, for the browser tests (and the curious: inspect the element).
    root.dataset.state = r.status;
    root.dataset.tokens = JSON.stringify(r.tokens);
    root.dataset.wordIndex = String(r.wordIndex);
    root.dataset.attendedIndex = String(r.attendedIndex);
    root.dataset.notes = JSON.stringify(r.notes);
    root.dataset.probabilities = r.probabilities ? JSON.stringify(r.probabilities) : "";
    root.dataset.attention = r.attention ? JSON.stringify(r.attention) : "";
    root.dataset.forwardMs = (computed - start).toFixed(3);
    root.dataset.updateMs = (drawn - start).toFixed(3);
    if (r.unknown.length && wordList) { wordList.open = true; }
  }
  let announceTimer = null;
  function announce() {  // once the reader pauses, so a screen reader is not flooded
    clearTimeout(announceTimer);
    announceTimer = setTimeout(() => {
      const said = [...output.querySelectorAll(".ab-message, .ab-prediction")].map(p => p.textContent);
      live.textContent = said.join(" ");
    }, 400);
  }
  function caretTo(position) { input.focus(); input.setSelectionRange(position, position); }
  function insertWord(word) {
    const at = input.selectionStart === null ? input.value.length : input.selectionStart;
    const before = input.value.slice(0, at), after = input.value.slice(input.selectionEnd || at);
    const left = before && !/\s$/.test(before) ? " " : "";
    const right = after && !/^\s/.test(after) ? " " : "";
    input.value = before + left + word + right + after;
    caretTo((before + left + word).length);
  }
  function replaceWord(unknownWord, word) {
    const pieces = input.value.split(/(\s+)/);
    const at = pieces.findIndex(piece => model.split(piece)[0] === unknownWord);
    if (at < 0) { insertWord(word); return; }
    pieces[at] = word;
    input.value = pieces.join("");
    caretTo(pieces.slice(0, at + 1).join("").length);
  }
  input.addEventListener("input", () => { update(); announce(); });
  root.addEventListener("click", event => {
    const chip = event.target.closest("button.ab-chip");
    if (!chip || !root.contains(chip)) { return; }
    if (chip.dataset.replace !== undefined) { replaceWord(chip.dataset.replace, chip.dataset.word); }
    else { insertWord(chip.dataset.word); }
    update();
    announce();
  });
  root.abRead = model.read;  // the browser test times the forward pass with it
  removeRunHint(root);
  update();
}
