"""TinyGPT with every kind of token mixer the caches must serve, shared by the model and serving tests.

``variant(name)`` builds a small float64 model in eval mode: learned positions, RoPE,
grouped-query attention (with RoPE), multi-head latent attention, attention sinks, and a
hybrid whose first layer is a stand-in for a recurrent mixer (:class:`CausalMean`, with the
fixed-size cache :class:`RunningSum`), and the hybrids of chapter 18: a Gated DeltaNet layer
under an attention layer, and an attention layer under linear attention (each recurrent layer
with its :class:`~attention_book.RecurrentState`).
"""

from __future__ import annotations

import torch

import attention_book as ab
from attention_book.model import TinyGPT


class RunningSum:
    """The stand-in mixer's cache: a running sum of its values and a count, of fixed size.

    It follows the model's cache protocol (``len`` and ``positions``), and ``stack``, with
    which a server batches the states of several sequences, as a linear-attention layer's
    recurrent state does.
    """

    def __init__(self):
        self.total = None  # (B, d_model): the sum of the values of every token seen
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def positions(self, num_new, device):
        return torch.arange(self.count, self.count + num_new, device=device)  # (T_new,)

    def advance(self, num_new: int, total: torch.Tensor) -> None:
        self.total, self.count = total, self.count + num_new

    @staticmethod
    def stack(states: list) -> StackedSums:
        return StackedSums(states)


class StackedSums(RunningSum):
    """Several sequences' sums as one batch; each row has its own count and positions."""

    def __init__(self, states: list):
        super().__init__()
        self.states = states
        self.count = max(len(state) for state in states)
        held = [state.total for state in states if state.total is not None]
        if held:
            self.total = torch.cat([torch.zeros_like(held[0]) if state.total is None
                                    else state.total for state in states])  # (B, d_model)

    def positions(self, num_new, device):
        starts = torch.tensor([len(state) for state in self.states], device=device)  # (B,)
        return starts[:, None] + torch.arange(num_new, device=device)  # (B, T_new)

    def advance(self, num_new: int, total: torch.Tensor) -> None:
        for row, state in enumerate(self.states):
            state.advance(num_new, total[row:row + 1])
        self.total, self.count = total, self.count + num_new


class CausalMean(torch.nn.Module):
    """A token mixer that is no attention: token t gets the mean of the values of tokens 0 … t."""

    def __init__(self, d_model: int, dtype=torch.float64):
        super().__init__()
        self.W_value = torch.nn.Linear(d_model, d_model, bias=False, dtype=dtype)
        self.out_proj = torch.nn.Linear(d_model, d_model, dtype=dtype)

    def new_cache(self, max_length: int) -> RunningSum:
        return RunningSum()

    def forward(self, x, mask=None, return_weights=False, *, kv_cache=None):
        sums = self.W_value(x).cumsum(dim=1)  # (B, T, d_model)
        positions = torch.arange(x.size(1), device=x.device)  # (T,)
        if kv_cache is not None:
            positions = kv_cache.positions(x.size(1), x.device)  # (T,) or (B, T)
            if kv_cache.total is not None:
                sums = sums + kv_cache.total[:, None]  # (B, T, d_model)
            kv_cache.advance(x.size(1), sums[:, -1])
        out = self.out_proj(sums / (positions + 1)[..., None].to(x.dtype))  # (B, T, d_model)
        return (out, None) if return_weights else out


def variant(name: str) -> TinyGPT:
    """TinyGPT with each kind of token mixer the caches must serve (float64, eval mode)."""
    sizes = {"vocab_size": 11, "d_model": 16, "num_heads": 4, "num_layers": 2,
             "context_length": 12}
    torch.manual_seed(0)
    f64 = {"context_length": 12, "dtype": torch.float64}
    mixers = {
        "learned positions": None,
        "rope": None,
        "gqa": [ab.GroupedQueryAttention(16, 16, 4, 2, rope=True, **f64) for _ in range(2)],
        "latent": [ab.MultiHeadLatentAttention(16, 16, 4, 6, **f64) for _ in range(2)],
        "sink": [ab.MultiHeadAttention(16, 16, 4, sink=True, **f64) for _ in range(2)],
        "hybrid": [CausalMean(16), None],
        "gated deltanet hybrid": [ab.GatedDeltaNet(16, 4, chunk_size=4, dtype=torch.float64), None],
        "linear attention hybrid": [None, ab.LinearAttentionLayer(16, 2, dtype=torch.float64)],
        # PyTorch's fused kernel, as a server runs it: no weights to return
        "fused": [ab.GroupedQueryAttention(16, 16, 4, 2, backend="sdpa", **f64)
                  for _ in range(2)],
    }[name]
    model = TinyGPT(**sizes, rope=name in ("rope", "gqa"), mixers=mixers, dtype=torch.float64)
    if name == "sink":
        with torch.no_grad():
            for block in model.blocks:
                block.attention.sink_logit.copy_(torch.tensor([0.5, -1.0, 0.0, 2.0]))
    return model.eval()


VARIANTS = ["learned positions", "rope", "gqa", "latent", "sink", "hybrid", "gated deltanet hybrid",
            "linear attention hybrid", "fused"]
