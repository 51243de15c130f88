"""attention_book: the shared code of *Attention, Step by Step*.

The functional core (``softmax``, ``scaled_dot_product_attention``,
``causal_mask``, ``padding_mask``) is built in chapters 2-6 and the layers
(``SelfAttention`` … ``GroupedQueryAttention``) in chapters 3-7; attention over
part of the keys and the merge of two parts (``partial_attention``, ``merge_partials``),
the online softmax and tiling (``tiled_attention``) in chapter 10; positions
inside attention (``rotary_embedding``, ``alibi_bias``) in chapter 12; sliding
windows, attention sinks (``sliding_window_mask``, ``softmax_with_sink``) and masks
as rules (``mods``) in chapter 13; multi-head latent attention
(``MultiHeadLatentAttention``) in chapter 14; each chapter ends by asserting that this
package equals the code it wrote.
Chapter 15 puts the layers inside a model (``TransformerBlock``, ``TinyGPT``) and measures
what its heads do (``previous_token_scores``, ``induction_scores``, ``find_heads``,
``ablate_heads``). Chapter 16 serves many requests at once: a paged KV cache
(``PagedKVCache``, ``paged_attention``, ``paged_forward``) and continuous batching
(``ContinuousBatcher``, ``generate_batch``). Chapter 17 splits one sequence over processes
(``attention_book.distributed``: all-gather, ring and Ulysses attention). Chapter 18 turns
attention into a recurrence (``linear_attention``, ``delta_rule``, ``RecurrentState``,
``LinearAttentionLayer``, ``GatedDeltaNet``).
Chapter 19 refines full attention: top-k attention chosen by a lightning indexer
(``topk_attention``, ``lightning_indexer_scores``, ``LightningIndexer``,
``indexer_distillation_loss``, ``block_topk_attention``).
Chapter 20 writes FlashAttention as Triton kernels (``flash_attention``, forward and backward;
``attention_book.triton_attention``); Triton is imported only when a kernel runs.
"""

from . import mods
from .attention import (
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
    softmax,
    softmax_with_sink,
)
from .diagnose import DiagnosisReport, diagnose
from .flash import (
    merge_partials,
    online_softmax,
    online_softmax_update,
    partial_attention,
    tile_plan,
    tiled_attention,
)
from .heads import (
    HeadReport,
    ablate_heads,
    find_heads,
    induction_scores,
    previous_token_scores,
)
from .kv_cache import KVCache, kv_cache_bytes
from .latent import MultiHeadLatentAttention
from .linear_attention import (
    GatedDeltaNet,
    LinearAttentionLayer,
    RecurrentState,
    delta_rule,
    linear_attention,
    recurrent_state_bytes,
)
from .model import TinyGPT, TransformerBlock, gpt_parameter_count
from .modules import (
    CausalSelfAttention,
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttention,
)
from .positions import alibi_bias, alibi_slopes, rotary_embedding
from .pretrained import load_pretrained
from .serving import (
    ContinuousBatcher,
    OutOfBlocksError,
    PagedKVCache,
    StepRecord,
    generate_batch,
    new_sequence_states,
    paged_attention,
    paged_forward,
)
from .sparse import (
    LightningIndexer,
    block_topk_attention,
    block_topk_mask,
    indexer_distillation_loss,
    lightning_indexer_scores,
    topk_attention,
    topk_mask,
)
from .triton_attention import flash_attention
from .viz import head_view, model_view, plot_attention, plot_heads

__version__ = "0.1.0"

__all__ = [
    "softmax",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "softmax_with_sink",
    "mods",
    "SelfAttention",
    "CausalSelfAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
    "GroupedQueryAttention",
    "MultiHeadLatentAttention",
    "online_softmax",
    "online_softmax_update",
    "partial_attention",
    "merge_partials",
    "tile_plan",
    "tiled_attention",
    "KVCache",
    "kv_cache_bytes",
    "diagnose",
    "DiagnosisReport",
    "plot_attention",
    "plot_heads",
    "head_view",
    "model_view",
    "load_pretrained",
    "rotary_embedding",
    "alibi_bias",
    "alibi_slopes",
    "TransformerBlock",
    "TinyGPT",
    "gpt_parameter_count",
    "previous_token_scores",
    "induction_scores",
    "find_heads",
    "HeadReport",
    "ablate_heads",
    "PagedKVCache",
    "OutOfBlocksError",
    "paged_attention",
    "paged_forward",
    "new_sequence_states",
    "ContinuousBatcher",
    "StepRecord",
    "generate_batch",
    "linear_attention",
    "delta_rule",
    "RecurrentState",
    "LinearAttentionLayer",
    "GatedDeltaNet",
    "recurrent_state_bytes",
    "flash_attention",
    "topk_mask",
    "topk_attention",
    "lightning_indexer_scores",
    "LightningIndexer",
    "indexer_distillation_loss",
    "block_topk_mask",
    "block_topk_attention",
]
