"""Argument checks shared by the package: one message for one mistake, wherever it is made.

Every public function and layer of the book validates its input at the boundary and raises a
``TypeError`` or ``ValueError`` whose message names the sizes involved. The checks that more
than one module needs live here, so each mistake is described once. This module imports
nothing else from ``attention_book``.
"""

from __future__ import annotations

import math
import re

import torch


def require_float(name: str, tensor: torch.Tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got dtype {tensor.dtype}; "
            f"convert it with {name}.float()"
        )


def check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def broadcast_shape(*shapes: tuple[int, ...]) -> torch.Size | None:
    """The shape that ``shapes`` broadcast to, or None when they do not broadcast.

    The rule of ``torch.broadcast_shapes`` (align on the right; a size of 1 stretches), in
    plain Python: every attention call checks its shapes, and ``torch.broadcast_shapes`` (some
    60 microseconds a call) took about 8% of the time of the serving benchmark's decoding steps.
    """
    ndim = max((len(shape) for shape in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        for index, size in enumerate(shape, ndim - len(shape)):
            if size == 1 or size == result[index]:
                continue
            if result[index] != 1:
                return None
            result[index] = size
    return torch.Size(result)


def check_mask(mask: torch.Tensor, scores_shape: torch.Size) -> None:
    """Raise unless ``mask`` is boolean and broadcasts to ``scores_shape`` unchanged."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got {got}")
    if broadcast_shape(mask.shape, scores_shape) != scores_shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores of shape {tuple(scores_shape)} (..., T_q, T_k)"
        )


def check_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Size:
    """Validate query/key/value for attention and return their broadcast leading dims."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        require_float(name, tensor)
        if tensor.dim() < 2:
            raise ValueError(
                f"{name} must have at least 2 dims (..., T, d), got shape {tuple(tensor.shape)}"
            )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must have the same feature size d_k: query has {query.size(-1)} "
            f"(shape {tuple(query.shape)}), key has {key.size(-1)} (shape {tuple(key.shape)})"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value must have the same length T_k: key has {key.size(-2)} "
            f"(shape {tuple(key.shape)}), value has {value.size(-2)} (shape {tuple(value.shape)})"
        )
    lead = broadcast_shape(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if lead is None:
        raise ValueError(
            f"the leading (batch) dims do not broadcast: query {tuple(query.shape)}, "
            f"key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    return lead


def check_dropout(dropout: object) -> None:
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise TypeError(f"dropout must be a float, got {type(dropout).__name__}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must lie in [0, 1), got {dropout}")


def check_layer_input(x: torch.Tensor, d_in: int, context_length: int | None) -> int:
    """Validate ``x`` of shape ``(..., T, d_in)`` and return ``T``."""
    require_float("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, d_in), got shape {tuple(x.shape)}")
    if x.size(-1) != d_in:
        raise ValueError(
            f"x has {x.size(-1)} features in its last dim (shape {tuple(x.shape)}) "
            f"but the layer was built with d_in={d_in}"
        )
    num_tokens = x.size(-2)
    if context_length is not None and num_tokens > context_length:
        raise ValueError(
            f"sequence length T={num_tokens} exceeds context_length={context_length} "
            f"(x has shape {tuple(x.shape)})"
        )
    return num_tokens


def check_base(base: object) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base must be a float, got {type(base).__name__}")
    if not math.isfinite(base) or base <= 0:
        raise ValueError(f"base must be a positive number, got {base}")
    return float(base)


ID_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def check_element_id(element_id: object) -> None:
    """Raise ``ValueError`` unless ``element_id`` can serve as a fixed HTML id."""
    if not isinstance(element_id, str) or not ID_PATTERN.match(element_id):
        raise ValueError(
            "element_id must start with a letter and hold only letters, digits, '-' and '_', "
            f"got {element_id!r}"
        )
