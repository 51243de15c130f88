// Chapter 15's training demo (attention_book.demos.induction_training_demo): the page around
// the engine of induction_train.js. inductionDemo(root, data) wires the buttons and the
// settings, trains in a Web Worker (the engine's source text is its script) so that the page
// answers while the model learns, and redraws the status line, the two plots, the table of
// head scores and the four attention maps as the worker reports. Where no worker can start,
// the same loop runs on this page, one step between frames.
//
// data: {config: the sizes and the task (DEMO_SETTINGS, camelCase), threshold: find_heads's,
// maxSeed, plot: the plots' layout and colours, reference: chapter 15's history or null,
// sequences: the token ids of each sequence in the menu}. The first rendering comes from
// Python (demos/induction.py); the tests read what the page computed from root.dataset and
// root.abHistory, and run the engine through root.abEngine.
/* global inductionEngine, removeRunHint */
/* exported inductionDemo */

// The training loop, on the far side of a message port: a worker's `self`, or a stand-in on
// the page. Messages in: reset {run, config, options}, train, pause, step, sequence {tokens}.
// Messages out, each with the number of its run: reset, step {step, loss, ms}, record {record,
// ms}, maps {step, tokens, weights, ms}, state {state}; ms: how long the worker was busy.
function inductionTrainerLoop(port, engine) {
  "use strict";
  const E = engine();
  let trainer = null, config = null, running = false, sequence = null, ticking = false, run = 0;
  function send(message) { port.postMessage({...message, run}); }
  function record() {
    const start = performance.now();
    const result = trainer.record();
    send({type: "record", record: result, ms: performance.now() - start});
  }
  function maps() {
    if (sequence !== null) {
      const start = performance.now();
      const weights = trainer.attention(sequence);
      send({type: "maps", step: trainer.step, tokens: sequence, weights,
            ms: performance.now() - start});
    }
  }
  function state(name) { send({type: "state", state: name, step: trainer.step}); }
  function oneStep() {
    const start = performance.now();
    const result = trainer.trainStep();
    send({type: "step", step: result.step, loss: result.loss, ms: performance.now() - start});
    if (result.step % config.recordEvery === 0 || result.step === trainer.steps) { record(); }
    maps();
  }
  // The next step is a task of its own, so that a message (pause, a new sequence) gets in
  // between two steps; a message to itself starts it at once (setTimeout would wait 4 ms).
  const tick = typeof MessageChannel === "function" ? new MessageChannel() : null;
  function schedule() {
    if (ticking) { return; }
    ticking = true;
    if (tick) { tick.port2.postMessage(null); } else { setTimeout(loop, 0); }
  }
  function loop() {
    ticking = false;
    if (!running) { return; }
    oneStep();
    if (trainer.step >= trainer.steps) {
      running = false;
      state("done");
      return;
    }
    schedule();
  }
  if (tick) { tick.port1.onmessage = loop; }
  port.onmessage = event => {
    const message = event.data;
    if (message.type === "reset") {
      running = false;
      run = message.run;
      config = message.config;
      trainer = E.createTrainer(config, message.options);
      send({type: "reset", options: message.options});
      record();
      maps();
      state("ready");
    } else if (trainer === null) {
      return;
    } else if (message.type === "train" && !running && trainer.step < trainer.steps) {
      running = true;
      state("running");
      schedule();
    } else if (message.type === "pause" && running) {
      running = false;
      if (trainer.step % config.recordEvery !== 0) { record(); }
      state("ready");
    } else if (message.type === "step" && !running && trainer.step < trainer.steps) {
      oneStep();
      if (trainer.step % config.recordEvery !== 0 && trainer.step !== trainer.steps) { record(); }
      state(trainer.step >= trainer.steps ? "done" : "ready");
    } else if (message.type === "sequence") {
      sequence = message.tokens;
      maps();
    }
  };
}

function inductionDemo(root, data) {
  const id = root.id;
  const config = data.config;
  const part = name => root.querySelector(`#${id}-${name}`);
  const button = action => root.querySelector(`button[data-action="${action}"]`);
  const buttons = {train: button("train"), pause: button("pause"), step: button("step"),
                   reset: button("reset")};
  const status = part("status"), live = root.querySelector(".ab-live");
  const tokenBox = part("tokens"), sequenceMenu = part("sequence");
  const tokenMessage = root.querySelector(".ab-token-message");
  const reducedMotion = typeof window.matchMedia === "function" &&
    window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  const L = config.numLayers, H = config.numHeads, V = config.vocabSize;
  const chance = Math.log(V);

  // What the page knows of the current run.
  const run = {id: 0, options: null, state: "starting", step: 0, steps: 0, batchLosses: [],
               records: [], maps: null, elapsedMs: 0, runningSince: null, busyMs: 0,
               announcedHeads: new Set()};
  root.abEngine = inductionEngine;  // for the tests, and the curious
  root.abHistory = run.records;
  root.abReference = data.reference;

  // ---- settings -----------------------------------------------------------------------
  function readSettings() {
    const value = name => root.querySelector(`[data-setting="${name}"]`).value;
    const seed = Number(value("seed"));
    if (!Number.isInteger(seed) || seed < 0 || seed > data.maxSeed) {
      return {error: `The seed must be a whole number from 0 to ${data.maxSeed}.`};
    }
    const offset = value("offset");
    return {seed, lr: Number(value("lr")), steps: Number(value("steps")),
            offset: offset === "random" ? null : Number(offset),
            rope: value("positions") === "rope"};
  }

  // ---- the worker -----------------------------------------------------------------------
  // The engine's source and the loop's make the worker's script, so nothing is fetched. Where
  // no worker can start (a strict content policy: at once, or with an error before it says
  // anything), the loop runs on this page, one step at a time between frames.
  let trainer = null, heard = false;
  function onPage() {
    const page = {onmessage: null,
                  postMessage: m => setTimeout(() => inside.onmessage({data: m}), 0)};
    const inside = {onmessage: null,
                    postMessage: m => setTimeout(() => page.onmessage({data: m}), 0)};
    inductionTrainerLoop(inside, inductionEngine);
    root.dataset.trainer = "page";
    return page;
  }
  function connect(port) {
    trainer = port;
    port.onmessage = receive;
  }
  function startTrainer() {
    const source = `${inductionEngine.toString()}\n(${inductionTrainerLoop.toString()})` +
      "(self, inductionEngine);\n";
    let worker;
    try {
      const url = URL.createObjectURL(new Blob([source], {type: "text/javascript"}));
      worker = new Worker(url);
      URL.revokeObjectURL(url);
    } catch (error) {
      connect(onPage());
      return;
    }
    root.dataset.trainer = "worker";
    connect(worker);
    worker.addEventListener("error", event => {
      if (!heard) {  // it never started: train on the page instead
        worker.terminate();
        connect(onPage());
        reset();
        return;
      }
      say(`The training stopped: ${event.message || "the worker failed"}.`);
      setState("invalid");
    });
  }

  function reset() {
    const settings = readSettings();
    if (settings.error) {
      say(settings.error);
      status.textContent = settings.error;
      setState("invalid");
      return;
    }
    run.id += 1;
    run.options = settings;
    run.step = 0;
    run.steps = settings.steps;
    run.batchLosses = [];
    run.records.length = 0;
    run.elapsedMs = 0;
    run.busyMs = 0;
    run.runningSince = null;
    run.announcedHeads = new Set();
    lossTop = P.lossMax;
    root.dataset.step = "0";
    root.dataset.busyMs = "0";
    setState("starting");
    drawAxes();
    trainer.postMessage({type: "reset", run: run.id, config, options: settings});
    sendSequence();
  }

  // ---- messages from the trainer ------------------------------------------------------
  function receive(event) {
    const message = event.data;
    heard = true;
    if (message.run !== run.id) { return; }  // from a run that a reset ended
    if (message.ms !== undefined && run.state === "running") {
      run.busyMs += message.ms;  // the worker's time on this run's steps, records and maps
      root.dataset.busyMs = run.busyMs.toFixed(0);
    }
    if (message.type === "step") {
      run.step = message.step;
      run.batchLosses.push(message.loss);
      root.dataset.step = String(message.step);
    } else if (message.type === "record") {
      const last = run.records[run.records.length - 1];
      if (!last || last.step !== message.record.step) { run.records.push(message.record); }
      announceNewHeads(message.record);
    } else if (message.type === "maps") {
      run.maps = message;
      root.dataset.mapsStep = String(message.step);
      root.dataset.mapsTokens = message.tokens.join(" ");
    } else if (message.type === "state") {
      setState(message.state);
      if (message.state === "done") { announceEnd(); }
    }
    const record = message.type === "record";
    if (!reducedMotion || record || message.type === "state" || run.state !== "running") {
      schedule();
    }
  }

  function setState(state) {
    const now = performance.now();
    if (run.state === "running" && state !== "running" && run.runningSince !== null) {
      run.elapsedMs += now - run.runningSince;
      run.runningSince = null;
    }
    if (state === "running" && run.runningSince === null) { run.runningSince = now; }
    const focused = Object.keys(buttons).find(key => buttons[key] === document.activeElement);
    run.state = state;
    root.dataset.state = state;
    root.dataset.elapsedMs = run.elapsedMs.toFixed(0);
    // While a new run starts, Train and Step stay pressable: their messages reach the worker
    // after the reset. (A reader who types a seed and clicks Train at once starts the new run
    // by leaving the box, and the click must not land on a disabled button.)
    const ready = ["ready", "stepping", "starting"].includes(state);
    buttons.train.disabled = !ready;
    buttons.step.disabled = !ready;
    buttons.pause.disabled = state !== "running";
    buttons.reset.disabled = state === "invalid";
    // A button that a key press just disabled hands the focus on, so the keyboard is not lost.
    if (focused && buttons[focused].disabled) {
      const next = {train: "pause", pause: "train", step: "reset", reset: "train"}[focused];
      const target = !buttons[next].disabled ? buttons[next] :
        Object.values(buttons).find(b => !b.disabled);
      if (target) { target.focus(); }
    }
  }

  buttons.train.addEventListener("click", () => {
    trainer.postMessage({type: "train"});
    say(`Training from step ${run.step}.`);
  });
  buttons.pause.addEventListener("click", () => trainer.postMessage({type: "pause"}));
  buttons.step.addEventListener("click", () => {
    setState("stepping");  // until the worker has stepped and recorded
    trainer.postMessage({type: "step"});
  });
  buttons.reset.addEventListener("click", () => { reset(); say("A new run, at step 0."); });
  root.querySelectorAll("[data-setting]").forEach(control => {
    control.addEventListener("change", () => {
      reset();
      if (run.options) { say(`New settings: ${describe(run.options)}. A new run, at step 0.`); }
    });
  });

  // ---- the sequence of the maps -------------------------------------------------------
  function parseTokens(text) {
    const words = text.trim().split(/[\s,]+/).filter(w => w.length > 0);
    const bad = words.filter(w => !/^\d+$/.test(w) || Number(w) >= V);
    if (bad.length) {
      return {error: `Not a token id from 0 to ${V - 1}: ${bad.slice(0, 3).map(w => `"${w}"`).join(", ")}.`};
    }
    if (words.length < 2 || words.length > config.contextLength) {
      return {error: `Type 2 to ${config.contextLength} token ids (there are ${words.length}).`};
    }
    return {tokens: words.map(Number)};
  }
  function sendSequence() {
    const parsed = parseTokens(tokenBox.value);
    tokenMessage.innerHTML = parsed.error
      ? `<p class="ab-message">${escape(parsed.error)} The maps still show the last valid tokens.</p>`
      : "";
    if (parsed.tokens) {
      const preset = data.sequences.findIndex(s => s.join(" ") === parsed.tokens.join(" "));
      sequenceMenu.value = preset >= 0 ? String(preset) : "typed";
      trainer.postMessage({type: "sequence", tokens: parsed.tokens});
    }
  }
  tokenBox.addEventListener("input", sendSequence);
  sequenceMenu.addEventListener("change", () => {
    if (sequenceMenu.value !== "typed") {
      tokenBox.value = data.sequences[Number(sequenceMenu.value)].join(" ");
    }
    sendSequence();
  });

  // ---- drawing, at most once a frame ------------------------------------------------------
  let pending = false;
  function schedule() {
    if (pending) { return; }
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  }
  function draw() {
    const last = run.records[run.records.length - 1];
    if (run.options && last) {
      const elapsed = run.elapsedMs + (run.runningSince === null ? 0 : performance.now() - run.runningSince);
      const speed = elapsed > 0 ? ` ${(1000 * run.step / elapsed).toFixed(1)} steps per second.` : "";
      status.textContent = statusText(run.step, run.steps, last) +
        (run.state === "running" ? " Training..." : "") + (run.step > 0 ? speed : "");
      drawTable(last);
    }
    drawPlots();
    drawMaps();
  }
  function statusText(step, steps, record) {
    return `Step ${step} of ${steps}. On the probe: loss on the copied tokens ` +
      `${record.loss.toFixed(2)} nats (a uniform guess: ${chance.toFixed(2)}), induction ` +
      `accuracy ${(100 * record.accuracy).toFixed(1)} % (chance: ${(100 / V).toFixed(1)} %).`;
  }
  function drawTable(record) {
    root.querySelector(".ab-record-step").textContent = String(record.step);
    const rows = [];
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < H; h++) {
        const previous = record.previousToken[l][h], induction = record.induction[l][h];
        const roles = [["previous-token head", previous], ["induction head", induction]]
          .filter(pair => pair[1] >= data.threshold).map(pair => pair[0]);
        rows.push(`<tr><th scope="row">L${l}H${h}</th><td>${previous.toFixed(2)}</td>` +
                  `<td>${induction.toFixed(2)}</td><td>${roles.join(", ") || "-"}</td></tr>`);
      }
    }
    root.querySelector(".ab-head-table tbody").innerHTML = rows.join("");
  }

  // The plots: the same layout as Python's first rendering (demos/induction.py).
  const P = data.plot;
  const xOf = step => P.left + (P.width - P.left - P.right) * step / run.steps;
  const yOf = (value, top) => P.height - P.bottom -
    (P.height - P.top - P.bottom) * Math.min(Math.max(value, 0), top) / top;
  function path(steps, values, top) {
    return steps.map((s, i) => `${i ? "L" : "M"}${xOf(s).toFixed(1)},${yOf(values[i], top).toFixed(1)}`)
      .join(" ");
  }
  // The axes: the steps run to the run's last; the loss axis reaches 4 nats, or higher (up to
  // 8) when a run's loss does, so that no line is cut at the top.
  let lossTop = P.lossMax;
  function drawAxes() {
    root.querySelectorAll("svg .ab-xticks").forEach(group => {
      const ticks = [];
      for (let s = 0; s <= run.steps; s += 100) {
        ticks.push(`<text x="${xOf(s).toFixed(1)}" y="${P.height - P.bottom + 14}" ` +
                   `text-anchor="middle">${s}</text>`);
      }
      group.innerHTML = ticks.join("");
    });
    const loss = part("loss");
    const ticks = [];
    for (let v = 0; v <= lossTop; v++) {
      const y = yOf(v, lossTop).toFixed(1);
      ticks.push(`<line x1="${P.left}" x2="${P.width - P.right}" y1="${y}" y2="${y}" ` +
                 `stroke="#d0d7de"/><text x="${P.left - 4}" y="${(Number(y) + 4).toFixed(1)}" ` +
                 `text-anchor="end">${v}</text>`);
    }
    loss.querySelector(".ab-yticks").innerHTML = ticks.join("");
    const line = loss.querySelector(".ab-chance");
    line.setAttribute("y1", yOf(chance, lossTop).toFixed(1));
    line.setAttribute("y2", yOf(chance, lossTop).toFixed(1));
    const reference = loss.querySelector(".ab-ref");
    if (reference && data.reference) {
      const shown = data.reference.step.filter(s => s <= run.steps);
      reference.setAttribute("d", path(shown, data.reference.loss, lossTop));
    }
  }
  function drawPlots() {
    const loss = part("loss"), scores = part("scores");
    const steps = run.records.map(r => r.step);
    const highest = Math.max(0, ...run.batchLosses, ...run.records.map(r => r.loss));
    const top = Math.min(8, Math.max(P.lossMax, Math.ceil(highest)));
    if (top !== lossTop) {
      lossTop = top;
      drawAxes();
    }
    loss.querySelector(".ab-batch").setAttribute("d", path(
      run.batchLosses.map((_, i) => i + 1), run.batchLosses, lossTop));
    if (!steps.length) { return; }
    loss.querySelector(".ab-probe").setAttribute("d", path(steps, run.records.map(r => r.loss), lossTop));
    const last = run.records[run.records.length - 1];
    const dot = loss.querySelector(".ab-probe-now");
    dot.setAttribute("cx", xOf(last.step).toFixed(1));
    dot.setAttribute("cy", yOf(last.loss, lossTop).toFixed(1));
    scores.querySelectorAll(".ab-score").forEach(line => {
      const h = Number(line.dataset.head);
      const values = line.dataset.kind === "previous"
        ? run.records.map(r => r.previousToken[0][h]) : run.records.map(r => r.induction[L - 1][h]);
      line.setAttribute("d", path(steps, values, 1));
    });
  }

  // The maps: white (weight 0) to dark blue (weight 1); grey above the diagonal, where the
  // causal mask allows no weight; an orange circle on every induction target.
  const DARK = [8, 48, 107];
  function drawMaps() {
    const m = run.maps;
    if (!m) { return; }
    const n = m.tokens.length;
    const targets = inductionTargetsOf(m.tokens);
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < H; h++) {
        const canvas = part(`map-${l}-${h}`);
        const cell = Math.floor(canvas.width / n), size = cell * n;
        const ctx = canvas.getContext("2d");
        ctx.fillStyle = "#ffffff";
        ctx.fillRect(0, 0, canvas.width, canvas.height);
        const w = m.weights[l][h];
        for (let t = 0; t < n; t++) {
          for (let s = 0; s < n; s++) {
            if (s > t) {
              ctx.fillStyle = "#eaeef2";
            } else {
              const c = DARK.map(x => Math.round(255 + (x - 255) * w[t][s]));
              ctx.fillStyle = `rgb(${c[0]},${c[1]},${c[2]})`;
            }
            ctx.fillRect(s * cell, t * cell, cell, cell);
          }
        }
        ctx.strokeStyle = "#E69F00";
        ctx.lineWidth = Math.max(1.5, Math.min(3, cell / 5));
        let onTargets = 0, queries = 0, onPrevious = 0;
        for (let t = 0; t < n; t++) {
          let sum = 0, any = false;
          for (let s = 0; s <= t; s++) {
            if (!targets[t][s]) { continue; }
            any = true;
            sum += w[t][s];
            ctx.beginPath();
            ctx.arc((s + 0.5) * cell, (t + 0.5) * cell, cell * 0.38, 0, 2 * Math.PI);
            ctx.stroke();
          }
          if (any) { queries++; onTargets += sum; }
          if (t > 0) { onPrevious += w[t][t - 1]; }
        }
        if (size < canvas.width) {  // a short sequence leaves a margin
          ctx.fillStyle = "#ffffff";
          ctx.fillRect(size, 0, canvas.width - size, canvas.height);
          ctx.fillRect(0, size, canvas.width, canvas.height - size);
        }
        const induction = queries ? ` Weight on the induction targets, averaged over the ${queries} ` +
          `queries that have one: ${(onTargets / queries).toFixed(2)}.` : " No query has an induction target.";
        canvas.setAttribute("aria-label", `Attention weights of L${l}H${h} at step ${m.step} on ` +
          `${n} tokens (rows: queries, columns: keys).${induction} Mean weight on the previous ` +
          `token: ${(onPrevious / (n - 1)).toFixed(2)}.`);
      }
    }
  }
  function inductionTargetsOf(tokens) {  // as attention_book.heads.induction_targets
    return tokens.map((token, t) => tokens.map((_, s) => s >= 1 && s <= t && tokens[s - 1] === token));
  }

  // ---- words for a screen reader ----------------------------------------------------------
  function say(text) { live.textContent = text; }
  function describe(o) {
    return `seed ${o.seed}, learning rate ${o.lr}, ` +
      `${o.offset === null ? "random offsets" : `offset fixed at ${o.offset}`}, ` +
      `${o.rope ? "RoPE" : "learned positions"}, ${o.steps} steps`;
  }
  function headNames(record) {
    const names = [];
    for (let h = 0; h < H; h++) {
      if (record.induction[L - 1][h] >= data.threshold) { names.push(`L${L - 1}H${h}`); }
    }
    return names;
  }
  function announceNewHeads(record) {
    const fresh = headNames(record).filter(name => !run.announcedHeads.has(name));
    if (!fresh.length || record.step === 0) { return; }
    fresh.forEach(name => run.announcedHeads.add(name));
    say(`Step ${record.step}: ${fresh.join(" and ")} ${fresh.length > 1 ? "are" : "is"} now ` +
        `${fresh.length > 1 ? "induction heads" : "an induction head"} (score ${data.threshold} or more).`);
  }
  function announceEnd() {
    const last = run.records[run.records.length - 1];
    const names = headNames(last);
    say(`Finished ${run.step} steps. Loss on the probe ${last.loss.toFixed(2)}, induction ` +
        `accuracy ${(100 * last.accuracy).toFixed(1)} %; ` +
        `${names.length ? `induction heads: ${names.join(", ")}` : "no induction head"}.`);
  }
  function escape(text) {
    const table = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"};
    return String(text).replace(/[&<>"']/g, c => table[c]);
  }

  removeRunHint(root);
  startTrainer();
  reset();
}
