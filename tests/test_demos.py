"""The kernel-free demos: deterministic HTML, correct first rendering, clear errors.

Their JavaScript is exercised in a real browser by the browser tests.
"""

from __future__ import annotations

import re

import pytest
import torch

from attention_book import softmax
from attention_book.demos import mask_editor_demo, query_picker_demo, temperature_demo

TOKENS = ["It", "took", "one", "minute"]


def test_temperature_demo_first_rendering_is_the_softmax():
    scores = torch.tensor([2.0, 1.0, 0.5, -1.0])
    page = temperature_demo(scores, TOKENS, element_id="t-demo", temperature=2.0).data
    expected = softmax(scores / 2.0)
    shown = [float(v) for v in re.findall(r'id="t-demo-w-\d">([0-9.]+)<', page)]
    assert shown == pytest.approx(expected.tolist(), abs=1e-4)
    assert 'class="ab-demo"' in page and 'data-demo="temperature"' in page
    assert '<input type="range" id="t-demo-slider"' in page and 'for="t-demo-slider"' in page


def test_mask_editor_first_rendering_uses_the_mask():
    torch.manual_seed(0)
    scores = torch.randn(3, 3)
    mask = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    page = mask_editor_demo(scores, TOKENS[:3], element_id="m", mask=mask).data
    expected = softmax(scores.double().round(decimals=6).masked_fill(~mask, float("-inf")))
    shown = [float(v) for v in re.findall(r'id="m-w-\d-\d" style="[^"]*">([0-9.]+)<', page)]
    assert shown == pytest.approx(expected.flatten().tolist(), abs=1e-3)
    assert page.count('class="ab-mask-cell"') == 9
    assert len(re.findall(r'aria-pressed="true" aria-label', page)) == 4


def test_query_picker_context_vector():
    inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64]])
    page = query_picker_demo(inputs, ["Your", "journey", "starts"], element_id="q", query_index=1).data
    weights = softmax(inputs @ inputs[1])
    context = weights @ inputs
    shown = re.search(r'id="q-context">\[([^\]]+)\]', page).group(1)
    assert [float(v) for v in shown.split(",")] == pytest.approx(context.tolist(), abs=1e-4)


def test_demos_are_deterministic():
    scores = torch.tensor([0.3, 0.1, 0.2, 0.4])
    first = temperature_demo(scores, TOKENS, element_id="same").data
    assert first == temperature_demo(scores.clone(), TOKENS, element_id="same").data
    assert "uuid" not in first.lower()


def test_bad_input():
    with pytest.raises(ValueError, match="got 3 tokens but scores has 4 positions"):
        temperature_demo(torch.zeros(4), TOKENS[:3], element_id="a")
    with pytest.raises(ValueError, match="element_id"):
        temperature_demo(torch.zeros(4), TOKENS, element_id="1 bad id")
    with pytest.raises(ValueError, match=r"square \(T, T\), got shape \(2, 3\)"):
        mask_editor_demo(torch.zeros(2, 3), TOKENS[:2], element_id="a")
    with pytest.raises(TypeError, match="boolean"):
        mask_editor_demo(torch.zeros(2, 2), TOKENS[:2], element_id="a", mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"2 dims, got shape \(3,\)"):
        query_picker_demo(torch.zeros(3), TOKENS[:3], element_id="a")
    with pytest.raises(TypeError, match="floating-point"):
        temperature_demo(torch.tensor([1, 2]), TOKENS[:2], element_id="a")
    with pytest.raises(ValueError, match="min_temperature"):
        temperature_demo(torch.zeros(2), TOKENS[:2], element_id="a", temperature=0.0)


@pytest.mark.parametrize("demo", ["temperature", "query_picker"])
def test_weight_columns_are_headed_weight_never_value(demo):
    """In this book "value" means V: the numbers in a column of weights are headed "weight"."""
    if demo == "temperature":
        page = temperature_demo(torch.tensor([1.0, 0.0]), TOKENS[:2], element_id="h").data
    else:
        page = query_picker_demo(torch.eye(2), TOKENS[:2], element_id="h").data
    headers = re.findall(r'<th scope="col">([^<]*)</th>', page)
    assert "value" not in headers
    assert headers[-2:] == ["weight as a bar", "weight"]
    numbers = re.findall(r'<td id="h-w-\d">([0-9.]+)</td></tr>', page)
    assert len(numbers) == 2  # the last column of every row is the weight, as a number


@pytest.mark.parametrize("demo", ["temperature", "mask_editor", "query_picker"])
def test_an_inert_demo_says_to_run_the_cell_and_its_script_removes_that_line(demo):
    """In a notebook whose scripts do not run (an untrusted one in Jupyter), one line says how
    to bring the demo to life; the script, which runs on the website, removes it first thing."""
    tokens = TOKENS[:2]
    if demo == "temperature":
        page = temperature_demo(torch.tensor([1.0, 0.0]), tokens, element_id="d").data
    elif demo == "mask_editor":
        page = mask_editor_demo(torch.zeros(2, 2), tokens, element_id="d").data
    else:
        page = query_picker_demo(torch.eye(2), tokens, element_id="d").data
    markup, script = page.split("<script>")
    assert markup.count('class="ab-run-hint"') == 1 and "Run this cell" in markup
    assert "function removeRunHint(root)" in script and "removeRunHint(root);" in script
    assert markup.index("ab-run-hint") < markup.index("ab-demo-output")  # not in what changes
