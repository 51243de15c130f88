"""Chapter 9's ambiguity demo in a real browser: the page computes what PyTorch computes.

The demo (``attention_book.demos.ambiguity_demo``) carries the trained classifier's weights in
the page and runs its forward pass in JavaScript. Most tests here open the demo exactly as
chapter 9 stores it (the ``text/html`` output that JupyterLab and Colab display), on a page of
its own served from 127.0.0.1, so they need no build of the book; the last ones open chapter 9
on the built website. Every request to another host is blocked and recorded.

The model is trained again here exactly as the chapter trains it, and the stored demo must be
byte for byte what ``ambiguity_demo`` makes of it: so the page carries the chapter's own
weights. Sentences are typed into the demo key by key, and what the page computed (the
``data-`` attributes it writes after each keystroke) is compared with
:func:`attention_book.demos.read_sentence`, which runs
:class:`~attention_book.train.AttentionClassifier` in PyTorch.

They also time each keystroke, check the messages (unknown words, no ambiguous word, too long)
and the notes on what an answer rests on (no cue word, several ambiguous words, no clear focus),
that the page says word for word what Python's first rendering says for the same sentence,
keyboard-only use, the label and the live region, scan the demo with axe in every state, and
save screenshots of the demo with typed sentences under ``_build/screenshots/``, with a JSON
report of the measured figures (``_build/screenshots/09_ambiguity_demo_report.json``).
"""

from __future__ import annotations

import functools
import gzip
import json
import statistics
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import torch
from axe_playwright_python.sync_playwright import Axe

from attention_book.data import encode_splits, load_ambiguity_dataset
from attention_book.demos import ambiguity_demo, export_classifier, read_sentence
from attention_book.demos.ambiguity import _ambiguous_words, _cue_words, _render_reading
from attention_book.train import AttentionClassifier, train_classifier

ROOT = Path(__file__).resolve().parents[1]
DOCNAME = "chapters/09_training_attention"
DEMO = '.ab-demo[data-demo="ambiguity"]'
DEMO_ID = "ch09-sentence-demo"  # the element_id and first sentence of the chapter's demo cell
FIRST_SENTENCE = "the minute by the clock while we saw the dust"
TOLERANCE = 1e-5  # the bound on |page - PyTorch| for probabilities and weights
FRAME_MS = 16.0  # one frame at 60 Hz: the budget of a keystroke's forward pass
INVENTED = [  # sentences of our own, each with words the model has never seen
    "It took one minute.",
    "The size was minute.",
    "We fished from the bank of the river all day",
    "A Crane lifted the steel beam onto the truck!",
    "the bat flew out of the cave at night",
    "Grandma's minute clock, ticking; then the speck of dust...",
]


@pytest.fixture(scope="module")
def report():
    """The measured figures; written to _build/screenshots/ once every test of the file ran
    (after the site fixture, which empties that folder when it starts)."""
    figures: dict = {}
    yield figures
    folder = ROOT / "_build" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "09_ambiguity_demo_report.json").write_text(
        json.dumps(figures, indent=1, sort_keys=True), encoding="utf-8")


def _stored_demo_html() -> str:
    """The demo's HTML as chapter 9 stores it: what Jupyter and Colab show."""
    notebook = json.loads((ROOT / f"{DOCNAME}.ipynb").read_text(encoding="utf-8"))
    stored = [
        "".join(output["data"]["text/html"])
        for cell in notebook["cells"] if cell["cell_type"] == "code"
        for output in cell.get("outputs", [])
        if 'data-demo="ambiguity"' in "".join(output.get("data", {}).get("text/html", ""))
    ]
    assert len(stored) == 1, f"chapter 9 stores {len(stored)} ambiguity demos, expected 1"
    return stored[0]


def _held_out_sentences(examples, per_label: int = 3) -> list[str]:
    """The first ``per_label`` test sentences of every label: 24 held-out sentences."""
    chosen: dict[str, list[str]] = {}
    for example in examples:
        if example.split == "test" and len(chosen.setdefault(example.label, [])) < per_label:
            chosen[example.label].append(example.sentence)
    return [sentence for label in sorted(chosen) for sentence in chosen[label]]


@pytest.fixture(scope="module")
def chapter_model():
    """Chapter 9's attention model, trained again exactly as section 9.4 trains it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as the chapter's setup cell does
    try:
        examples = load_ambiguity_dataset()
        vocab, labels, tensors = encode_splits(examples)
        torch.manual_seed(0)
        model = AttentionClassifier(len(vocab), len(labels), d_model=32, num_heads=4)
        train_classifier(model, tensors["train"], tensors["validation"], epochs=20, seed=0)
    finally:
        torch.set_default_dtype(previous)
    return model.eval(), vocab, labels, examples


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """The stored demo alone on a page, served from 127.0.0.1: the URL of that page."""
    folder = tmp_path_factory.mktemp("ambiguity_demo")
    (folder / "index.html").write_text(
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<title>Chapter 9: type your own sentence</title></head><body><main>"
        f"<h1>Chapter 9: type your own sentence</h1>{_stored_demo_html()}</main></body></html>",
        encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/index.html"
    server.shutdown()
    server.server_close()


def _open(browser, url: str, *, javascript: bool = True):
    """``url`` in a fresh context with every request to another host blocked and recorded."""
    local = urlsplit(url).netloc
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  java_script_enabled=javascript)
    seen = {"blocked": [], "errors": [], "finished": []}

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
    page.on("requestfinished", lambda request: seen["finished"].append(request))
    page.goto(url, wait_until="load")
    return context, page, seen


@pytest.fixture(scope="module")
def demo_page(browser, standalone):
    context, page, seen = _open(browser, standalone)
    page.wait_for_load_state("networkidle")
    # Record, after every input event, what the demo wrote (its listener runs first).
    page.evaluate("""(selector) => {
      const root = document.querySelector(selector);
      window.abTimings = [];
      root.querySelector("input").addEventListener("input", () => window.abTimings.push(
        [Number(root.dataset.forwardMs), Number(root.dataset.updateMs)]));
    }""", DEMO)
    yield page, seen
    context.close()


def _type(page, sentence: str) -> dict:
    """Empty the box, type ``sentence`` key by key, and return the demo's data attributes."""
    box = page.locator(f"{DEMO} input.ab-sentence-input")
    box.fill("")
    box.focus()
    page.keyboard.type(sentence)
    return page.evaluate("(s) => ({...document.querySelector(s).dataset})", DEMO)


def _gaps(state: dict, reading) -> tuple[float, float]:
    probabilities = torch.tensor(json.loads(state["probabilities"]), dtype=torch.float64)
    attention = torch.tensor(json.loads(state["attention"]), dtype=torch.float64)
    assert attention.shape == reading.attention.shape
    return ((probabilities - reading.probabilities).abs().max().item(),
            (attention - reading.attention).abs().max().item())


def test_the_stored_demo_is_the_chapters_trained_model(chapter_model, report):
    """Chapter 9 stores exactly what ambiguity_demo makes of the model trained as it trains it:
    the page carries the chapter's own weights, and nothing in the HTML varies between runs."""
    model, vocab, labels, _ = chapter_model
    stored = _stored_demo_html()
    again = ambiguity_demo(model, vocab, labels, element_id=DEMO_ID, sentence=FIRST_SENTENCE).data
    assert stored == again
    weights = export_classifier(model, vocab, labels)["weights"]
    assert stored.count(json.dumps(weights)) == 1
    size = len(stored.encode("utf-8"))
    report["demo_size"] = {
        "stored_output_bytes": size,
        "stored_output_gzip_bytes": len(gzip.compress(stored.encode("utf-8"), mtime=0)),
        "weights_base64_chars": len(weights),
    }
    assert size < 100_000  # the budget for what the demo adds to the page


@pytest.fixture(scope="module")
def typed(demo_page, chapter_model):
    """Type the 24 held-out and the 6 invented sentences; what the page and PyTorch computed."""
    page, _ = demo_page
    model, vocab, labels, examples = chapter_model
    held_out = _held_out_sentences(examples)
    results = []
    for sentence in held_out + INVENTED:
        state = _type(page, sentence)
        unknown_marked = page.locator(f"{DEMO} .ab-word-unknown").count()
        results.append((sentence, state, read_sentence(model, vocab, labels, sentence),
                        unknown_marked))
    timings = page.evaluate("() => window.abTimings")
    return held_out, results, timings


def test_typed_sentences_match_pytorch(demo_page, typed, report):
    _, seen = demo_page
    held_out, results, _ = typed
    assert len(held_out) == 24 and len(results) == 30
    worst = {"probability": 0.0, "attention": 0.0}
    for sentence, state, reading, unknown_marked in results:
        assert reading.status == "ok" and state["state"] == "ok", sentence
        assert json.loads(state["tokens"]) == list(reading.tokens), sentence
        assert int(state["wordIndex"]) == reading.word_index, sentence
        assert int(state["attendedIndex"]) == reading.attended_index, sentence
        assert json.loads(state["notes"]) == list(reading.notes), sentence
        if sentence in INVENTED:
            assert reading.unknown, f"{sentence!r} was meant to hold unknown words"
            assert unknown_marked == len([w for w in reading.words if w in reading.unknown])
        probability_gap, attention_gap = _gaps(state, reading)
        worst["probability"] = max(worst["probability"], probability_gap)
        worst["attention"] = max(worst["attention"], attention_gap)
    assert worst["probability"] < TOLERANCE and worst["attention"] < TOLERANCE, worst
    assert seen["blocked"] == [] and seen["errors"] == [], seen
    report["parity"] = {"sentences": len(results), "held_out": len(held_out),
                        "invented_with_unknown_words": len(INVENTED),
                        "max_abs_difference": worst}


def test_each_keystroke_is_fast(demo_page, typed, report):
    """Each keystroke's forward pass fits in one frame (16 ms at 60 Hz).

    Two measurements. In place: the time the demo itself records for the forward pass of every
    keystroke typed above (and for the forward pass plus the redraw). Those include whatever
    else this shared machine did in that moment, and performance.now() is coarsened to 0.1 ms
    in a page that is not cross-origin isolated. So, again, for every text the box held after a
    keystroke (every prefix of every typed sentence): the demo's own read(), run 5 times, the
    fastest taken, which is the cost of that keystroke's forward pass without the noise. Every
    one of those must fit in a frame.
    """
    page, _ = demo_page
    held_out, results, timings = typed
    assert len(timings) >= 1000  # one per key pressed
    forward = sorted(t[0] for t in timings)
    update = sorted(t[1] for t in timings)
    prefixes = sorted({sentence[:n] for sentence, *_ in results
                       for n in range(1, len(sentence) + 1)})
    per_keystroke = page.evaluate("""([selector, prefixes]) => {
      const read = document.querySelector(selector).abRead;
      for (let i = 0; i < 200; i++) { read(prefixes[i % prefixes.length]); }  // warm the JIT
      return prefixes.map(text => {
        let best = Infinity;
        for (let r = 0; r < 5; r++) {
          const start = performance.now();
          read(text);
          best = Math.min(best, performance.now() - start);
        }
        return best;
      });
    }""", [DEMO, prefixes])
    per_call_ms = page.evaluate("""(selector) => {
      const read = document.querySelector(selector).abRead;
      const sentence = "they talked about the clock and the hour while the minute speck";
      for (let i = 0; i < 200; i++) { read(sentence); }  // warm up the JIT
      const start = performance.now();
      for (let i = 0; i < 2000; i++) { read(sentence); }
      return (performance.now() - start) / 2000;
    }""", DEMO)
    slowest = max(range(len(prefixes)), key=lambda i: per_keystroke[i])
    figures = {
        "keystrokes_typed": len(timings),
        "in_place_forward_ms": {"median": statistics.median(forward),
                                "p95": forward[int(0.95 * (len(forward) - 1))],
                                "max": forward[-1],
                                "over_16_ms": sum(t >= FRAME_MS for t in forward)},
        "in_place_keystroke_with_redraw_ms": {"median": statistics.median(update),
                                              "p95": update[int(0.95 * (len(update) - 1))],
                                              "max": update[-1]},
        "per_keystroke_forward_ms_fastest_of_5": {
            "texts": len(prefixes), "median": statistics.median(per_keystroke),
            "max": per_keystroke[slowest], "slowest_text": prefixes[slowest]},
        "forward_ms_mean_of_2000_calls_12_words": per_call_ms,
    }
    report["timing"] = figures
    print(json.dumps(figures, indent=1))
    assert len(prefixes) > 1000
    assert max(per_keystroke) < FRAME_MS, figures
    assert per_call_ms < FRAME_MS
    assert figures["in_place_forward_ms"]["p95"] < FRAME_MS
    assert figures["in_place_keystroke_with_redraw_ms"]["median"] < FRAME_MS


def test_the_exercise_sentence_shows_what_the_checker_expects(demo_page, chapter_model):
    """Exercise 9.4 tells the reader to check the prediction in the demo: the star agrees."""
    from attention_book.exercises.ch09 import _ATTENDED_WORD, MISLEADING_SENTENCE

    page, _ = demo_page
    state = _type(page, MISLEADING_SENTENCE)
    tokens = json.loads(state["tokens"])
    assert tokens[int(state["attendedIndex"])] == _ATTENDED_WORD
    starred = page.locator(f"{DEMO} tr.ab-attended th").inner_text()
    assert _ATTENDED_WORD in starred and "★" in starred


def test_messages_for_unknown_words_no_ambiguous_word_and_too_long(demo_page, chapter_model):
    page, _ = demo_page
    model, vocab, labels, _ = chapter_model

    def message(kind):
        return page.locator(f'{DEMO} .ab-message[data-message="{kind}"]')

    state = _type(page, "")
    assert state["state"] == "empty" and message("empty").count() == 1
    assert state["probabilities"] == "" and page.locator(f"{DEMO} .ab-prediction").count() == 0

    state = _type(page, "we saw the clock near the river")
    assert state["state"] == "no-ambiguous-word"
    assert "No ambiguous word" in message("no-ambiguous-word").inner_text()
    assert "minute" in message("no-ambiguous-word").inner_text()

    long_sentence = "the minute by the clock while we saw the dust and then the speck was then there"
    assert len(long_sentence.split()) == 17
    state = _type(page, long_sentence)
    assert state["state"] == "too-long" and read_sentence(
        model, vocab, labels, long_sentence).status == "too-long"
    text = message("too-long").inner_text()
    assert "17 words" in text and "at most 16" in text and "Remove 1" in text

    state = _type(page, "the minute by the klock")
    assert state["state"] == "ok" and json.loads(state["tokens"]) == ["the", "minute", "by", "the"]
    assert "has never seen klock" in message("unknown").inner_text()
    chips = message("unknown").locator("button.ab-chip")
    assert chips.count() == 3 and chips.first.inner_text() == "clock"  # edit distance 1
    assert page.locator(f"{DEMO} details.ab-word-list").get_attribute("open") is not None
    known = page.locator(f"{DEMO} details.ab-word-list button.ab-chip")
    assert known.count() == len(vocab) - 1  # every word but <pad>
    assert sorted(known.all_inner_texts()) == sorted(vocab.itos[1:])


# The review's sentences (newcomer trial, chapter 9 demo), and a few more: each one shows a
# note, a missing star or the one message for several unknown words.
SAYS = [
    "we saw the crane",
    "I deposited my paycheck at the bank downtown",
    "The bat near the bank, by the money!",
    "the bat flew out of the cave at night",
    "It took one minute",
    "the nest near the crane near the steel",
    "bank",
]


def _python_text(page, chapter_model, sentence: str) -> str:
    """What Python's first rendering of ``sentence`` says, as the page lays it out."""
    model, vocab, labels, _ = chapter_model
    reading = read_sentence(model, vocab, labels, sentence)
    markup = _render_reading(DEMO_ID, reading, labels, list(vocab.itos[1:]),
                             _ambiguous_words(labels), model.context_length,
                             _cue_words(labels, None))
    return page.evaluate("""([selector, markup]) => {
      const scratch = document.createElement("div");
      scratch.className = "ab-demo-output";
      document.querySelector(selector).appendChild(scratch);
      scratch.innerHTML = markup;
      const text = scratch.innerText;
      scratch.remove();
      return text;
    }""", [DEMO, markup])


def test_the_page_says_what_python_says(demo_page, chapter_model):
    """For every sentence, the script's redrawing reads word for word as Python's first rendering
    (messages, notes, star, numbers): the two sides of the demo cannot drift apart."""
    page, _ = demo_page
    for sentence in SAYS + INVENTED + ["", "we saw the clock near the river", "minute " * 17]:
        _type(page, sentence)
        shown = page.locator(f"{DEMO} .ab-demo-output").inner_text()
        assert shown == _python_text(page, chapter_model, sentence), sentence


def test_the_demo_says_what_its_answer_rests_on(demo_page, chapter_model):
    """In the demo itself: no cue word, several ambiguous words, no clear focus (no star), one
    message for all unknown words, and no ambiguous word offered as a replacement."""
    page, _ = demo_page
    model, vocab, labels, _ = chapter_model

    def message(kind):
        return page.locator(f'{DEMO} .ab-message[data-message="{kind}"]')

    def starred():
        return page.locator(f"{DEMO} tr.ab-attended").count()

    state = _type(page, "we saw the crane")  # the review: crane/bird 0.998 with no evidence
    assert json.loads(state["notes"]) == ["no-cue"]
    text = message("no-cue").inner_text()
    assert "cue words the model learned for crane" in text and "nest" in text and "steel" in text
    assert "a guess" in text and starred() == 1

    state = _type(page, "I deposited my paycheck at the bank downtown")
    assert json.loads(state["notes"]) == ["no-cue", "no-clear-focus"]
    assert message("unknown").count() == 1  # one message, not one per word
    unknown = message("unknown").inner_text()
    assert all(w in unknown for w in ("deposited", "paycheck", "downtown", "my"))
    assert message("unknown").locator("button.ab-chip").count() == 3 * 6
    assert starred() == 0 and "★" not in page.locator(f"{DEMO} tbody").last.inner_text()
    summary = page.locator(f"{DEMO} .ab-prediction").inner_text()
    assert "no other word stands out" in summary and "so no word has a ★" in summary

    state = _type(page, "The bat near the bank, by the money!")
    assert json.loads(state["notes"]) == ["several-ambiguous", "no-cue"]
    assert "2 ambiguous words (bat, then bank): the model classifies only the first, bat" in (
        message("several-ambiguous").inner_text())

    _type(page, "the bat flew out of the cave at night")
    offered = message("unknown").locator("button.ab-chip").all_inner_texts()
    assert len(offered) == 9 and not set(offered) & {"minute", "bank", "bat", "crane"}, offered

    state = _type(page, "the minute by the clock")  # a cue, a clear focus, one ambiguous word
    assert json.loads(state["notes"]) == [] and starred() == 1
    assert page.locator(f"{DEMO} .ab-message").count() == 0


def test_keyboard_only_use_label_and_live_region(demo_page):
    page, _ = demo_page
    box = page.locator(f"{DEMO} input.ab-sentence-input")
    label = page.evaluate("(s) => [...document.querySelector(s).querySelector('input').labels]"
                          ".map(l => l.textContent)", DEMO)
    assert len(label) == 1 and "minute" in label[0]
    # Reach the box with the Tab key alone, from the top of the page.
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); "
                  "window.scrollTo(0, 0); }")
    for _ in range(600):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement === document.querySelector(s)"
                         ".querySelector('input')", DEMO):
            break
    else:
        pytest.fail("600 presses of Tab never reached the demo's text box")
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.type("a minute with dust because we saw the klock")
    live = page.locator(f"{DEMO} .ab-live")
    assert live.get_attribute("aria-live") == "polite"
    # The live region speaks once the reader pauses (a 400 ms debounce), so wait until it says
    # what the demo now shows: before that it still holds the previous test's sentence.
    page.wait_for_function("""(s) => {
      const root = document.querySelector(s);
      const shown = [...root.querySelectorAll('.ab-demo-output .ab-message, '
                                              + '.ab-demo-output .ab-prediction')];
      const said = shown.map(p => p.textContent).join(' ');
      return said.includes('klock') && root.querySelector('.ab-live').textContent === said;
    }""", arg=DEMO)
    assert "The model reads minute as" in live.text_content()
    assert "klock" in live.text_content()  # the unknown word is announced too
    # Tab from the box reaches the first suggestion; Enter puts it in place of the unknown word.
    page.keyboard.press("Tab")
    focused = page.evaluate("() => [document.activeElement.className, document.activeElement"
                            ".textContent]")
    assert focused == ["ab-chip", "clock"]
    page.keyboard.press("Enter")
    assert box.input_value() == "a minute with dust because we saw the clock"
    assert page.evaluate("(s) => document.activeElement === document.querySelector(s)"
                         ".querySelector('input')", DEMO)
    assert page.locator(f'{DEMO} .ab-message[data-message="unknown"]').count() == 0


def test_colours_are_colour_blind_safe_and_never_alone(demo_page):
    page, _ = demo_page
    _type(page, "the grain next to the minute while nobody spoke of the timer")
    styles = page.evaluate("""(s) => {
      const root = document.querySelector(s);
      const star = root.querySelector("tr.ab-attended th");
      return {border: getComputedStyle(root.querySelector("tr.ab-attended td")).borderTopColor,
              bar: getComputedStyle(root.querySelector(".ab-bar")).backgroundColor,
              star: star.textContent};
    }""", DEMO)
    assert styles["border"] == "rgb(230, 159, 0)"  # Okabe-Ito orange
    assert styles["bar"] == "rgb(0, 114, 178)"  # Okabe-Ito blue
    assert styles["star"].startswith("★ grain")  # a symbol and words, not colour alone
    assert "(most attention)" in styles["star"]


@pytest.mark.parametrize("sentence", [
    "the grain next to the minute while nobody spoke of the timer",
    "I deposited my paycheck at the bank downtown",
    "The bat near the bank, by the money!",
    "It took one minute and one speck",
    "we saw the clock near the river",
    "minute " * 17,
])
def test_axe_finds_nothing_in_any_state(demo_page, sentence):
    page, _ = demo_page
    _type(page, sentence)
    page.evaluate("() => { window.__abDefine = window.define; window.define = undefined; }")
    page.evaluate(Axe().axe_script)
    page.evaluate("() => { window.define = window.__abDefine; }")
    results = page.evaluate(
        "async (s) => await axe.run(document.querySelector(s), "
        "{resultTypes: ['violations'], preload: false})", DEMO)
    violations = [(v["id"], v["impact"], v["help"]) for v in results["violations"]]
    assert violations == []


def test_first_rendering_without_javascript_matches_the_script(browser, standalone):
    """Python draws the first rendering; the script redraws it on load: the same text."""
    texts = []
    for javascript in (False, True):
        context, page, seen = _open(browser, standalone, javascript=javascript)
        try:
            texts.append(page.locator(f"{DEMO} .ab-demo-output").inner_text())
            # The line for Jupyter, where an untrusted notebook's scripts do not run: shown
            # without the script, gone once it runs.
            hint = page.locator(f"{DEMO} .ab-run-hint")
            assert hint.count() == (0 if javascript else 1)
            if not javascript:
                assert hint.is_visible() and "Run this cell" in hint.inner_text()
            if javascript:
                assert page.locator(DEMO).get_attribute("data-state") == "ok"
                assert seen["errors"] == []
        finally:
            context.close()
    assert "The model reads minute as minute/time" in texts[0]
    assert texts[0] == texts[1]


# --------------------------------------------------------------------------------------
# On the built website: chapter 9 itself, offline.


@pytest.fixture(scope="module")
def chapter_page(browser, site):
    context, page, seen = _open(browser, urljoin(site.base_url, f"{DOCNAME}.html"))
    page.wait_for_load_state("networkidle")
    page.locator(DEMO).scroll_into_view_if_needed()
    yield page, seen
    context.close()


def test_the_chapter_page_runs_the_demo_offline(chapter_page, chapter_model, report):
    """On the static site, with every outside request blocked, typed sentences give PyTorch's
    numbers; the page stays under its weight budget."""
    page, seen = chapter_page
    model, vocab, labels, examples = chapter_model
    worst = 0.0
    for sentence in _held_out_sentences(examples, per_label=1) + INVENTED[:2]:
        state = _type(page, sentence)
        reading = read_sentence(model, vocab, labels, sentence)
        assert state["state"] == "ok" and json.loads(state["tokens"]) == list(reading.tokens)
        worst = max(worst, *_gaps(state, reading))
    assert worst < TOLERANCE
    assert seen["blocked"] == [] and seen["errors"] == [], seen
    transferred = 0
    for request in seen["finished"]:
        sizes = request.sizes()
        transferred += sizes["responseBodySize"] + sizes["responseHeadersSize"]
    demo_html = page.evaluate("(s) => { const root = document.querySelector(s); "
                              "return root.outerHTML + root.nextElementSibling.outerHTML; }", DEMO)
    report["chapter_page"] = {"transferred_bytes": transferred, "max_abs_difference": worst,
                              "demo_in_page_bytes": len(demo_html.encode("utf-8"))}
    assert "abRead" in demo_html  # the script is the element after the demo
    assert 0 < transferred < 3_000_000


def test_screenshots_of_the_demo_with_typed_sentences(chapter_page, chapter_model, site):
    page, _ = chapter_page
    model, vocab, labels, _ = chapter_model
    # Tall enough that the demo fits: no scrolling, so the site's sticky header stays out of it.
    page.set_viewport_size({"width": 1280, "height": 2400})
    shots = {
        "09_ambiguity_demo_typed.png": "the grain next to the minute while nobody spoke of the timer",
        "09_ambiguity_demo_bank.png": "we saw the money because the bank by the river",
        "09_ambiguity_demo_unknown_words.png": "It took one minute, said the crane driver",
        "09_ambiguity_demo_no_ambiguous_word.png": "we saw the clock near the river",
        "09_ambiguity_demo_exercise_9_4.png":
            "they talked about the clock and the hour while the minute speck",
        "09_ambiguity_demo_too_long.png":
            "the minute by the clock while we saw the dust and then the speck was then there",
    }
    for name, sentence in shots.items():
        state = _type(page, sentence)
        assert state["state"] == read_sentence(model, vocab, labels, sentence).status, sentence
        path = site.screenshots / name
        page.locator(DEMO).screenshot(path=str(path))
        assert path.stat().st_size > 10_000, name
