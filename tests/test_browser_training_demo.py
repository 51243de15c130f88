"""Chapter 15's training demo: the page trains chapter 15's model and gets PyTorch's numbers.

The demo (``attention_book.demos.induction_training_demo``) trains the attention-only TinyGPT
on the repeated-segment task in the reader's browser, with a model, a backward pass, AdamW and
torch's random generator written by hand in JavaScript (``assets/induction_train.js``).

Three kinds of test, cheapest first:

* Node.js runs the engine on its own: torch's generator gives the same batches and the same
  initial weights as PyTorch; a few steps of a RoPE, fixed-offset, other-seed run give
  ``train_on_repeats``'s records.
* Python checks the demo's HTML: its first rendering (step 0, drawn by PyTorch) and the weights'
  export.
* One visit to chapter 15 on the built website, with every request to another host blocked:
  the demo there is pressed into training with the keyboard and runs its 300 steps in a Web
  Worker while the test types a new sequence into it (the page answers, the maps follow); its
  records must equal the chapter's own PyTorch run, which the page carries (float64, to 1e-6),
  the best layer-1 head's induction score must cross ``find_heads``'s threshold, and the wall
  time is measured. The trained demo is screenshotted at desktop and phone sizes. Then the
  page's engine, started from weights exported by PyTorch in float32, trains 50 steps beside
  ``train_on_repeats`` in float32: the losses agree to a relative 1e-4. Last, Pause, Step,
  Reset and a setting are used with the keyboard.

The measured figures (wall time, steps per second, agreement) go to
``_build/screenshots/15_training_demo_report.json``.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import torch

from attention_book.demos import (
    DEMO_SETTINGS,
    demo_model,
    demo_probe,
    export_parameters,
    induction_training_demo,
    parameters_from_export,
)
from attention_book.demos.page import asset
from attention_book.heads import find_heads
from attention_book.repeat_task import repeat_loss, repeated_segments, train_on_repeats
from attention_book.train import cpu_threads

ROOT = Path(__file__).resolve().parents[1]
DOCNAME = "chapters/15_attention_in_a_model"
DEMO = '.ab-demo[data-demo="induction"]'
FLOAT32_STEPS = 50
FLOAT32_TOLERANCE = 1e-4  # the bound, relative, on the float32 losses
FLOAT64_TOLERANCE = 1e-6  # the page carries the chapter's run with 7 decimals
# Speed is measured, not asserted: 300 steps took 20 s in headless Chromium on this 2-core
# machine at a load average of 3 (the target: under 30 s), but the test command runs two
# workers on the two cores, and a shared machine may be busier still. The report records the wall time and the
# load average. What the test asserts holds under any load: the worker trains without a pause
# between steps (the wall time is its busy time, give or take), and a run never takes ten
# times the target.
TARGET_S = 30.0
TIME_LIMIT_S = 10 * TARGET_S
WAIT_MS = 300_000  # the longest any one wait may take on a busy machine
CONFIG = {"vocabSize": 32, "dModel": 32, "numHeads": 2, "numLayers": 2, "contextLength": 32,
          "segmentLen": 8, "batchSize": 64, "weightDecay": 0.01, "probeSize": 256,
          "probeSeed": 1, "recordEvery": 10, "ropeBase": 10000.0}


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is needed to run the demo's engine (it also builds the website)",
                    pytrace=False)
    return node


def _run_engine(program: str, payload: dict) -> dict:
    """Run induction_train.js and ``program`` in Node, with ``payload`` as ``input``."""
    source = (asset("induction_train.js") + "\nconst input = JSON.parse(require('fs')"
              ".readFileSync(0, 'utf8'));\nconst E = inductionEngine();\n" + program)
    result = subprocess.run([_node(), "-e", source], capture_output=True, text=True,
                            input=json.dumps(payload), timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --------------------------------------------------------------------------------------
# The engine alone, in Node.js.


def test_the_engine_draws_torchs_batches_and_initial_weights():
    """Batches: bit for bit, for any seed and offset. Initial weights: every Linear bit for
    bit; the embeddings (drawn through log, cos and sin) to the last bit or the one before."""
    cases = [(0, None), (7, 12), (2**32 - 1, None), (123456, 24)]
    out = _run_engine("""
      process.stdout.write(JSON.stringify({
        batches: input.cases.map(([seed, offset]) => {
          const g = new E.TorchGenerator(seed);
          const a = E.repeatedSegments(g, 5, 32, 8, 32, offset);
          const b = E.repeatedSegments(g, 3, 32, 8, 32, offset);  // the generator goes on
          return [a, b].map(x => ({tokens: Array.from(x.tokens), mask: Array.from(x.lossMask),
                                   first: Array.from(x.firstStart)}));
        }),
        weights: [false, true].map(rope => {
          const p = E.initialParameters({...input.config, rope}, 3);
          return Object.fromEntries(Object.entries(p).map(([k, v]) => [k, Array.from(v)]));
        }),
      }));""", {"cases": cases, "config": CONFIG})
    for (seed, offset), pages in zip(cases, out["batches"], strict=True):
        generator = torch.Generator().manual_seed(seed)
        for size, page in zip((5, 3), pages, strict=True):
            batch = repeated_segments(size, 32, 8, 32, offset=offset, generator=generator)
            assert page["tokens"] == batch.tokens.flatten().tolist(), (seed, offset)
            assert page["mask"] == batch.loss_mask.flatten().int().tolist()
            assert page["first"] == batch.first_start.tolist()
    for rope, page in zip((False, True), out["weights"], strict=True):
        state = demo_model(3, rope=rope).state_dict()
        assert list(page) == list(state)
        for name, tensor in state.items():
            got = torch.tensor(page[name], dtype=torch.float64).reshape(tensor.shape)
            if "embedding" in name:
                assert (got - tensor).abs().max() <= 1e-15, name
            else:
                assert torch.equal(got, tensor), name


def test_the_engine_trains_as_train_on_repeats_with_rope_and_a_fixed_offset():
    """The paths the browser run below does not take: RoPE, a fixed offset, another seed and
    learning rate, and a schedule of 10 steps, in float64."""
    options = {"seed": 3, "lr": 0.003, "steps": 10, "offset": 12, "rope": True}
    out = _run_engine("""
      const t = E.createTrainer({...input.config, rope: true, recordEvery: 5}, input.options);
      const records = [t.record()];
      while (t.step < t.steps) { t.trainStep(); if (t.step % 5 === 0) { records.push(t.record()); } }
      process.stdout.write(JSON.stringify(records));""", {"config": CONFIG, "options": options})
    model = demo_model(3, rope=True)
    history = train_on_repeats(model, steps=10, batch_size=64, segment_len=8, offset=12,
                               lr=0.003, seed=3, probe=demo_probe(), record_every=5)
    assert [r["step"] for r in out] == history["step"] == [0, 5, 10]
    for page, loss, accuracy, induction, previous in zip(
            out, history["loss"], history["accuracy"], history["induction"],
            history["previous_token"], strict=True):
        assert abs(page["loss"] - loss) <= 1e-12 * loss
        assert page["accuracy"] == pytest.approx(accuracy, abs=1e-12)
        assert torch.allclose(torch.tensor(page["induction"], dtype=torch.float64), induction,
                              rtol=0, atol=1e-12)
        assert torch.allclose(torch.tensor(page["previousToken"], dtype=torch.float64), previous,
                              rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------
# The Python side: the first rendering and the export.


@pytest.fixture(scope="module")
def step_0():
    """PyTorch's loss and head report at step 0 of the demo's starting run (seed 0)."""
    model, probe = demo_model(0).eval(), demo_probe()
    with torch.no_grad(), cpu_threads(1):
        loss = repeat_loss(model(probe.tokens), probe).item()
        report = find_heads(model, probe.tokens)
    return loss, report


def test_the_first_rendering_is_step_0_computed_by_pytorch(step_0):
    page = induction_training_demo(element_id="train").data
    assert page == induction_training_demo(element_id="train").data  # nothing varies
    markup = page.split("<script>")[0]
    loss, report = step_0
    assert f"Step 0 of 300. On the probe: loss on the copied tokens {loss:.2f} nats" in markup
    for layer in range(2):
        for head in range(2):
            assert (f'<th scope="row">L{layer}H{head}</th><td>{report.previous_token[layer, head]:.2f}'
                    f"</td><td>{report.induction[layer, head]:.2f}</td>") in markup
    assert markup.count("<canvas") == 4 and markup.count('role="img"') == 6
    for control in ("seed", "lr", "offset", "positions", "steps", "sequence", "tokens"):
        assert f'<label for="train-{control}">' in markup, control
    assert "fetch(" not in page and "http" not in page  # nothing from another host
    assert 'class="ab-ref"' not in markup  # no reference given, no reference line


def test_export_round_trips_and_bad_input_is_named():
    for dtype in (torch.float32, torch.float64):
        model = demo_model(5, dtype=dtype)
        payload = export_parameters(model)
        assert json.loads(json.dumps(payload)) == payload
        state = parameters_from_export(payload)
        assert state.keys() == model.state_dict().keys()
        for name, tensor in model.state_dict().items():
            assert torch.equal(state[name], tensor), name
    with pytest.raises(TypeError, match="TinyGPT, got Linear"):
        export_parameters(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="seed must be an int from 0 to 4294967295, got -1"):
        demo_model(-1)
    with pytest.raises(ValueError, match="element_id"):
        induction_training_demo(element_id="no spaces")
    with pytest.raises(TypeError, match="history of train_on_repeats"):
        induction_training_demo(element_id="x", reference={"loss": [1.0]})
    short = {"step": [0, 10], "loss": [3.0, 2.0], "accuracy": [0.0, 0.1],
             "previous_token": [torch.zeros(2, 2)] * 2, "induction": [torch.zeros(2, 2)] * 2}
    with pytest.raises(ValueError, match="steps 0 to 300"):
        induction_training_demo(element_id="x", reference=short)
    payload = export_parameters(demo_model(0))
    payload["layout"] = payload["layout"][1:]
    with pytest.raises(ValueError, match="the payload holds 11520 weights, the layout 10496"):
        parameters_from_export(payload)


# --------------------------------------------------------------------------------------
# On the built website: chapter 15, offline.


@pytest.fixture(scope="module")
def report():
    """The measured figures; written once every test of the file has run."""
    figures: dict = {}
    yield figures
    folder = ROOT / "_build" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "15_training_demo_report.json").write_text(
        json.dumps(figures, indent=1, sort_keys=True), encoding="utf-8")


@pytest.fixture(scope="module")
def chapter_page(browser, site):
    """Chapter 15 on the built site, every request to another host blocked and recorded."""
    url = urljoin(site.base_url, f"{DOCNAME}.html")
    local = urlsplit(url).netloc
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    seen = {"blocked": [], "errors": []}

    def route(route_obj):
        if urlsplit(route_obj.request.url).netloc == local:
            route_obj.continue_()
        else:
            seen["blocked"].append(route_obj.request.url)
            route_obj.abort("blockedbyclient")

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and seen["errors"].append(m.text))
    page.on("pageerror", lambda e: seen["errors"].append(f"uncaught: {e}"))
    page.goto(url, wait_until="load")
    page.wait_for_function("(s) => document.querySelector(s).dataset.state === 'ready' && "
                           "document.querySelector(s).dataset.mapsStep === '0'", arg=DEMO)
    page.locator(DEMO).scroll_into_view_if_needed()
    yield page, seen
    context.close()


@pytest.fixture(scope="module")
def float32_reference():
    """PyTorch's side of the float32 comparison: the exported weights and train_on_repeats's
    probe losses over 50 steps (the training test asks for it while the page trains)."""
    model = demo_model(0, dtype=torch.float32)
    payload = export_parameters(model)
    probe = repeated_segments(64, 32, 8, 32, generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    history = train_on_repeats(model, steps=FLOAT32_STEPS, batch_size=64, segment_len=8,
                               lr=0.01, seed=0, probe=probe, record_every=1)
    return payload, history["loss"], time.perf_counter() - start


def _state(page) -> dict:
    return page.evaluate("(s) => ({...document.querySelector(s).dataset})", DEMO)


def test_the_demo_starts_where_pytorch_does(chapter_page, step_0):
    """One demo on the page; its script ran in a worker and shows step 0 as Python drew it."""
    page, seen = chapter_page
    assert page.locator(DEMO).count() == 1
    assert page.locator(f"{DEMO} .ab-run-hint").count() == 0
    state = _state(page)
    assert state["trainer"] == "worker" and state["step"] == "0", state
    loss = step_0[0]
    status = page.locator(f"{DEMO} .ab-train-status").inner_text()
    assert status.startswith(f"Step 0 of 300. On the probe: loss on the copied tokens {loss:.2f}")
    assert seen["blocked"] == [] and seen["errors"] == [], seen


def test_the_page_trains_the_chapters_run_and_answers_while_it_trains(chapter_page, report,
                                                                      request):
    page, seen = chapter_page
    demo = page.locator(DEMO)
    reference = page.evaluate("(s) => document.querySelector(s).abReference", DEMO)
    assert reference and reference["step"][-1] == DEMO_SETTINGS["steps"]
    # How long the page's main thread goes without drawing a frame, while it trains.
    page.evaluate("""() => {
      window.abFrames = {last: performance.now(), longest: 0, count: 0};
      const tick = now => { const f = window.abFrames; f.longest = Math.max(f.longest, now - f.last);
        f.last = now; f.count++; requestAnimationFrame(tick); };
      requestAnimationFrame(tick);
    }""")
    load_before = os.getloadavg()[0]
    demo.locator('button[data-action="train"]').focus()
    start = time.perf_counter()
    page.keyboard.press("Enter")  # a reader's key press
    # While the page trains, PyTorch's float32 run of the next test (Python would only wait).
    request.getfixturevalue("float32_reference")
    page.wait_for_function("(s) => Number(document.querySelector(s).dataset.step) >= 20", arg=DEMO)
    # The page answers while the model trains: a typed sequence is in the maps a moment later.
    page.evaluate("() => { window.abFrames.longest = 0; }")  # from here on, training is steady
    typed = "5 9 2 7 30 5 9 2 7 30 5 9"
    box = demo.locator("input.ab-token-input")
    box.fill("")
    box.focus()
    page.keyboard.type(typed)
    typed_at = time.perf_counter()
    page.wait_for_function("([s, typed]) => document.querySelector(s).dataset.mapsTokens === typed",
                           arg=[DEMO, typed])
    answer_s = time.perf_counter() - typed_at
    during = _state(page)
    assert during["state"] == "running", during
    page.wait_for_function("(s) => document.querySelector(s).dataset.state === 'done'", arg=DEMO,
                           timeout=1000 * TIME_LIMIT_S)
    wall_s = time.perf_counter() - start
    state = _state(page)
    frames = page.evaluate("() => window.abFrames")
    history = page.evaluate("(s) => document.querySelector(s).abHistory", DEMO)
    # The chapter's run, record for record (the page also records where it was paused: none).
    assert [r["step"] for r in history] == reference["step"]
    worst = 0.0
    for i, record in enumerate(history):
        for key, ref_key in (("loss", "loss"), ("accuracy", "accuracy")):
            worst = max(worst, abs(record[key] - reference[ref_key][i]))
        for key in ("induction", "previousToken"):
            got = torch.tensor(record[key], dtype=torch.float64)
            worst = max(worst, (got - torch.tensor(reference[key][i], dtype=torch.float64))
                        .abs().max().item())
    assert worst < FLOAT64_TOLERANCE, worst
    threshold = inspect.signature(find_heads).parameters["threshold"].default
    best = [max(r["induction"][-1]) for r in history]
    crossed = next((r["step"] for r, b in zip(history, best, strict=True) if b >= threshold), None)
    assert best[-1] >= threshold and crossed is not None, best
    assert state["mapsTokens"] == typed and state["mapsStep"] == "300"
    assert demo.locator("table.ab-head-table").inner_text().count("induction head") >= 1
    assert seen["blocked"] == [] and seen["errors"] == [], seen
    busy_s = int(state["busyMs"]) / 1000
    figures = {
        "wall_s_300_steps": round(wall_s, 2),
        "page_elapsed_s": round(int(state["elapsedMs"]) / 1000, 2),
        "worker_busy_s": round(busy_s, 2),
        "steps_per_s": round(300 / wall_s, 1),
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "typed_sequence_in_maps_after_s": round(answer_s, 3),
        "longest_frame_gap_while_training_ms": round(frames["longest"], 1),
        "frames_while_training": frames["count"],
        "float64_max_abs_difference_to_the_chapters_run": worst,
        "best_layer1_induction_score_first_reaches_threshold_at_step": crossed,
        "best_layer1_induction_score_at_300": round(best[-1], 3),
    }
    report["training"] = figures
    print(json.dumps(figures, indent=1))
    assert answer_s < 10  # within a few steps, however busy the machine
    assert wall_s < 1.2 * busy_s + 3 and wall_s < TIME_LIMIT_S, figures


def test_screenshots_on_a_desktop_and_a_phone(chapter_page, site):
    """The demo after a run, at 1280 and 390 px: nothing wider than the screen, nothing cut."""
    page, _ = chapter_page
    demo = page.locator(DEMO)
    for width, height, name in ((1280, 2400, "15_training_demo.png"),
                                (390, 3600, "15_training_demo_phone.png")):
        page.set_viewport_size({"width": width, "height": height})
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        shown = page.evaluate("""(s) => {
          const root = document.querySelector(s), width = document.documentElement.clientWidth;
          const cut = [...root.querySelectorAll("button, select, input, label, th, td, canvas, svg")]
            .filter(el => { const r = el.getBoundingClientRect();
                            return r.width > 0 && (r.left < -0.5 || r.right > width + 0.5); })
            .map(el => el.tagName + " " + (el.id || el.textContent.trim().slice(0, 30)));
          return {width, scrollWidth: document.documentElement.scrollWidth, cut};
        }""", DEMO)
        assert shown["scrollWidth"] <= shown["width"] and shown["cut"] == [], shown
        path = site.screenshots / name
        demo.screenshot(path=str(path))
        assert path.stat().st_size > 20_000, name
    assert demo.locator(".ab-train-status").inner_text().startswith("Step 300 of 300.")


def test_the_page_agrees_with_pytorch_in_float32(chapter_page, report, float32_reference):
    """From PyTorch's float32 initial weights, exported by the package, the page's engine and
    train_on_repeats train 50 steps on the same batches: their probe losses agree to 1e-4."""
    page, _ = chapter_page
    payload, losses, torch_s = float32_reference
    out = page.evaluate("""([s, config, payload, steps]) => {
      const E = document.querySelector(s).abEngine();
      const bytes = Uint8Array.from(atob(payload.weights), c => c.charCodeAt(0));
      const view = new DataView(bytes.buffer), parameters = {};
      let offset = 0;
      for (const [name, shape] of payload.layout) {
        const n = shape.reduce((a, b) => a * b, 1), values = new Float64Array(n);
        for (let i = 0; i < n; i++) { values[i] = view.getFloat32(4 * (offset + i), true); }
        parameters[name] = values;
        offset += n;
      }
      const t = E.createTrainer({...config, probeSize: 64, rope: false},
                                {seed: 0, lr: 0.01, steps, offset: null, parameters});
      const start = performance.now();
      const losses = [t.record().loss];
      while (t.step < steps) { t.trainStep(); losses.push(t.record().loss); }
      return {losses, ms: performance.now() - start};
    }""", [DEMO, CONFIG, payload, FLOAT32_STEPS])
    assert payload["dtype"] == "float32" and len(out["losses"]) == FLOAT32_STEPS + 1
    reference = torch.tensor(losses, dtype=torch.float64)
    relative = ((torch.tensor(out["losses"], dtype=torch.float64) - reference).abs() / reference)
    report["float32"] = {"steps": FLOAT32_STEPS, "max_relative_difference": relative.max().item(),
                         "page_s": round(out["ms"] / 1000, 2), "pytorch_s": round(torch_s, 2)}
    assert relative.max() < FLOAT32_TOLERANCE, relative.max()


def test_pause_step_and_reset_with_the_keyboard(chapter_page):
    page, seen = chapter_page
    demo = page.locator(DEMO)

    def press(action):
        demo.locator(f'button[data-action="{action}"]').focus()
        page.keyboard.press("Enter")

    press("reset")
    page.wait_for_function("(s) => document.querySelector(s).dataset.state === 'ready' && "
                           "document.querySelector(s).dataset.step === '0'", arg=DEMO)
    assert page.evaluate("(s) => document.querySelector(s).abHistory.length", DEMO) == 1
    press("step")
    page.wait_for_function("(s) => document.querySelector(s).dataset.step === '1' && "
                           "document.querySelector(s).dataset.state === 'ready'", arg=DEMO)
    steps = page.evaluate("(s) => document.querySelector(s).abHistory.map(r => r.step)", DEMO)
    assert steps == [0, 1]  # a step records, so the table shows where the model is
    assert "at step 1" in demo.locator("table.ab-head-table caption").inner_text()
    press("train")
    page.wait_for_function("(s) => Number(document.querySelector(s).dataset.step) >= 3", arg=DEMO)
    # Train is now disabled: the focus moved to Pause, so Enter pauses.
    assert page.evaluate("() => document.activeElement.dataset.action") == "pause"
    page.keyboard.press("Enter")
    page.wait_for_function("(s) => document.querySelector(s).dataset.state === 'ready'", arg=DEMO)
    paused = int(_state(page)["step"])
    assert paused >= 3
    assert demo.locator('button[data-action="train"]').is_enabled()
    # A setting changed with the keyboard starts a new run.
    demo.locator("select[data-setting='positions']").focus()
    page.keyboard.press("ArrowDown")
    page.wait_for_function("(s) => document.querySelector(s).abHistory.length === 1 && "
                           "document.querySelector(s).dataset.state === 'ready'", arg=DEMO)
    assert demo.locator(".ab-live").inner_text().startswith("New settings: seed 0")
    assert "RoPE" in demo.locator(".ab-live").inner_text()
    assert seen["errors"] == [], seen
