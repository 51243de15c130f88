"""The demos' JavaScript and CSS files on their own: shipped, parsed, and (chapter 9's model) run.

The kernel-free demos keep their scripts and styles in ``src/attention_book/demos/assets/``.
Node.js (which the website's build needs anyway, for ``npm ci``) parses every ``.js`` file of
the package and of the website's ``_static/`` (``node --check``), and runs chapter 9's model
script on its own, without a page, against :func:`attention_book.demos.read_sentence`. The
browser tests (``tests/test_browser*.py``) run the scripts in their pages.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

from attention_book.data import encode_splits, load_ambiguity_dataset
from attention_book.demos import CLEAR_FOCUS, export_classifier, read_sentence
from attention_book.demos.ambiguity import _cue_words
from attention_book.demos.page import asset
from attention_book.train import AttentionClassifier

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "src" / "attention_book" / "demos" / "assets"
SCRIPTS = sorted(ASSETS.glob("*.js")) + sorted((ROOT / "_static").glob("*.js"))


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is needed to check the demos' scripts (it also builds the website: "
                    "install nodejs and npm)", pytrace=False)
    return node


def test_the_assets_are_package_data():
    """Every asset file is shipped in the wheel (pyproject.toml) and found by the package."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # no tomllib on 3.10
    section = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    line = re.search(r'^"attention_book\.demos"\s*=\s*(\[.*\])\s*$', section, re.M)
    patterns = json.loads(line[1])
    files = sorted(p.name for p in ASSETS.iterdir() if p.is_file())
    assert {"common.js", "demo.css", "ambiguity.js", "ambiguity.css", "temperature.js",
            "mask_editor.js", "query_picker.js"} <= set(files)
    for name in files:
        assert any(fnmatch(f"assets/{name}", pattern) for pattern in patterns), name
        assert asset(name) == (ASSETS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_script_parses_on_its_own(script):
    result = subprocess.run([_node(), "--check", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


_RUN_MODEL = """
const CELL_RGB = [86, 180, 233];
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const model = ambiguityModel(input.data);
process.stdout.write(JSON.stringify(input.sentences.map(sentence => {
  const r = model.read(sentence);
  return {...r, suggestions: r.unknown.map(model.suggestions)};
})));
"""

SENTENCES = [
    "The Minute, by the clock; while we saw zzz dust!",
    "we saw the crane",
    "I deposited my paycheck at the bank downtown",
    "The bat near the bank, by the money!",
    "the bat flew out of the cave at night",
    "bank",
    "minute minute",
    "the minute " + "and the dust " * 4,
    "",
    "we saw the river",
    "minute " * 17,
]


def test_the_model_script_reads_as_pytorch_does():
    """ambiguity.js's model, run by Node, gives read_sentence's reading and notes for each
    sentence, and never suggests an ambiguous word as a replacement."""
    vocab, labels, _ = encode_splits(load_ambiguity_dataset())
    torch.manual_seed(3)
    model = AttentionClassifier(len(vocab), len(labels), dtype=torch.float64).eval()
    data = {"model": export_classifier(model, vocab, labels), "cues": _cue_words(labels, None),
            "focus": CLEAR_FOCUS}
    program = asset("common.js") + asset("ambiguity.js") + _RUN_MODEL
    result = subprocess.run([_node(), "-e", program], capture_output=True, text=True,
                            input=json.dumps({"data": data, "sentences": SENTENCES}))
    assert result.returncode == 0, result.stderr
    pages = json.loads(result.stdout)
    ambiguous = {label.split("/")[0] for label in labels}
    seen_notes = set()
    for sentence, page in zip(SENTENCES, pages, strict=True):
        reading = read_sentence(model, vocab, labels, sentence)
        assert page["status"] == reading.status, sentence
        assert page["tokens"] == list(reading.tokens) and page["unknown"] == list(reading.unknown)
        assert page["wordIndex"] == reading.word_index
        assert page["attendedIndex"] == reading.attended_index
        assert page["ambiguousIndices"] == list(reading.ambiguous_indices)
        assert page["cueIndices"] == list(reading.cue_indices)
        assert page["notes"] == list(reading.notes), sentence
        seen_notes.update(reading.notes)
        if reading.status == "ok":
            gap = (torch.tensor(page["probabilities"]) - reading.probabilities).abs().max()
            assert gap < 1e-5
        for suggested in page["suggestions"]:
            assert len(suggested) == 3 and not ambiguous & set(suggested), suggested
    assert seen_notes == {"several-ambiguous", "no-cue", "no-clear-focus"}
