"""Checkers for chapter 14 (the KV-memory ladder and multi-head latent attention)."""

from __future__ import annotations

import math

import torch

from ..attention import causal_mask
from .feedback import call, checker, expect_shape, expect_true, fail, number_from_config, passed

__all__ = [
    "check_kv_bytes_per_token",
    "check_absorption_cost_prediction",
    "check_decoupled_rope_weights",
]


# --------------------------------------------------------------------------- exercise 14.1
# Published configurations, in the keys of Hugging Face's config.json files:
# Llama 3 8B (Llama Team, 2024, Table 3), LLaMA 7B (Touvron et al., 2023), Mistral 7B v0.1
# (Jiang et al., 2023, Table 1), DeepSeek-V2 (DeepSeek-AI, 2024, section 3.1.2) and
# gpt-oss-20b (OpenAI, 2025). The expected bytes are written out, not computed by a function.

_LLAMA3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "sliding_window": None, "torch_dtype": "bfloat16"}
_LLAMA_7B = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
             "torch_dtype": "float16"}
_MISTRAL_7B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096, "sliding_window": 4096, "torch_dtype": "bfloat16"}
_DEEPSEEK_V2 = {"num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128,
                "hidden_size": 5120, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
_GPT_OSS_20B = {"num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
                "hidden_size": 2880, "head_dim": 64, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 12,
                "torch_dtype": "bfloat16"}

# Llama 3 8B as recent versions of transformers save it: the key is "dtype", not "torch_dtype".
_LLAMA3_8B_NEW = {key: value for key, value in _LLAMA3_8B.items() if key != "torch_dtype"}
_LLAMA3_8B_NEW["dtype"] = "bfloat16"
# Qwen2's configs name a window and switch it off (transformers' Qwen2Config: sliding_window
# 4096, use_sliding_window False); the sizes are Qwen2-7B's (Yang et al., 2024, Table 1).
_QWEN2_7B = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
             "hidden_size": 3584, "sliding_window": 4096, "use_sliding_window": False,
             "torch_dtype": "bfloat16"}

# (name, config, context_length, expected bytes per token, {wrong answer: hint})
_KV_CASES = [
    ("Llama 3 8B", _LLAMA3_8B, 8192, 2 * 32 * 8 * 128 * 2, {
        2 * 32 * 32 * 128 * 2: "the cache holds num_key_value_heads heads (8), not one per query "
                               "head (32): that is the point of grouped-query attention",
        32 * 8 * 128 * 2: "each layer caches a key and a value for every key/value head",
        2 * 32 * 8 * 128 * 4: "bfloat16 numbers take 2 bytes",
        2 * 32 * 8 * 128 * 2 * 8192: "per token of context: divide the whole cache by "
                                     "context_length",
    }),
    ("LLaMA 7B (no num_key_value_heads, float16)", _LLAMA_7B, 4096, 2 * 32 * 32 * 128 * 2, {}),
    ("LLaMA 7B in float32", {**_LLAMA_7B, "torch_dtype": "float32"}, 100, 2 * 32 * 32 * 128 * 4, {
        2 * 32 * 32 * 128 * 2: "read the bytes per number from torch_dtype: float32 takes 4",
    }),
    ("Mistral 7B v0.1 at 32,768 tokens", _MISTRAL_7B, 32768, 2 * 32 * 8 * 128 * 2 * 4096 // 32768, {
        2 * 32 * 8 * 128 * 2: "a layer with a sliding window of W keeps only the last W tokens: at "
                              "T tokens of context it holds min(T, W) of them",
    }),
    ("Mistral 7B v0.1 at 2,048 tokens", _MISTRAL_7B, 2048, 2 * 32 * 8 * 128 * 2, {
        2 * 32 * 8 * 128 * 2 * 4096 // 2048: "while the context is shorter than the window, the "
                                             "window drops nothing: use min(T, W), not W",
    }),
    ("DeepSeek-V2", _DEEPSEEK_V2, 4096, 60 * (512 + 64) * 2, {
        2 * 60 * (512 + 64) * 2: "the latent stands for keys and values together: each layer "
                                 "caches kv_lora_rank + qk_rope_head_dim numbers per token, once",
        60 * 512 * 2: "the rotated key features (qk_rope_head_dim) are cached beside the latent",
        2 * 60 * 128 * 40 * 2: "a config with kv_lora_rank is multi-head latent attention: no "
                               "per-head keys and values are cached",
    }),
    ("gpt-oss-20b at 8,192 tokens", _GPT_OSS_20B, 8192, 12 * 2048 + 12 * 2048 * 128 // 8192, {
        24 * 2048 * 128 // 8192: "the window applies only to the layers whose layer_types entry "
                                 "is 'sliding_attention'; the 'full_attention' layers keep every "
                                 "token",
        24 * 2048: "this model's sliding_window applies to half of its layers (layer_types)",
        (12 * 2048 + 12 * 2048 * 128 // 8192) * 45 // 64: "when the config gives head_dim, use "
                                                          "it: here it is not hidden_size // "
                                                          "num_attention_heads",
    }),
    ("gpt-oss-20b at 64 tokens", _GPT_OSS_20B, 64, 24 * 2048, {}),
    ("Llama 3 8B saved by a recent transformers (dtype)", _LLAMA3_8B_NEW, 8192,
     2 * 32 * 8 * 128 * 2, {}),
    ("Qwen2-7B (use_sliding_window: false) at 32,768 tokens", _QWEN2_7B, 32768,
     2 * 28 * 4 * 128 * 2, {
        2 * 28 * 4 * 128 * 2 * 4096 // 32768: "this config has use_sliding_window: false: it "
                                              "names a window size but uses no window, so every "
                                              "layer keeps every token",
     }),
]

_MISSING_KEY_HINTS = {
    "num_key_value_heads": "older configs (LLaMA 1) have no num_key_value_heads: then every "
                           "query head has its own key/value head",
    "head_dim": "when the config has no head_dim, it is hidden_size // num_attention_heads",
    "sliding_window": "a config without sliding_window has no window: every layer keeps every "
                      "token",
    "layer_types": "without layer_types, the sliding window (if any) applies to every layer",
    "kv_lora_rank": "only multi-head latent attention configs have kv_lora_rank",
    "qk_rope_head_dim": "only multi-head latent attention configs have qk_rope_head_dim",
    "torch_dtype": "configs saved by recent versions of transformers call it dtype: read "
                   "whichever of dtype and torch_dtype the config has",
    "dtype": "older configs call it torch_dtype: read whichever of dtype and torch_dtype the "
             "config has",
    "use_sliding_window": "most configs have no use_sliding_window: only a config that sets "
                          "it to false switches its window off",
}


@checker
def check_kv_bytes_per_token(fn) -> None:
    """Check ``fn(config, context_length)``, the KV-cache bytes per token of a configuration.

    Taught in chapter 14 (Exercise 14.1).
    """
    try:  # a blank answer says so before anything else
        fn(dict(_LLAMA3_8B), 8192)
    except NotImplementedError:
        call(fn, dict(_LLAMA3_8B), 8192)
    except Exception:  # noqa: BLE001 - reported with its hint, config by config, below
        pass
    if not callable(fn):
        call(fn)
    for name, config, context_length, expected, wrong in _KV_CASES:
        value = number_from_config(fn, config, context_length, name="kv_bytes_per_token",
                                   config_name=f"the {name} config",
                                   key_hints=_MISSING_KEY_HINTS,
                                   returns="return the bytes per token as a number")
        if abs(value - expected) <= 1e-6 * expected:
            continue
        for wrong_value, hint in wrong.items():
            if abs(value - wrong_value) <= 1e-6 * wrong_value:
                fail(f"the bytes per token of {name} at T = {context_length:,}",
                     expected="a different number", actual=f"{value:,.6g}", hint=hint)
        fail(f"the bytes per token of {name} at T = {context_length:,}",
             expected="a different number", actual=f"{value:,.6g}",
             hint="per layer: 2 (a key and a value) x key/value heads x head_dim numbers, or "
                  "kv_lora_rank + qk_rope_head_dim for a latent; times the bytes of one number; "
                  "a window layer holds min(T, W) of the T tokens")
    passed("grouped-query heads, missing keys, the dtype under either name, windows on all, "
           "some or none of the layers and latent caches all come out right for six published "
           "configurations.")


# --------------------------------------------------------------------------- exercise 14.2

_STEP = {"T": 4096, "H": 128, "d_h": 128, "d_c": 512}


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_absorption_cost_prediction(fn) -> None:
    """Check ``fn()``, the predicted multiplications ``(plain, absorbed)`` of one decoding step.

    Taught in chapter 14 (Exercise 14.2).
    """
    T, H, d_h, d_c = (_STEP[key] for key in ("T", "H", "d_h", "d_c"))
    plain_expected = 2 * T * H * d_h * d_c + 2 * T * H * d_h
    absorbed_expected = 2 * H * d_h * d_c + 2 * T * H * d_c
    result = call(fn)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        fail("predicted_step_multiplications returns a pair", expected="(plain, absorbed)",
             actual=type(result).__name__, hint="return two whole numbers")
    try:
        plain, absorbed = (float(value) for value in result)
    except (TypeError, ValueError):
        fail("the prediction holds two numbers", expected="two whole numbers",
             actual=repr(result)[:80], hint="write the counts as products, e.g. 2 * 4096 * 128")
    plain_hints = {
        T * H * d_h * d_c + 2 * T * H * d_h: "the plain form projects every cached latent up "
                                             "twice: into a key and into a value",
        2 * T * H * d_h * d_c: "after the up-projections the plain form still scores the query "
                               "against T keys and sums T values",
        2 * T * H * d_h * d_c + T * H * d_h: "count both attention products: the scores and the "
                                             "weighted sum of the values",
        2 * H * d_h * d_c + 2 * T * H * d_h: "that is one token's up-projection: at every step "
                                             "the plain form projects all T cached latents",
    }
    absorbed_hints = {
        2 * T * H * d_c: "the absorbed form also moves the query into the latent space and "
                         "projects the latent context up once: count those two products",
        2 * T * H * d_h + 2 * H * d_h * d_c: "in the absorbed form the query and the cached "
                                             "latents have d_c features, not d_h",
        H * d_h * d_c + 2 * T * H * d_c: "count both small products: the query moved in, and "
                                         "the output projected up",
        2 * T * H * d_h * d_c + 2 * T * H * d_c: "the query is moved into the latent space "
                                                 "once per step, not once per cached token",
    }
    for name, value, expected, hints in (("plain", plain, plain_expected, plain_hints),
                                         ("absorbed", absorbed, absorbed_expected, absorbed_hints)):
        if value == expected:
            continue
        for wrong, hint in hints.items():
            if value == wrong:
                fail(f"the multiplications of the {name} form", expected="a different count",
                     actual=f"{value:,.0f}", hint=hint)
        fail(f"the multiplications of the {name} form", expected="a different count",
             actual=f"{value:,.0f}",
             hint="list the matrix products of the form, and for each multiply its three "
                  "sizes (rows x shared dim x columns), for every head")
    passed("the plain form pays for up-projecting every cached latent at every step; the "
           "absorbed form pays d_c instead of d_h in its attention products and nothing per "
           "cached token for projections.")


# --------------------------------------------------------------------------- exercise 14.3


def _rope_inputs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    batch, heads, tokens, head_dim, rope_dim, latent_dim = 2, 3, 5, 4, 2, 12
    content_queries = 2 * torch.randn(batch, heads, tokens, head_dim, generator=generator)
    key_up = torch.randn(heads, head_dim, latent_dim, generator=generator) / 2  # (H, d_h, d_c)
    latents = torch.randn(batch, tokens, latent_dim, generator=generator)  # (B, T, d_c)
    rope_queries = 2 * torch.randn(batch, heads, tokens, rope_dim, generator=generator)
    rope_keys = 2 * torch.randn(batch, tokens, rope_dim, generator=generator)  # (B, T, d_R)
    return content_queries, key_up, latents, rope_queries, rope_keys


def _plain_weights(content_queries, key_up, latents, rope_queries, rope_keys, scale_dim=None,
                   rope=True, causal=True):
    """Plain form: concatenated queries and keys of head_dim + rope_dim features."""
    content_keys = latents.unsqueeze(1) @ key_up.transpose(-2, -1)  # (B, H, T, d_h)
    queries, keys = content_queries, content_keys
    if rope:
        shared = rope_keys.unsqueeze(1).expand(-1, content_keys.size(1), -1, -1)  # (B, H, T, d_R)
        queries = torch.cat([content_queries, rope_queries], dim=-1)  # (B, H, T, d_h + d_R)
        keys = torch.cat([content_keys, shared], dim=-1)  # (B, H, T, d_h + d_R)
    size = queries.size(-1) if scale_dim is None else scale_dim
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(size)  # (B, H, T, T)
    if causal:
        scores = scores.masked_fill(~causal_mask(scores.size(-1)), float("-inf"))
    return torch.softmax(scores, dim=-1)


@checker
def check_decoupled_rope_weights(fn) -> None:
    """Check ``fn(absorbed_queries, rope_queries, latents, rope_keys, head_dim)``: MLA weights.

    Taught in chapter 14 (Exercise 14.3).
    """
    content_queries, key_up, latents, rope_queries, rope_keys = _rope_inputs(0)
    head_dim, rope_dim, latent_dim = key_up.size(1), rope_queries.size(-1), key_up.size(2)
    absorbed = content_queries @ key_up  # (B, H, T, d_c)
    expected = _plain_weights(content_queries, key_up, latents, rope_queries, rope_keys)
    weights = call(fn, absorbed.clone(), rope_queries.clone(), latents.clone(), rope_keys.clone(),
                   head_dim)
    expect_shape("the weights", weights, tuple(expected.shape), hint=(
        "one weight per head, query and key: (B, heads, T, T); the shared rotated keys "
        "(B, T, d_R) broadcast over the heads with unsqueeze(1)"))
    weights = weights.detach().to(expected.dtype)
    expect_true("each row of weights sums to 1",
                torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5),
                expected="rows that sum to 1", actual="rows that do not",
                hint="return the weights after the softmax, not the scores")
    expect_true("no query gives weight to a future key",
                bool((weights[..., ~causal_mask(weights.size(-1))] == 0).all()),
                expected="0 above the diagonal", actual="some weight on future keys",
                hint="decoding is causal: mask the scores before the softmax")
    wrong = {
        "1/sqrt(head_dim)": (_plain_weights(content_queries, key_up, latents, rope_queries,
                                            rope_keys, scale_dim=head_dim),
                             "the plain form's query and key have head_dim + d_R features, and "
                             "chapter 4's scale counts all of them"),
        "1/sqrt(latent_dim + d_R)": (_plain_weights(content_queries, key_up, latents,
                                                    rope_queries, rope_keys,
                                                    scale_dim=latent_dim + rope_dim),
                                     "absorbing changes the vectors, not the scores: scale by the "
                                     "size of the plain form's query and key"),
        "1/sqrt(latent_dim)": (_plain_weights(content_queries, key_up, latents, rope_queries,
                                              rope_keys, scale_dim=latent_dim),
                               "the absorbed query's size (latent_dim) is not the plain form's "
                               "head size"),
        "no rotated part": (_plain_weights(content_queries, key_up, latents, rope_queries,
                                           rope_keys, rope=False, scale_dim=head_dim + rope_dim),
                            "every score adds the rotated part: rope_queries . rope_keys"),
    }
    for name, (candidate, hint) in wrong.items():
        if torch.allclose(weights, candidate, atol=1e-5) and not torch.allclose(
                candidate, expected, atol=1e-5):
            fail("the weights equal the plain form's", expected="the concatenated plain form",
                 actual=f"the weights of scores with {name}", hint=hint)
    gap = (weights - expected).abs()
    if not torch.allclose(weights, expected, atol=1e-5):
        where = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
        fail("the weights equal the plain form's",
             expected=f"{expected[where].item():.4g} at index {where}",
             actual=f"{weights[where].item():.4g} at index {where}",
             hint="score = absorbed query . latent + rotated query . rotated key, both parts in "
                  "one score, scaled once; every head reads the same latents and rotated keys")
    passed("the latent part is absorbed, the rotated part is added, and the scale counts the "
           "plain form's head_dim + d_R features.")
