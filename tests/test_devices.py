"""Every public function and module follows the device and dtype of its inputs or parameters.

Two kinds of test:

* **On a device** (the ``device`` fixture: the CPU in the test command, CUDA under
  ``make test-gpu``), in float32, float64 and bfloat16: results come back on the inputs'
  device and in their dtype, and they equal the float32/float64 reference within a
  tolerance that fits the dtype.
* **Factories that forget the device**, caught without a GPU: the call runs on CPU inputs
  while torch's *default* device is ``meta``. A tensor created inside the package without
  ``device=`` (the slip that made ``diagnose`` call a healthy CUDA layer broken) then lands
  on ``meta`` and the call fails, so these tests would have caught it.
"""

from __future__ import annotations

import contextlib
import copy
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import attention_book as ab  # noqa: E402
from attention_book import bug_zoo  # noqa: E402
from attention_book.data import encode_splits, load_ambiguity_dataset  # noqa: E402
from attention_book.diagnose import diagnose  # noqa: E402
from attention_book.exercises import check_row_normalise  # noqa: E402
from attention_book.heads import hand_built_induction_model  # noqa: E402
from attention_book.repeat_task import (  # noqa: E402
    induction_accuracy,
    repeated_segments,
    train_on_repeats,
)
from attention_book.train import (  # noqa: E402
    AttentionClassifier,
    AveragingClassifier,
    evaluate_accuracy,
    mean_attention_to,
    train_classifier,
)

DTYPES = [torch.float32, torch.float64, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}


def _randn(*shape, device, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def _same_place(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> None:
    assert tensor.device.type == device.type, (tensor.device, device)
    assert tensor.dtype == dtype, (tensor.dtype, dtype)


def _close(actual, expected, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=tol, rtol=tol)


@pytest.fixture(scope="module")
def tensors():
    _, _, tensors = encode_splits(load_ambiguity_dataset())
    return tensors


# --------------------------------------------------------------------------- on a device


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_core_functions_stay_on_the_inputs_device(device, dtype):
    query, key, value = (_randn(2, 3, 5, 8, device=device, dtype=dtype, seed=s) for s in (0, 1, 2))
    mask = ab.causal_mask(5, device=device)  # (T, T)
    _same_place(mask, device, torch.bool)
    output, weights = ab.scaled_dot_product_attention(query, key, value, mask)
    _same_place(output, device, dtype)
    _same_place(weights, device, dtype)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double(), value.double(), attn_mask=mask)
    _close(output, reference, dtype)
    _same_place(ab.softmax(query), device, dtype)
    padding = ab.padding_mask(torch.tensor([5, 2], device=device), 5)
    _same_place(padding, device, torch.bool)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_layers_and_kv_cache_follow_their_parameters(device, dtype, num_kv_heads):
    torch.manual_seed(0)
    naive = ab.GroupedQueryAttention(16, 16, 4, num_kv_heads, context_length=8).to(device, dtype)
    fused = ab.GroupedQueryAttention(16, 16, 4, num_kv_heads, context_length=8,
                                     backend="sdpa").to(device, dtype)
    fused.load_state_dict(naive.state_dict())
    x = _randn(2, 7, 16, device=device, dtype=dtype)
    with torch.no_grad():
        full = naive(x)
        _same_place(full, device, dtype)
        _close(fused(x), full, dtype)
        cache = ab.KVCache(8)
        steps = [fused(x[:, t:t + 1], kv_cache=cache) for t in range(7)]
    _same_place(cache.keys, device, dtype)
    _close(torch.cat(steps, dim=1), full, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiled_attention_matches_the_fused_kernel(device, dtype):
    query, key, value = (_randn(1, 2, 40, 8, device=device, dtype=dtype, seed=s) for s in (3, 4, 5))
    output = ab.tiled_attention(query, key, value, block_size=16, is_causal=True)
    _same_place(output, device, dtype)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double(), value.double(), is_causal=True)
    _close(output, reference, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_windows_and_sinks_follow_their_inputs(device, dtype):
    query, key, value = (_randn(2, 3, 20, 8, device=device, dtype=dtype, seed=s) for s in (6, 7, 8))
    window = ab.sliding_window_mask(20, 5, device=device)  # (T, T)
    _same_place(window, device, torch.bool)
    sink = torch.tensor([0.5, -1.0, 0.2]).to(device=device, dtype=dtype)  # (H,)
    output, weights = ab.scaled_dot_product_attention(query, key, value, window, sink_logit=sink)
    _same_place(output, device, dtype)
    _same_place(weights, device, dtype)
    reference, _ = ab.scaled_dot_product_attention(
        query.double().cpu(), key.double().cpu(), value.double().cpu(), window.cpu(),
        sink_logit=sink.double().cpu())
    _close(output, reference, dtype)
    tiled = ab.tiled_attention(query, key, value, block_size=8, window=5, sink_logit=sink)
    _same_place(tiled, device, dtype)
    _close(tiled, reference, dtype)
    _same_place(ab.tiled_attention(query, key, value, block_size=8, is_causal=True, sink_logit=0.3),
                device, dtype)
    _same_place(ab.softmax_with_sink(query, 0.3), device, dtype)
    rule = ab.mods.sliding_window(5)
    _same_place(ab.mods.materialize(rule, 1, 1, 20, device=device), device, torch.bool)
    scores = ab.mods.apply_score_mod(query @ key.transpose(-2, -1), ab.mods.alibi(3, device=device))
    _same_place(scores, device, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_sink_and_latent_layers_follow_their_parameters(device, dtype, backend):
    torch.manual_seed(0)
    layers = {
        "gqa": ab.GroupedQueryAttention(16, 16, 4, 2, context_length=8, sink=True, backend=backend),
        "latent": ab.MultiHeadLatentAttention(16, 16, 4, 6, context_length=8, sink=True,
                                              backend=backend),
    }
    x = _randn(2, 7, 16, device=device, dtype=dtype)
    for layer in layers.values():
        with torch.no_grad():
            layer.sink_logit.copy_(torch.tensor([0.5, -1.0, 0.0, 1.0]))
        reference = copy.deepcopy(layer).double().eval()
        layer.to(device, dtype).eval()
        with torch.no_grad():
            expected = reference(x.double().cpu())
            full = layer(x)
            _same_place(full, device, dtype)
            _close(full, expected, dtype)
            cache = ab.KVCache(8)
            steps = [layer(x[:, t:t + 1], kv_cache=cache) for t in range(7)]
        _same_place(cache.keys, device, dtype)
        _close(torch.cat(steps, dim=1), expected, dtype)
    with torch.no_grad():
        _close(layers["latent"](x, absorb=True), layers["latent"](x), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_diagnose_judges_layers_where_they_live(device, dtype):
    torch.manual_seed(0)
    healthy = ab.MultiHeadAttention(6, 8, 2, context_length=8).to(device, dtype)
    report = diagnose(healthy)
    assert report.ok, str(report)
    bug = bug_zoo.BUGS["MultiHeadScaledByWidth"]
    broken = bug.build().to(device, dtype)
    assert diagnose(broken).failed == [bug.check]
    function_bug = bug_zoo.BUGS["attention_softmax_over_queries"]
    report = diagnose(function_bug.build(), device=device, dtype=dtype)
    assert report.failed == [function_bug.check]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_classifier_trains_and_is_measured_on_its_device(device, dtype, tensors):
    data = {split: {name: value[:96].to(device) for name, value in tensors[split].items()}
            for split in ("train", "validation")}
    for model_class in (AttentionClassifier, AveragingClassifier):
        torch.manual_seed(0)
        model = model_class(79, 8, d_model=16, dtype=dtype, device=device)
        history = train_classifier(model, data["train"], data["validation"], epochs=1)
        assert len(history["val_accuracy"]) == 2
        assert 0.0 <= evaluate_accuracy(model, data["validation"]) <= 1.0
        logits = model(data["validation"]["token_ids"], data["validation"]["lengths"],
                       data["validation"]["word_index"])
        _same_place(logits, device, dtype)
        assert torch.isfinite(logits.float()).all()
        if model_class is AttentionClassifier:
            assert 0.0 <= mean_attention_to(model, data["validation"], "cue_index") <= 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pictures_accept_weights_from_any_device_and_dtype(device, dtype):
    weights = torch.softmax(_randn(1, 2, 3, 3, device=device, dtype=dtype), dim=-1)
    ax = ab.plot_attention(weights[0, 0], ["a", "b", "c"])
    plt.close(ax.figure)
    axes = ab.plot_heads(weights, ["a", "b", "c"])
    plt.close(axes.flat[0].figure)
    html = ab.head_view(weights, ["a", "b", "c"], element_id="device-test")
    assert "bertviz-device-test" in html.data


@pytest.mark.parametrize("rope", [False, True], ids=["learned positions", "rope"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiny_gpt_and_its_heads_follow_their_parameters(device, dtype, rope):
    torch.manual_seed(0)
    model = ab.TinyGPT(16, 16, 2, 2, 16, rope=rope, device=device, dtype=dtype).eval()
    reference = ab.TinyGPT(16, 16, 2, 2, 16, rope=rope, dtype=torch.float64).eval()
    reference.load_state_dict({k: v.double().cpu() for k, v in model.state_dict().items()})
    batch = repeated_segments(4, 16, 4, 16, generator=torch.Generator().manual_seed(0),
                              device=device)
    assert batch.tokens.device.type == device.type
    with torch.no_grad():
        logits, all_weights = model(batch.tokens, return_weights=True)
    _same_place(logits, device, dtype)
    _same_place(all_weights[1], device, dtype)
    if dtype != torch.bfloat16:  # two layers of bfloat16 rounding exceed its tolerance
        with torch.no_grad():
            _close(logits, reference(batch.tokens.cpu()), dtype)
        prompt = batch.tokens[:, :5]
        cached = model.generate(prompt, 6)
        assert cached.device.type == device.type
        assert torch.equal(cached, model.generate(prompt, 6, use_cache=False))
    for scores in (ab.previous_token_scores(model, batch.tokens),
                   ab.previous_token_scores(model, batch.tokens, at_targets=True),
                   ab.induction_scores(model, batch.tokens)):
        _same_place(scores, device, dtype)
        assert scores.shape == (2, 2)
    with ab.ablate_heads(model, ["L0H1"]):
        _same_place(model(batch.tokens), device, dtype)
    assert ab.find_heads(model, batch.tokens).previous_token.device.type == "cpu"
    copier = hand_built_induction_model(8, 16, device=device, dtype=dtype)
    segments = torch.stack([torch.randperm(7) + 1 for _ in range(4)]).to(device)  # (4, 7)
    repeats = torch.cat([torch.zeros_like(segments[:, :1]), segments, segments], dim=1)
    assert ab.induction_scores(copier, repeats)[1, 0] > 0.9


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_training_on_repeats_runs_where_the_model_lives(device, dtype):
    torch.manual_seed(0)
    model = ab.TinyGPT(16, 16, 2, 2, 16, attention_only=True, device=device, dtype=dtype)
    history = train_on_repeats(model, steps=3, batch_size=4, segment_len=4, record_every=3)
    assert history["step"] == [0, 3] and all(math.isfinite(x) for x in history["loss"])
    assert next(model.parameters()).device.type == device.type
    probe = repeated_segments(8, 16, 4, 16, device=device)
    assert 0.0 <= induction_accuracy(model, probe) <= 1.0


class _Elsewhere(torch.Tensor):
    """A CPU tensor that acts as if it lived on another device, so that the CPU run catches
    what a GPU run would: an operation that mixes it with a CPU tensor (other than a number)
    raises PyTorch's error for two devices; ``.cpu()`` and ``.to("cpu")`` bring it back."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        targets = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, (str, torch.device))]
        if func is torch.Tensor.cpu or (func is torch.Tensor.to and targets
                                        and torch.device(targets[0]).type == "cpu"):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        flat = torch.utils._pytree.tree_leaves((args, kwargs))
        if any(isinstance(a, cls) for a in flat) and any(
                isinstance(a, torch.Tensor) and not isinstance(a, cls) and a.dim() > 0
                for a in flat):
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               "least two devices, elsewhere:0 and cpu!")
        return super().__torch_function__(func, types, args, kwargs)


def _moved(value, device):
    """``value`` with its tensors on ``device``; on the CPU, on the stand-in ``_Elsewhere``."""
    if isinstance(value, torch.Tensor):
        return value.as_subclass(_Elsewhere) if device.type == "cpu" else value.to(device)
    if isinstance(value, tuple):
        return tuple(_moved(item, device) for item in value)
    return value


def _returns_on(device, answer):
    """The answer, computing on the CPU as given but returning its tensors on ``device``."""
    def moved(*args, **kwargs):
        return _moved(answer(*args, **kwargs), device)

    return moved


def _right_answers():
    """(checker, right answer) for answers that return a tensor, a bool tensor, a pair or a
    triple, through the checkers' three ways of calling an answer (``call``, chapter 3's
    ``_call_with_hint``, chapter 7's ``_call_explained``)."""
    from attention_book.exercises import (
        check_combine,
        check_cross_attention,
        check_prefix_lm_mask,
        check_split_merged,
        check_stable_softmax,
        check_weight_matrix_test,
    )

    def stable_softmax(x, dim=-1):
        exp = torch.exp(x - x.amax(dim=dim, keepdim=True))
        return exp / exp.sum(dim=dim, keepdim=True)

    def cross_attention(x_q, x_kv, w_query, w_key, w_value):
        keys = x_kv @ w_key
        weights = torch.softmax((x_q @ w_query) @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5,
                                dim=-1)
        return weights @ (x_kv @ w_value), weights

    def combine(state_a, state_b):
        (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
        m = torch.maximum(m_a, m_b)
        shift = torch.where(m.isfinite(), m, 0.0)
        scale_a, scale_b = torch.exp(m_a - shift), torch.exp(m_b - shift)
        return m, l_a * scale_a + l_b * scale_b, o_a * scale_a + o_b * scale_b

    def split_merged(merged, d_out):
        u, s, vh = torch.linalg.svd(merged)
        root = s[:d_out].sqrt()
        return u[:, :d_out] * root, vh[:d_out].T * root

    def is_weight_matrix(w):
        sums = w.sum(dim=-1)
        return (w >= 0).all() & torch.isclose(sums, torch.ones_like(sums)).all()

    return [
        (check_row_normalise, lambda x: x / x.sum(dim=-1, keepdim=True)),
        (check_stable_softmax, stable_softmax),
        (check_cross_attention, cross_attention),
        (check_prefix_lm_mask, lambda prefix, num: torch.ones(num, num, dtype=torch.bool).tril()
         | (torch.arange(num) < prefix)[None, :]),
        (check_combine, combine),
        (check_split_merged, split_merged),
        (check_weight_matrix_test, is_weight_matrix),
    ]


@pytest.mark.parametrize(("checker", "answer"), _right_answers(),
                         ids=lambda value: getattr(value, "__name__", ""))
def test_checkers_accept_answers_that_come_back_on_another_device(device, checker, answer, capsys):
    """A learner on a GPU returns tensors there: the checkers compare them where their
    references are. Here with CUDA under ``make test-gpu``, on the CPU with a stand-in."""
    assert checker(answer) is True, capsys.readouterr().out
    assert checker(_returns_on(device, answer)) is True, capsys.readouterr().out


def test_the_stand_in_for_another_device_fails_as_another_device_does(monkeypatch, capsys):
    """The stand-in raises where a second device would, so the test above can fail on a CPU:
    without ``on_cpu`` in the checkers' ``call`` the checker cannot use the answer."""
    elsewhere = torch.ones(2, 3).as_subclass(_Elsewhere)
    with pytest.raises(RuntimeError, match="two devices"):
        elsewhere + torch.ones(2, 3)
    assert type(elsewhere.cpu()) is torch.Tensor and type(elsewhere.to("cpu")) is torch.Tensor
    assert torch.equal(elsewhere.cpu() * 2, torch.full((2, 3), 2.0))
    from attention_book.exercises import feedback

    monkeypatch.setattr(feedback, "on_cpu", lambda value: value)
    answer = _returns_on(torch.device("cpu"), lambda x: x / x.sum(dim=-1, keepdim=True))
    assert check_row_normalise(answer) is False
    assert "two devices" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_serving_runs_where_the_model_lives(device, dtype):
    torch.manual_seed(0)
    model = ab.TinyGPT(16, 16, 2, 2, 16, rope=True, device=device, dtype=dtype).eval()
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], device=device)
    cache = ab.PagedKVCache(8, 2, 2, 8, num_layers=2, device=device, dtype=dtype)
    for seq_id, length in ((0, 2), (1, 5)):
        cache.add_sequence(seq_id)
        ab.paged_forward(model, cache, [seq_id], tokens[seq_id:seq_id + 1, :length])
    next_tokens = torch.stack([tokens[0, 2:3], tokens[1, 5:6]])  # (B, 1): each row's next token
    logits = ab.paged_forward(model, cache, [0, 1], next_tokens)  # (B, 1, vocab_size)
    _same_place(logits, device, dtype)
    _same_place(cache.key_blocks, device, dtype)
    if dtype != torch.bfloat16:  # two layers of bfloat16 rounding exceed its tolerance
        with torch.no_grad():
            full = model(tokens)  # (B, T, vocab_size)
        _close(logits[:, 0], torch.stack([full[0, 2], full[1, 5]]), dtype)
    outputs = ab.generate_batch(model, list(tokens[:, :3]), 3, block_size=2)
    assert all(output.device.type == device.type for output in outputs)
    if dtype == torch.float64:  # no near-tie can flip an argmax in float64
        assert torch.equal(torch.stack(outputs), model.generate(tokens[:, :3], 3))


# --------------------------------------------------------------------------- forgotten devices


def _torch_optimizers_forget_the_device() -> bool:
    """Whether this torch's own Adam creates its step counter on the default device.

    Older releases (2.5 and 2.11 among them) do; then an optimizer step fails under a
    ``meta`` default device whatever the package does, so the tests below let torch's
    optimizers step on the CPU. Everything of the package still runs with ``meta``.
    """
    previous = torch.get_default_device()
    parameter = torch.nn.Parameter(torch.ones(1, device="cpu"))
    parameter.grad = torch.ones(1, device="cpu")
    torch.set_default_device("meta")
    try:
        torch.optim.Adam([parameter]).step()
        return False
    except RuntimeError:
        return True
    finally:
        torch.set_default_device(previous)


@pytest.fixture
def default_device_meta(monkeypatch):
    """Make torch's default device ``meta`` for the duration of a test."""
    previous = torch.get_default_device()
    if _torch_optimizers_forget_the_device():
        for optimizer in (torch.optim.Adam, torch.optim.AdamW):
            step = optimizer.step

            def step_on_the_cpu(self, *args, _step=step, **kwargs):
                with torch.device("cpu"):
                    return _step(self, *args, **kwargs)

            monkeypatch.setattr(optimizer, "step", step_on_the_cpu)
    torch.set_default_device("meta")
    yield
    torch.set_default_device(previous)


def test_no_factory_in_the_layers_forgets_the_device(default_device_meta):
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    layer = ab.GroupedQueryAttention(8, 8, 4, 2, context_length=6, device=cpu)
    fused = ab.MultiHeadAttention(8, 8, 2, context_length=6, backend="sdpa", device=cpu)
    x = torch.ones(2, 5, 8, device=cpu)
    mask = ab.padding_mask(torch.tensor([5, 3], device=cpu), 5)
    with torch.no_grad():
        _same_place(layer(x, mask), cpu, torch.float32)
        _same_place(fused(x), cpu, torch.float32)
        cache = ab.KVCache(6)
        for t in range(5):
            _same_place(fused(x[:, t:t + 1], kv_cache=cache), cpu, torch.float32)
    query = torch.ones(1, 2, 20, 4, device=cpu)
    _same_place(ab.tiled_attention(query, query, query, block_size=8, is_causal=True),
                cpu, torch.float32)


def test_no_factory_in_the_windows_sinks_and_latents_forgets_the_device(default_device_meta):
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    x = torch.ones(2, 5, 8, device=cpu)
    layers = [
        ab.MultiHeadAttention(8, 8, 2, context_length=6, sink=True, device=cpu),
        ab.GroupedQueryAttention(8, 8, 4, 2, context_length=6, sink=True, backend="sdpa",
                                 device=cpu),
        ab.MultiHeadLatentAttention(8, 8, 2, 4, context_length=6, sink=True, device=cpu),
        ab.MultiHeadLatentAttention(8, 8, 2, 4, context_length=6, backend="sdpa", device=cpu),
    ]
    mask = ab.padding_mask(torch.tensor([5, 3], device=cpu), 5)
    with torch.no_grad():
        for layer in layers:
            _same_place(layer(x, mask), cpu, torch.float32)
            cache = ab.KVCache(6)
            for t in range(5):
                absorb = {"absorb": True} if isinstance(layer, ab.MultiHeadLatentAttention) else {}
                _same_place(layer(x[:, t:t + 1], kv_cache=cache, **absorb), cpu, torch.float32)
    _same_place(ab.sliding_window_mask(5, 2, device=cpu), cpu, torch.bool)
    query = torch.ones(1, 2, 20, 4, device=cpu)
    _same_place(ab.softmax_with_sink(query, 0.5), cpu, torch.float32)
    _same_place(ab.scaled_dot_product_attention(query, query, query, sink_logit=0.5)[0],
                cpu, torch.float32)
    _same_place(ab.tiled_attention(query, query, query, block_size=8, window=3, sink_logit=0.5),
                cpu, torch.float32)
    _same_place(bug_zoo.attention_sink_as_sigmoid(query, query, query, sink_logit=0.5)[0],
                cpu, torch.float32)
    rule = ab.mods.padding(torch.tensor([3, 5], device=cpu))
    _same_place(ab.mods.materialize(rule, 2, 1, 5, device=cpu), cpu, torch.bool)
    scores = torch.zeros(1, 4, 5, 5, device=cpu)
    _same_place(ab.mods.apply_score_mod(scores, ab.mods.alibi(4, device=cpu)), cpu, torch.float32)


def test_no_factory_in_the_classifier_forgets_the_device(default_device_meta, tensors):
    cpu = torch.device("cpu")
    data = {split: {name: value[:64].to(cpu) for name, value in tensors[split].items()}
            for split in ("train", "validation")}
    model = AttentionClassifier(79, 8, d_model=16, device=cpu)
    train_classifier(model, data["train"], data["validation"], epochs=1)
    assert evaluate_accuracy(model, data["validation"]) >= 0.0
    assert not math.isnan(mean_attention_to(model, data["validation"], "distractor_index"))


@pytest.mark.parametrize("rope", [False, True], ids=["learned positions", "rope"])
def test_no_factory_in_the_model_or_the_head_tools_forgets_the_device(default_device_meta, rope):
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = ab.TinyGPT(16, 16, 2, 2, 16, rope=rope, device=cpu)
    batch = repeated_segments(4, 16, 4, 16, offset=6, generator=torch.Generator().manual_seed(0),
                              device=cpu)
    _same_place(batch.loss_mask, cpu, torch.bool)
    with torch.no_grad():
        _same_place(model(batch.tokens), cpu, torch.float32)
    prompt = batch.tokens[:, :4]
    assert torch.equal(model.generate(prompt, 5), model.generate(prompt, 5, use_cache=False))
    _same_place(ab.previous_token_scores(model, batch.tokens), cpu, torch.float32)
    _same_place(ab.previous_token_scores(model, batch.tokens, at_targets=True), cpu, torch.float32)
    _same_place(ab.induction_scores(model, batch.tokens), cpu, torch.float32)
    with ab.ablate_heads(model, [(1, 0)]):
        assert 0.0 <= induction_accuracy(model, batch) <= 1.0
    history = train_on_repeats(model, steps=2, batch_size=4, segment_len=4, record_every=1)
    assert len(history["loss"]) == 3
    copier = hand_built_induction_model(8, 16, device=cpu)
    assert str(ab.find_heads(copier, batch.tokens % 8)).startswith("head")
    block = ab.TransformerBlock(8, 2, 4, device=cpu)
    cache = ab.KVCache(4)
    with torch.no_grad():
        _same_place(block(torch.ones(1, 2, 8, device=cpu), kv_cache=cache), cpu, torch.float32)


# --------------------------------------------------------------------------- partial attention
# and attention across ranks (issue 35: the masks and positions of distributed were built on
# the CPU whatever the inputs' device; these tests cover it on a device and, without a GPU,
# with factories that forget the device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_partial_attention_and_the_simulated_ring_follow_their_inputs(device, dtype):
    from attention_book.distributed import simulate_ring_attention
    from attention_book.flash import merge_partials, partial_attention

    query = _randn(1, 4, 16, 8, device=device, dtype=dtype, seed=9)
    key, value = (_randn(1, 2, 16, 8, device=device, dtype=dtype, seed=s) for s in (10, 11))
    reference = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double(), value.double(), is_causal=True, enable_gqa=True)
    positions = torch.arange(16, device=device)
    first = partial_attention(query, key[..., :9, :], value[..., :9, :], is_causal=True,
                              query_positions=positions, key_positions=positions[:9])
    second = partial_attention(query, key[..., 9:, :], value[..., 9:, :], is_causal=True,
                               query_positions=positions, key_positions=positions[9:])
    output, lse = merge_partials(*first, *second)
    _same_place(lse, device, torch.float64 if dtype == torch.float64 else torch.float32)
    _close(output, reference, dtype)
    for layout in ("contiguous", "zigzag"):
        ring = simulate_ring_attention(query, key, value, 4, is_causal=True, layout=layout)
        _same_place(ring, device, dtype)
        _close(ring, reference, dtype)


@contextlib.contextmanager
def _factories_on_meta():
    """Torch's default device is ``meta`` inside the block (the fixture above, as a block)."""
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(previous)


@pytest.fixture
def one_rank_group():
    """A gloo process group of this process alone, so the per-rank functions run here."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_no_factory_in_distributed_forgets_the_device(one_rank_group):
    from attention_book import distributed
    from attention_book.flash import add_sink, merge_partials, partial_attention

    cpu = torch.device("cpu")
    query = torch.linspace(-2, 2, 1 * 4 * 8 * 4).reshape(1, 4, 8, 4)  # (B, H, T, d)
    key, value = query[:, :2].flip(-2), query[:, 2:].cos()  # (B, H_kv, T, d): grouped heads
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                                enable_gqa=True)
    grad_output = torch.ones_like(expected)
    with _factories_on_meta():
        for world_size in (2, 4):
            for layout in distributed.LAYOUTS:
                output = distributed.simulate_ring_attention(query, key, value, world_size,
                                                             is_causal=True, layout=layout)
                _same_place(output, cpu, torch.float32)
                torch.testing.assert_close(output, expected)
                pieces = [distributed.shard(query, world_size, r, layout) for r in range(world_size)]
                assert torch.equal(distributed.unshard(pieces, layout), query)
        # The per-rank functions, called directly on the shards of a group of one rank; zig-zag
        # cuts even one rank's shard into two chunks, so the causal masks are built too.
        for method, layout in ((distributed.ring_attention, "zigzag"),
                               (distributed.allgather_kv_attention, "zigzag"),
                               (distributed.ulysses_attention, None)):
            leaves = [t.clone().requires_grad_() for t in (query, key, value)]
            kwargs = {} if layout is None else {"layout": layout}
            output = method(*leaves, is_causal=True, **kwargs)
            _same_place(output, cpu, torch.float32)
            torch.testing.assert_close(output, expected)
            output.backward(grad_output)
            for leaf in leaves:
                _same_place(leaf.grad, cpu, torch.float32)
        out, lse = partial_attention(query, key, value, is_causal=True, window=3)
        _same_place(merge_partials(out, lse, out, lse)[0], cpu, torch.float32)
        _same_place(add_sink(out, lse, 0.5)[0], cpu, torch.float32)


def test_no_factory_in_the_masks_positions_and_tasks_forgets_the_device(default_device_meta):
    from attention_book.repeat_task import repeat_loss

    cpu = torch.device("cpu")
    scores = torch.zeros(2, 4, 6, 6, device=cpu)
    rules = [ab.mods.causal, ab.mods.sliding_window(3), ab.mods.prefix_lm(2),
             ab.mods.padding(torch.tensor([6, 4], device=cpu)),
             ab.mods.document(torch.tensor([0, 0, 0, 1, 1, 1], device=cpu))]
    for rule in rules:
        _same_place(ab.mods.materialize(rule, 2, 4, 6, device=cpu), cpu, torch.bool)
    for score_mod in (ab.mods.soft_cap(5.0), ab.mods.alibi(4, device=cpu)):
        _same_place(ab.mods.apply_score_mod(scores, score_mod), cpu, torch.float32)
    x = torch.ones(2, 4, 6, 8, device=cpu)
    _same_place(ab.rotary_embedding(x), cpu, torch.float32)
    _same_place(ab.rotary_embedding(x, positions=torch.arange(6, device=cpu)), cpu, torch.float32)
    _same_place(ab.alibi_slopes(4, device=cpu), cpu, torch.float32)
    _same_place(ab.alibi_bias(4, 6, device=cpu), cpu, torch.float32)
    torch.manual_seed(0)
    model = ab.TinyGPT(16, 16, 2, 2, 16, device=cpu)
    batch = repeated_segments(4, 16, 4, 16, generator=torch.Generator().manual_seed(1), device=cpu)
    with torch.no_grad():
        assert math.isfinite(float(repeat_loss(model(batch.tokens), batch)))

def test_no_factory_in_sparse_attention_forgets_the_device(default_device_meta):
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    query = torch.ones(1, 4, 6, 8, device=cpu)
    key = torch.ones(1, 2, 6, 8, device=cpu)
    scores = torch.arange(36.0, device=cpu).view(1, 6, 6)
    output, indices = ab.topk_attention(query, key, key, scores, 2, return_indices=True)
    _same_place(output, cpu, torch.float32)
    _same_place(indices, cpu, torch.long)
    _same_place(ab.topk_mask(scores, 2), cpu, torch.bool)
    indexer = ab.LightningIndexer(8, 2, 4, device=cpu)
    x = torch.ones(1, 6, 8, device=cpu)
    index_scores = indexer(x)
    _same_place(index_scores, cpu, torch.float32)
    weights = torch.full((1, 4, 6, 6), 1 / 6, device=cpu)
    _same_place(ab.indexer_distillation_loss(index_scores, weights), cpu, torch.float32)
    _same_place(ab.block_topk_attention(query, key, key, scores, 1, block_size=2), cpu,
                torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_delta_rule_and_the_recurrent_layers_follow_their_inputs(device, dtype):
    """Chapter 18. In bfloat16 the chunks solve their triangular systems in float32 (torch has
    no 16-bit triangular solve, on the CPU or on CUDA) and give back bfloat16."""
    query, key, value = (_randn(2, 3, 20, 8, device=device, dtype=dtype, seed=s) for s in (20, 21, 22))
    key = torch.nn.functional.normalize(key, dim=-1)
    beta = torch.rand(2, 3, 20, generator=torch.Generator().manual_seed(23)).to(device, dtype)
    decay = -torch.rand(2, 3, 20, generator=torch.Generator().manual_seed(24)).to(device, dtype)
    exact = ab.delta_rule(*(t.double().cpu() for t in (query, key, value, beta)),
                          decay=decay.double().cpu())
    for chunk_size in (None, 8):
        out, state = ab.delta_rule(query, key, value, beta, decay=decay, chunk_size=chunk_size)
        _same_place(out, device, dtype)
        _same_place(state, device, dtype)
        _close(out, exact[0], dtype)
        _close(state, exact[1], dtype)
    _same_place(ab.linear_attention(query, key, value), device, dtype)
    torch.manual_seed(0)
    for layer in (ab.GatedDeltaNet(16, 2, chunk_size=4), ab.LinearAttentionLayer(16, 2)):
        layer.to(device, dtype).eval()
        x = _randn(2, 11, 16, device=device, dtype=dtype, seed=25)
        with torch.no_grad():
            full = layer(x)
            cache = layer.new_cache()
            steps = [layer(x[:, :6], kv_cache=cache)] + [layer(x[:, t:t + 1], kv_cache=cache)
                                                         for t in range(6, 11)]
        _same_place(full, device, dtype)
        _same_place(cache.memory, device, dtype)
        _close(torch.cat(steps, dim=1), full, dtype)


def test_no_factory_in_linear_attention_forgets_the_device(default_device_meta):
    cpu = torch.device("cpu")
    query = torch.linspace(-1, 1, 40, device=cpu).view(1, 2, 5, 4)  # (B, H, T, d)
    beta = torch.full((1, 2, 5), 0.5, device=cpu)
    for chunk_size in (None, 2):
        for dtype in (torch.float32, torch.bfloat16):
            out, state = ab.delta_rule(query.to(dtype), query.to(dtype), query.to(dtype),
                                       beta.to(dtype), decay=-beta.to(dtype), chunk_size=chunk_size)
            _same_place(out, cpu, dtype)
            _same_place(state, cpu, dtype)
    _same_place(ab.linear_attention(query, query, query), cpu, torch.float32)
    torch.manual_seed(0)
    for layer in (ab.GatedDeltaNet(8, 2, chunk_size=2, device=cpu),
                  ab.LinearAttentionLayer(8, 2, device=cpu)):
        x = torch.ones(1, 5, 8, device=cpu)
        cache = layer.new_cache()
        with torch.no_grad():
            _same_place(layer(x), cpu, torch.float32)
            _same_place(layer(x[:, :1], kv_cache=cache), cpu, torch.float32)
        _same_place(cache.memory, cpu, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sparse_attention_stays_on_the_inputs_device(device, dtype):
    query = _randn(1, 4, 6, 8, device=device, dtype=dtype)
    key = _randn(1, 2, 6, 8, device=device, dtype=dtype, seed=1)
    scores = _randn(1, 6, 6, device=device, dtype=dtype, seed=2)
    output = ab.topk_attention(query, key, key, scores, 3)
    _same_place(output, device, dtype)
    block_mask = ab.block_topk_mask(scores, 2, block_size=2)  # pooled on the scores' device
    _same_place(block_mask.full_kv_indices, device, torch.int32)
    assert block_mask.to_dense()[0, 0].sum(dim=1).tolist() == [1, 2, 2]
    expected = ab.topk_attention(query.double().cpu(), key.double().cpu(), key.double().cpu(),
                                 scores.double().cpu(), 3)
    _close(output, expected, dtype)


def test_no_factory_in_serving_forgets_the_device(default_device_meta):
    """The paged cache, paged attention, the views, paged_forward and the batcher (issue 35)."""
    cpu = torch.device("cpu")
    cache = ab.PagedKVCache(6, 2, 2, 4, num_layers=2, device=cpu)
    keys = torch.ones(2, 3, 4, device=cpu)  # (num_kv_heads, T, head_dim)
    for seq_id, size in (("a", 3), ("b", 1)):
        cache.add_sequence(seq_id)
        for layer in range(2):
            cache.append(seq_id, keys[:, :size], keys[:, :size], layer=layer)
    cache.fork("a", "c")
    cache.append("c", keys[:, :1], keys[:, :1])  # copy-on-write of the shared half block
    _same_place(cache.gather("c")[0], cpu, torch.float32)
    queries = torch.ones(2, 4, 1, 4, device=cpu)  # (B, num_heads, T_new, head_dim)
    _same_place(ab.paged_attention(queries, cache, ["a", "b"]), cpu, torch.float32)
    views = cache.batch_views(["a", "b"], 1)
    _same_place(views[0].positions(1, cpu), cpu, torch.int64)
    all_keys, _ = views[0].update(queries[:, :2], queries[:, :2])
    _same_place(all_keys, cpu, torch.float32)
    _same_place(views[0].key_positions(cpu), cpu, torch.int64)
    torch.manual_seed(0)
    model = ab.TinyGPT(16, 16, 2, 2, 16, rope=True, device=cpu).eval()
    pool = ab.PagedKVCache(8, 4, 2, 8, num_layers=2, device=cpu)
    pool.add_sequence(0)
    _same_place(ab.paged_forward(model, pool, [0], torch.tensor([[1, 2, 3]], device=cpu)),
                cpu, torch.float32)
    prompts = [torch.tensor([1, 2, 3], device=cpu), torch.tensor([4], device=cpu)]
    outputs = ab.generate_batch(model, prompts, 3, block_size=2)
    assert all(output.device == cpu for output in outputs)
    batcher = ab.ContinuousBatcher(model, block_size=2, num_blocks=4)
    batcher.submit(prompts[0], 2)
    batcher.run()
    assert batcher.output(0).device == cpu and batcher.cache.device == cpu
