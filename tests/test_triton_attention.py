"""The book's Triton kernels (attention_book.triton_attention) against PyTorch and float64.

On the CPU (the test command) every kernel runs through Triton's interpreter; with
``--device cuda`` the same tests compile and run them on the GPU (``tools/gpu_kernel_check.py``
does that on an H100). Sizes are small and most lengths are not a multiple of any block size,
so the ragged last tile of queries and of keys is always exercised. On the CPU one more test
compiles the kernels for an H100 (sm_90, with Triton's own ptxas) without a GPU.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from attention_book import triton_attention
from attention_book.triton_attention import (
    KernelConfig,
    autotune,
    flash_attention,
    flash_attention_bytes,
    flash_attention_flops,
    flash_attention_forward,
    jit,
)

LOW = (torch.bfloat16, torch.float16)


def _qkv(device, dtype, batch=2, heads=4, kv_heads=2, num_queries=100, num_keys=None,
         head_dim=32, seed=0):
    num_keys = num_queries if num_keys is None else num_keys
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, num_queries, head_dim, generator=generator)
    key = torch.randn(batch, kv_heads, num_keys, head_dim, generator=generator)
    value = torch.randn(batch, kv_heads, num_keys, head_dim, generator=generator)
    return [tensor.to(device=device, dtype=dtype) for tensor in (query, key, value)]


def _reference(query, key, value, is_causal, scale=None):
    """Float64 attention on the CPU, with its log-sum-exp: the truth both kernels are held to."""
    q, k, v = (tensor.to("cpu", torch.float64) for tensor in (query, key, value))
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if is_causal:
        hidden = torch.ones(q.size(2), k.size(2), dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def _error(tensor, reference):
    """Largest error relative to the reference's largest entry."""
    return float((tensor.detach().cpu().double() - reference).abs().max() / reference.abs().max())


def _sdpa(query, key, value, is_causal, scale=None):
    return F.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale,
                                          enable_gqa=True)


def _assert_as_good_as_sdpa(ours, theirs, reference, dtype, what):
    """float32: within 1e-5 of float64. 16-bit: no worse than PyTorch's own kernel, twice over."""
    error = _error(ours, reference)
    if dtype == torch.float32:
        assert error < 1e-5, f"{what}: relative error {error:.2e} against float64"
    else:
        bound = 2 * _error(theirs, reference) + 2e-3
        assert error < bound, f"{what}: relative error {error:.2e}, PyTorch's kernel x2: {bound:.2e}"


SHAPES = {  # (batch, heads, kv_heads, T, head_dim): grouped and ragged, and one that tiles evenly
    "grouped-ragged": (2, 4, 2, 100, 32),
    "even-16": (1, 2, 2, 64, 16),
    "one-kv-head-ragged-64": (1, 3, 1, 37, 64),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_forward_and_log_sum_exp_match_float64_and_sdpa(device, dtype, is_causal, shape):
    batch, heads, kv_heads, length, head_dim = SHAPES[shape]
    query, key, value = _qkv(device, dtype, batch, heads, kv_heads, length, head_dim=head_dim)
    output, lse = flash_attention_forward(query, key, value, is_causal=is_causal)
    assert output.shape == query.shape and output.dtype == dtype
    assert output.device.type == device.type
    assert lse.shape == query.shape[:3] and lse.dtype == torch.float32
    expected, expected_lse = _reference(query, key, value, is_causal)
    _assert_as_good_as_sdpa(output, _sdpa(query, key, value, is_causal), expected, dtype, "output")
    torch.testing.assert_close(lse.cpu().double(), expected_lse, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(flash_attention(query, key, value, is_causal=is_causal), output,
                               atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_match_float64_and_sdpa(device, dtype, is_causal):
    query, key, value = _qkv(device, dtype)  # grouped heads, T = 100: ragged for every block
    grad_output = _qkv(device, dtype, seed=1)[0]
    inputs = [tensor.clone().requires_grad_() for tensor in (query, key, value)]
    flash_attention(*inputs, is_causal=is_causal).backward(grad_output)
    ours = [tensor.grad for tensor in inputs]
    inputs = [tensor.clone().requires_grad_() for tensor in (query, key, value)]
    _sdpa(*inputs, is_causal=is_causal).backward(grad_output)
    theirs = [tensor.grad for tensor in inputs]
    inputs = [tensor.detach().cpu().double().requires_grad_() for tensor in (query, key, value)]
    _reference(*inputs, is_causal)[0].backward(grad_output.cpu().double())
    for name, mine, sdpa, truth in zip("QKV", ours, theirs, inputs, strict=True):
        assert mine.dtype == dtype and mine.shape == truth.shape
        _assert_as_good_as_sdpa(mine, sdpa, truth.grad, dtype, f"d{name}")


def test_float16_and_a_custom_scale(device):
    query, key, value = _qkv(device, torch.float16, num_queries=50, num_keys=70, head_dim=64)
    inputs = [tensor.clone().requires_grad_() for tensor in (query, key, value)]
    output = flash_attention(*inputs, scale=0.3)
    output.float().pow(2).sum().backward()
    expected, _ = _reference(query, key, value, False, scale=0.3)
    _assert_as_good_as_sdpa(output, _sdpa(query, key, value, False, scale=0.3), expected,
                            torch.float16, "output")
    assert all(tensor.grad.dtype == torch.float16 and tensor.grad.isfinite().all()
               for tensor in inputs)


@pytest.mark.parametrize("config", [KernelConfig(16, 16), KernelConfig(64, 32),
                                    KernelConfig(32, 16)],
                         ids=lambda config: f"{config.block_m}x{config.block_n}")
def test_every_tile_shape_gives_the_same_result(device, config):
    query, key, value = _qkv(device, torch.float32, batch=1, heads=2, kv_heads=1, num_queries=75)
    for is_causal in (False, True):
        output, lse = flash_attention_forward(query, key, value, is_causal=is_causal,
                                              config=config)
        expected, expected_lse = _reference(query, key, value, is_causal)
        assert _error(output, expected) < 1e-5
        torch.testing.assert_close(lse.cpu().double(), expected_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_backward_with_other_tile_shapes(device, is_causal):
    query, key, value = _qkv(device, torch.float32, batch=1, heads=2, kv_heads=1, num_queries=75)
    grad_output = _qkv(device, torch.float32, batch=1, heads=2, kv_heads=1, num_queries=75,
                       seed=1)[0]
    output, lse = flash_attention_forward(query, key, value, is_causal=is_causal)
    configs = {"backward_dkdv": KernelConfig(16, 64), "backward_dq": KernelConfig(64, 16)}
    grads = triton_attention._backward(grad_output, query, key, value, output, lse, is_causal,
                                       1 / math.sqrt(32), configs)
    inputs = [tensor.detach().cpu().double().requires_grad_() for tensor in (query, key, value)]
    _reference(*inputs, is_causal)[0].backward(grad_output.cpu().double())
    for mine, truth in zip(grads, inputs, strict=True):
        assert _error(mine, truth.grad) < 1e-5


def test_the_plain_kernel_and_each_optimisation_agree(device):
    query, key, value = _qkv(device, torch.float32, num_queries=90)
    expected, _ = _reference(query, key, value, True)
    for use_exp2 in (False, True):
        for split_masked in (False, True):
            output, _ = flash_attention_forward(query, key, value, is_causal=True,
                                                use_exp2=use_exp2, split_masked=split_masked)
            assert _error(output, expected) < 1e-5, (use_exp2, split_masked)


def test_strided_inputs_and_more_keys_than_queries(device):
    generator = torch.Generator().manual_seed(3)
    # (B, T, H, d) memory, viewed as (B, H, T, d): the kernels read the strides as they are
    query = torch.randn(2, 40, 4, 32, generator=generator).to(device).transpose(1, 2)
    key = torch.randn(2, 90, 1, 32, generator=generator).to(device).transpose(1, 2)
    value = torch.randn(2, 1, 90, 32, generator=generator).to(device).expand(2, 1, 90, 32)
    output = flash_attention(query, key, value)
    expected, _ = _reference(query, key, value, False)
    assert _error(output, expected) < 1e-5


@pytest.mark.parametrize(("change", "error", "words"), [
    (lambda q, k, v: (q.numpy() if q.device.type == "cpu" else [1.0], k, v), TypeError,
     "torch.Tensor"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "torch.float64"),
    (lambda q, k, v: (q, k.half(), v), TypeError, "torch.float16"),
    (lambda q, k, v: (q[0], k, v), ValueError, "4-D"),
    (lambda q, k, v: (q, k, v[:, :, :10]), ValueError, "same shape"),
    (lambda q, k, v: (q, k[:1], v[:1]), ValueError, "batch size 2"),
    (lambda q, k, v: (q[..., :16], k, v), ValueError, "head_dim 16"),
    (lambda q, k, v: (q[:, :3], k, v), ValueError, "3 heads"),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "0 positions"),
    (lambda q, k, v: (q.to("meta"), k, v), ValueError, "one device"),
    (lambda q, k, v: (q.to("meta"), k.to("meta"), v.to("meta")), ValueError, "meta"),
], ids=["not-a-tensor", "float64", "mixed-dtypes", "3-D", "key-value-shapes", "batch",
        "head-dims-differ", "heads-not-a-multiple", "no-queries", "two-devices", "meta-device"])
def test_bad_inputs_are_refused_with_their_sizes(device, change, error, words):
    query, key, value = _qkv(device, torch.float32, num_queries=20)
    with pytest.raises(error, match=words.replace("(", r"\(")):
        flash_attention(*change(query, key, value))


@pytest.mark.parametrize(("head_dim", "words"), [(48, "head_dim 48 is not a head size"),
                                                (8, "head_dim 8 is not a head size"),
                                                (256, "head_dim 256 is over the kernels' limit of 128")])
def test_unsupported_head_sizes_are_refused(device, head_dim, words):
    query, key, value = _qkv(device, torch.float32, num_queries=4, head_dim=head_dim)
    with pytest.raises(ValueError, match=words):
        flash_attention(query, key, value)


def test_bad_options_are_refused(device):
    query, key, value = _qkv(device, torch.float32, num_queries=8, num_keys=12)
    with pytest.raises(ValueError, match="T_q = 8 and T_k = 12"):
        flash_attention(query, key, value, is_causal=True)
    with pytest.raises(TypeError, match="is_causal must be a bool, got int"):
        flash_attention(query, key, value, is_causal=1)
    with pytest.raises(TypeError, match="scale must be a number, got str"):
        flash_attention(query, key, value, scale="0.1")
    with pytest.raises(ValueError, match="scale must be finite and non-zero, got inf"):
        flash_attention(query, key, value, scale=math.inf)
    with pytest.raises(ValueError, match=r"block_m \(16\) to be a multiple of block_n \(32\)"):
        flash_attention_forward(query, key, value, config=KernelConfig(16, 32))
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
        KernelConfig(32, 24)
    with pytest.raises(TypeError, match="config must be a KernelConfig, got tuple"):
        flash_attention_forward(query, key, value, config=(32, 32))


def test_without_triton_the_message_says_how_to_install_it(monkeypatch):
    query, key, value = _qkv("cpu", torch.float32, num_queries=8)
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'attention-book\[kernels\]'"):
        flash_attention(query, key, value)


def test_jit_runs_a_kernel_and_switches_nothing_for_the_rest_of_the_process(device):
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    @jit
    def add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        row = tl.load(x_ptr + offsets, mask=inside, other=0.0)
        tl.store(out_ptr + offsets, row + tl.max(row, 0) * 0 + 1, mask=inside)

    before = os.environ.get("TRITON_INTERPRET")
    call = JITFunction.__call__
    x = torch.arange(10.0, device=device)
    out = torch.empty_like(x)
    add_one[(3,)](x, out, 10, BLOCK=4)
    assert out.tolist() == [value + 1 for value in range(10)]
    assert os.environ.get("TRITON_INTERPRET") == before and JITFunction.__call__ is call
    assert not triton.knobs.runtime.interpret or before == "1"


def test_flops_and_bytes():
    assert flash_attention_flops(2, 3, 5, 7, 16) == 4 * 2 * 3 * 5 * 7 * 16
    assert flash_attention_flops(1, 1, 8, 8, 16, is_causal=True) == 4 * 8 * 8 * 16 // 2
    assert flash_attention_flops(1, 1, 8, 8, 16, backward=True) == 7 * 4 * 8 * 8 * 16 // 2
    # Q, K, V read and O written once (bfloat16), one float32 log-sum-exp per query row
    assert flash_attention_bytes(1, 4, 4, 100, 100, 64) == 4 * 4 * 100 * 64 * 2 + 4 * 100 * 4
    assert flash_attention_bytes(1, 4, 1, 100, 100, 64) == (2 * 4 + 2) * 100 * 64 * 2 + 4 * 100 * 4
    forward = flash_attention_bytes(1, 4, 4, 100, 100, 64)
    assert flash_attention_bytes(1, 4, 4, 100, 100, 64, backward=True) == (
        forward + 8 * 4 * 100 * 64 * 2 + 2 * 4 * 100 * 4)


def test_autotune_refuses_to_time_the_interpreter():
    query, key, value = _qkv("cpu", torch.float32, num_queries=8)
    with pytest.raises(ValueError, match="through the interpreter"):
        autotune(query, key, value)


def test_the_kernels_compile_for_an_h100_without_one(device):
    """Triton's compiler and ptxas run on the CPU: a kernel that would not compile on the GPU
    (a shape rule of tl.dot, a type error) fails here, before any GPU sees it."""
    if device.type == "cuda":
        pytest.skip("with --device cuda every other test compiles the kernels for this GPU")
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = triton_attention._kernels(False)
    pointers = {"lse_ptr": "*fp32", "delta_ptr": "*fp32"}
    for kernel, config in ((kernels.attention_forward_kernel, KernelConfig(128, 64, 4, 3)),
                           (kernels.backward_dkdv_kernel, KernelConfig(32, 128, 4, 3)),
                           (kernels.backward_dq_kernel, KernelConfig(128, 32, 4, 3))):
        constants = {"HEAD_DIM": 64, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                     "IS_CAUSAL": True, "PRECISION": "tf32", "USE_EXP2": True,
                     "SPLIT_MASKED": True}
        names = list(inspect.signature(kernel.fn).parameters)
        signature = {name: "constexpr" if name in constants else pointers.get(
            name, "*bf16" if name.endswith("_ptr") else "fp32" if name == "scale" else "i32")
            for name in names}
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs={n: constants[n] for n in names
                                                     if n in constants}),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": config.num_warps, "num_stages": config.num_stages})
        assert ".target sm_90" in compiled.asm["ptx"] and compiled.asm["cubin"]
        assert compiled.metadata.shared <= 227 * 1024  # an H100's shared memory per block


def test_an_interpreter_too_old_for_numpy_2_is_named(monkeypatch):
    import numpy
    import triton

    from attention_book.triton_attention import _check_interpreter_version

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(numpy, "__version__", "2.1.0")
    with pytest.raises(RuntimeError, match=r"Triton 3.6.0's interpreter .*pip install 'triton>=3.7'"):
        _check_interpreter_version()
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    _check_interpreter_version()
