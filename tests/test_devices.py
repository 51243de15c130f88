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


def test_checkers_accept_answers_that_come_back_on_another_device(device):
    assert check_row_normalise(lambda x: (x / x.sum(dim=-1, keepdim=True)).to(device))


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
