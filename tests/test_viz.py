"""attention_book.viz: labelled heatmaps and deterministic bertviz views."""

from __future__ import annotations

import json
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attention_book import MultiHeadAttention  # noqa: E402
from attention_book.viz import head_view, model_view, plot_attention, plot_heads  # noqa: E402

TOKENS = ["It", "took", "one", "minute", "."]


@pytest.fixture
def weights():
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 8, num_heads=2, causal=False)
    with torch.no_grad():
        _, attn_weights = layer(torch.randn(1, len(TOKENS), 8), return_weights=True)
    return attn_weights  # (1, 2, 5, 5)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


# --- plot_attention ---------------------------------------------------------------------------


def test_plot_attention_labels_title_colourbar(weights):
    ax = plot_attention(weights[0, 0], TOKENS)
    assert [t.get_text() for t in ax.get_xticklabels()] == TOKENS
    assert [t.get_text() for t in ax.get_yticklabels()] == TOKENS
    assert ax.get_title() == "Attention weights (5 queries x 5 keys)"
    assert "key" in ax.get_xlabel() and "query" in ax.get_ylabel()
    assert ax.images[0].get_cmap().name == "viridis"
    colorbars = [a for a in ax.figure.axes if a is not ax]
    assert len(colorbars) == 1 and colorbars[0].get_ylabel() == "attention weight"


def test_plot_attention_annotates_and_accepts_query_tokens():
    rect = torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]])  # (T_q=3, T_k=2)
    ax = plot_attention(rect, ["a", "b"], query_tokens=["x", "y", "z"], annotate=True,
                        title="custom", cmap="cividis", colorbar=False)
    assert [t.get_text() for t in ax.texts] == ["0.25", "0.75", "0.50", "0.50", "1.00", "0.00"]
    assert ax.get_title() == "custom" and len(ax.figure.axes) == 1
    assert ax.images[0].get_cmap().name == "cividis"


def test_plot_attention_draws_on_given_axes(weights):
    fig, ax = plt.subplots()
    assert plot_attention(weights[0, 1], TOKENS, ax=ax) is ax


@pytest.mark.parametrize(
    ("bad", "tokens", "error", "message"),
    [
        (torch.rand(5, 5), TOKENS[:4], ValueError, "got 4 key tokens but the weights have 5"),
        (torch.rand(1, 5, 5), TOKENS, ValueError, r"\(T_q, T_k\) matrix, got shape \(1, 5, 5\)"),
        ([[0.5, 0.5]], ["a", "b"], TypeError, "must be a torch.Tensor"),
        (torch.rand(2, 2), "ab", TypeError, "list of strings"),
    ],
)
def test_plot_attention_rejects_bad_input(bad, tokens, error, message):
    with pytest.raises(error, match=message):
        plot_attention(bad, tokens)


def test_plot_attention_checks_query_tokens():
    with pytest.raises(ValueError, match="got 2 query tokens but the weights have 3"):
        plot_attention(torch.rand(3, 2), ["a", "b"], query_tokens=["x", "y"])


# --- plot_heads -------------------------------------------------------------------------------


def test_plot_heads_one_panel_per_head_and_shared_scale():
    weights = torch.softmax(torch.randn(5, 4, 4), dim=-1)  # (num_heads=5, T, T)
    axes = plot_heads(weights, list("abcd"), ncols=3, title="five heads")
    assert axes.shape == (2, 3)
    visible = [ax for ax in axes.flat if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == [f"head {h}" for h in range(5)]
    assert not axes.flat[5].get_visible()
    limits = {ax.images[0].get_clim() for ax in visible}
    assert len(limits) == 1  # one colour scale for every head
    assert axes.flat[0].figure.get_suptitle() == "five heads"


def test_plot_heads_rejects_wrong_names_and_tokens(weights):
    with pytest.raises(ValueError, match="got 1 head_names for 2 heads"):
        plot_heads(weights, TOKENS, head_names=["only one"])
    with pytest.raises(ValueError, match="got 3 tokens but the weights have 5 positions"):
        plot_heads(weights, TOKENS[:3])


# --- head_view / model_view -------------------------------------------------------------------


def _params(html: str) -> dict:
    match = re.search(r"const params = (\{.*?\}); // HACK", html, re.S)
    assert match, "bertviz parameters not found"
    return json.loads(match.group(1))


def test_head_view_is_deterministic_and_has_no_random_id(weights):
    first = head_view(weights, TOKENS).data
    second = head_view(weights.clone(), list(TOKENS)).data
    assert first == second
    assert not re.search(r"bertviz-[0-9a-f]{32}", first)
    assert re.search(r'id="bertviz-head-view-[0-9a-f]{12}"', first)


def test_head_view_uses_given_element_id_and_rounded_weights(weights):
    html = head_view(weights, TOKENS, element_id="ch08-demo").data
    assert 'id="bertviz-ch08-demo"' in html
    params = _params(html)
    assert params["root_div_id"] == "bertviz-ch08-demo"
    attn = torch.tensor(params["attention"][0]["attn"], dtype=torch.float64)  # (layers, heads, T, T)
    assert attn.shape == (1, 2, 5, 5)
    torch.testing.assert_close(attn, weights.double().round(decimals=4), rtol=0, atol=1e-12)
    assert params["attention"][0]["left_text"] == TOKENS


def test_different_inputs_get_different_default_ids(weights):
    one = re.search(r'id="(bertviz-head-view-[0-9a-f]+)"', head_view(weights, TOKENS).data).group(1)
    other_tokens = ["The", "size", "was", "minute", "."]
    two = re.search(r'id="(bertviz-head-view-[0-9a-f]+)"', head_view(weights, other_tokens).data).group(1)
    assert one != two


def test_head_view_accepts_lists_and_three_dim_layers(weights):
    html = head_view([weights[0], weights[0]], TOKENS, element_id="two-layers", layer=1,
                     heads=[0]).data
    params = _params(html)
    assert torch.tensor(params["attention"][0]["attn"]).shape == (2, 2, 5, 5)
    assert params["layer"] == 1 and params["heads"] == [0]


def test_model_view_is_deterministic(weights):
    html = model_view((weights, weights), TOKENS, element_id="mv").data
    assert html == model_view([weights, weights], TOKENS, element_id="mv").data
    assert 'id="bertviz-mv"' in html and not re.search(r"bertviz-[0-9a-f]{32}", html)
    assert _params(html)["display_mode"] == "light"


@pytest.mark.parametrize("view", [head_view, model_view])
@pytest.mark.parametrize(
    ("attentions", "tokens", "error", "message"),
    [
        ("weights", TOKENS[:4], ValueError, "got 4 tokens but the weights have 5 positions"),
        ("matrix", TOKENS, ValueError, r"shape \(5, 5\); expected \(1, num_heads, T, T\)"),
        ("batch", TOKENS, ValueError, "has a batch of 2"),
        ("rect", TOKENS, ValueError, "not self-attention"),
        ("mixed", TOKENS, ValueError, "every layer needs the same heads and tokens"),
        ("empty", TOKENS, TypeError, "non-empty list"),
        ("array", TOKENS, TypeError, "layer 0 must be a torch.Tensor"),
    ],
)
def test_views_reject_bad_input(view, weights, attentions, tokens, error, message):
    bad = {
        "weights": weights,
        "matrix": weights[0, 0],
        "batch": weights.expand(2, -1, -1, -1),
        "rect": weights[..., :4],
        "mixed": [weights, weights[:, :1]],
        "empty": [],
        "array": [weights.numpy()],
    }[attentions]
    with pytest.raises(error, match=message):
        view(bad, tokens)


@pytest.mark.parametrize("element_id", ["1starts-with-digit", "has space", "", "quote\""])
def test_views_reject_bad_element_ids(weights, element_id):
    with pytest.raises(ValueError, match="element_id must start with a letter"):
        head_view(weights, TOKENS, element_id=element_id)


def test_view_options_are_checked(weights):
    with pytest.raises(ValueError, match=r"layer must lie in \[0, 1\)"):
        head_view(weights, TOKENS, layer=3)
    with pytest.raises(ValueError, match="display_mode must be 'light' or 'dark'"):
        model_view(weights, TOKENS, display_mode="blue")


def test_pipeline_highlights_the_stages_asked_for():
    from attention_book.viz import PIPELINE_STAGES, plot_attention_pipeline

    ax = plot_attention_pipeline(["scale", "mask"])
    fills = {patch.get_gid(): patch.get_facecolor() for patch in ax.patches if patch.get_gid()}
    assert {gid.removeprefix("stage-") for gid in fills} == set(PIPELINE_STAGES)
    orange = fills["stage-scale"]
    assert fills["stage-mask"] == orange and fills["stage-softmax"] != orange
    assert "scale, mask" in ax.get_title()
    texts = " ".join(text.get_text() for text in ax.texts)
    assert "(B, num_heads, T, T)" in texts and "(B, T, d_in)" in texts
    plt.close(ax.figure)


def test_pipeline_refuses_an_unknown_stage():
    from attention_book.viz import plot_attention_pipeline

    with pytest.raises(ValueError, match="unknown stages \\['softmaxx'\\]"):
        plot_attention_pipeline(["softmaxx"])


@pytest.mark.parametrize("view", [head_view, model_view])
def test_an_inert_view_says_to_run_the_cell_and_its_script_removes_that_line(weights, view):
    """A stored view in a notebook whose scripts do not run shows one line saying to run the
    cell; the script after the view removes it."""
    html = view(weights, TOKENS, element_id="hinted").data
    assert html.startswith('<p id="bertviz-hinted-hint"') and "Run this cell" in html
    assert html.count("bertviz-hinted-hint") == 2  # the line, and the script that removes it
    assert html.rstrip().endswith("hint.remove(); } })();</script>")
