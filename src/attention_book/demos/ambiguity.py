"""Chapter 9's trained classifier, running in the page: type a sentence, watch it read.

:func:`read_sentence` is the PyTorch reference of what the page computes; :func:`export_classifier`
puts the weights into the page and :func:`classifier_from_export` rebuilds the model from them;
:func:`ambiguity_demo` is the demo itself (its script: ``assets/ambiguity.js``).

Besides the prediction, the demo says in the demo what the model's answer rests on: when the
sentence holds none of the cue words the model learned for the ambiguous word (the answer is
then a guess, however confident), when it holds several ambiguous words (the model reads only
the first), and when no other word gets a clear share of the attention (then no word gets the
star).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import re
import struct
from collections.abc import Mapping, Sequence

import torch
from IPython.display import HTML

from ..checks import check_element_id
from .page import RUN_HINT, cell_background, script, style

__all__ = [
    "EXPORT_DECIMALS",
    "CLEAR_FOCUS",
    "SentenceReading",
    "read_sentence",
    "export_classifier",
    "classifier_from_export",
    "ambiguity_demo",
]

#: How the weights travel into the page: each one rounded to this many decimals and stored
#: as a little-endian int32 (value * 10**decimals), base64-encoded. Seven decimals keep the
#: page's probabilities within 1e-6 of PyTorch's (chapter 9 measures it), and a last-bit
#: difference between two CPUs (about 1e-14 after chapter 9's float64 training) is far too
#: small to move a weight across a rounding boundary, so the stored page is the same everywhere.
EXPORT_DECIMALS = 7
#: The smallest mean weight (over the heads) on another word that counts as a clear focus: the
#: demo stars the word the ambiguous word attends to most only when it gets at least this much.
CLEAR_FOCUS = 0.1
_EXPORT_LAYOUT = (  # (name in the payload, parameter of AttentionClassifier)
    ("embedding", "embedding.weight"),
    ("W_query", "attention.W_query.weight"),
    ("W_key", "attention.W_key.weight"),
    ("W_value", "attention.W_value.weight"),
    ("out_proj_weight", "attention.out_proj.weight"),
    ("out_proj_bias", "attention.out_proj.bias"),
    ("head_weight", "head.weight"),
    ("head_bias", "head.bias"),
)
_WORD_EDGE = re.compile(r"^[^a-z0-9]+|[^a-z0-9]+$")
#: What a note of :attr:`SentenceReading.notes` says, in the order the demo shows them.
_NOTES = ("several-ambiguous", "no-cue", "no-clear-focus")


def _split_words(sentence: str) -> list[str]:
    """The demo's tokeniser: lower case, split on white space, punctuation trimmed from the ends."""
    words = []
    for raw in sentence.lower().split():
        word = _WORD_EDGE.sub("", raw)
        if word:
            words.append(word)
    return words


def _ambiguous_words(labels: Sequence[str]) -> list[str]:
    """The words the classifier disambiguates, from its ``"word/sense"`` labels, in label order."""
    words: list[str] = []
    for label in labels:
        word, slash, sense = str(label).partition("/")
        if not (word and slash and sense):
            raise ValueError(f"labels must look like 'word/sense', got {label!r}")
        if word not in words:
            words.append(word)
    return words


def _cue_words(labels: Sequence[str], cues: Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    """The cue words of each ambiguous word: ``cues``, or chapter 9's data set's by default.

    The default is :data:`attention_book.data.AMBIGUOUS_WORDS`, the cue words of both senses of
    each word, for the words the labels name; a word it does not list gets no cue words, and
    then no "no cue" note.
    """
    if cues is None:
        from ..data import AMBIGUOUS_WORDS

        cues = {word: [cue for sense in senses.values() for cue in sense]
                for word, senses in AMBIGUOUS_WORDS.items()}
    if not isinstance(cues, Mapping):
        raise TypeError(f"cues must map each ambiguous word to its cue words, got {type(cues).__name__}")
    words = _ambiguous_words(labels)
    result = {}
    for word, cue_words in cues.items():
        if isinstance(cue_words, str) or not all(isinstance(c, str) for c in cue_words):
            raise TypeError(f"the cue words of {word!r} must be a list of strings, got {cue_words!r}")
        if word in words:
            result[word] = list(cue_words)
    return result


def _check_classifier(model, vocab, labels) -> None:
    from ..train import AttentionClassifier

    if not isinstance(model, AttentionClassifier):
        raise TypeError(
            f"model must be an attention_book.train.AttentionClassifier, got {type(model).__name__}"
        )
    if not hasattr(vocab, "itos") or not hasattr(vocab, "stoi"):
        raise TypeError(f"vocab must be an attention_book.data.Vocabulary, got {type(vocab).__name__}")
    if len(vocab) != model.embedding.num_embeddings:
        raise ValueError(
            f"the vocabulary has {len(vocab)} words but the model embeds "
            f"{model.embedding.num_embeddings}"
        )
    if len(labels) != model.head.out_features:
        raise ValueError(f"got {len(labels)} labels but the model scores {model.head.out_features}")
    _ambiguous_words(labels)


@dataclasses.dataclass(frozen=True)
class SentenceReading:
    """What chapter 9's classifier makes of one typed sentence, as the ambiguity demo shows it.

    Attributes:
        words: the typed words after the demo's tokenisation (lower case, punctuation
            trimmed from the ends of each word).
        unknown: the words that are not in the vocabulary, each once, in order; the model
            has no vector for them, so it reads the sentence without them.
        tokens: the words the model reads: the known ones, in order.
        status: ``"ok"``; ``"empty"`` (no word typed); ``"too-long"`` (more known words than
            the model's ``context_length``); or ``"no-ambiguous-word"``.
        word_index: position in ``tokens`` of the ambiguous word (the first one, if there are
            several); -1 unless ``status == "ok"``.
        probabilities: the softmax of the logits, one per label, shape ``(num_classes,)``;
            ``None`` unless ``status == "ok"``.
        attention: the weights from the ambiguous word to every token, one row per head,
            shape ``(num_heads, len(tokens))``; ``None`` unless ``status == "ok"``.
        attended_index: position in ``tokens`` of the word, other than the ambiguous word
            itself, with the largest weight averaged over the heads; -1 if there is none.
        ambiguous_indices: positions in ``tokens`` of every ambiguous word, in order (the
            first is ``word_index``); empty unless ``status == "ok"``.
        cue_indices: positions in ``tokens`` of the cue words of the ambiguous word (the words
            that decide its sense in the training data).
        notes: what the demo warns about, in this order: ``"several-ambiguous"`` (more than
            one ambiguous word: the model reads only the first), ``"no-cue"`` (no cue word of
            the ambiguous word: nothing decides its sense), ``"no-clear-focus"`` (no other
            word gets a mean weight of :data:`CLEAR_FOCUS` or more: no star).

    Taught in chapter 9.
    """

    words: tuple[str, ...]
    unknown: tuple[str, ...]
    tokens: tuple[str, ...]
    status: str
    word_index: int = -1
    probabilities: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    attended_index: int = -1
    ambiguous_indices: tuple[int, ...] = ()
    cue_indices: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def word(self) -> str | None:
        """The ambiguous word the model classifies, or ``None``."""
        return self.tokens[self.word_index] if self.word_index >= 0 else None

    @property
    def attended_word(self) -> str | None:
        """The word the ambiguous word attends to most (itself left out), or ``None``."""
        return self.tokens[self.attended_index] if self.attended_index >= 0 else None


def read_sentence(model, vocab, labels: Sequence[str], sentence: str, *,
                  cues: Mapping[str, Sequence[str]] | None = None) -> SentenceReading:
    """Run chapter 9's classifier on a typed sentence, exactly as the ambiguity demo does.

    The sentence is split into lower-case words with punctuation trimmed; words that are
    not in ``vocab`` are left out (the model has no vector for them); the first word that
    one of the labels names (``"minute"`` for ``"minute/time"``) is the ambiguous word, whose
    context vector the classifier reads. This is the PyTorch reference that the page's
    JavaScript forward pass is tested against. The reading also notes what the demo warns
    about (:attr:`SentenceReading.notes`).

    Args:
        model: a trained :class:`~attention_book.train.AttentionClassifier`.
        vocab: its :class:`~attention_book.data.Vocabulary`.
        labels: its class names, ``"word/sense"``.
        sentence: the text a reader typed.
        cues: the cue words of each ambiguous word; default: those of chapter 9's data set
            (:data:`attention_book.data.AMBIGUOUS_WORDS`, both senses).

    Shapes:
        ``probabilities`` ``(num_classes,)``, ``attention`` ``(num_heads, T)`` with ``T`` the
        number of known words.

    Returns:
        A :class:`SentenceReading`.

    Taught in chapter 9.
    """
    _check_classifier(model, vocab, labels)
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    cue_words = _cue_words(labels, cues)
    words = _split_words(sentence)
    known = [w for w in words if vocab.stoi.get(w, 0) > 0]  # id 0 is padding, never a word
    unknown = tuple(dict.fromkeys(w for w in words if vocab.stoi.get(w, 0) == 0))
    base = {"words": tuple(words), "unknown": unknown, "tokens": tuple(known)}
    ambiguous = set(_ambiguous_words(labels))
    if not words:
        return SentenceReading(status="empty", **base)
    if len(known) > model.context_length:
        return SentenceReading(status="too-long", **base)
    ambiguous_indices = tuple(i for i, w in enumerate(known) if w in ambiguous)
    if not ambiguous_indices:
        return SentenceReading(status="no-ambiguous-word", **base)
    word_index = ambiguous_indices[0]
    device = model.embedding.weight.device
    ids = torch.tensor([vocab.encode(known)], device=device)  # (1, T)
    with torch.no_grad():
        logits, weights = model(ids, torch.tensor([len(known)], device=device),
                                torch.tensor([word_index], device=device), return_weights=True)
    probabilities = torch.softmax(logits[0], dim=-1).cpu()  # (num_classes,)
    attention = weights[0, :, word_index].cpu()  # (num_heads, T)
    mean = attention.mean(dim=0)  # (T,)
    others = [i for i in range(len(known)) if i != word_index]
    attended = max(others, key=lambda i: (float(mean[i]), -i)) if others else -1
    word_cues = cue_words.get(known[word_index])
    cue_indices = tuple(i for i, w in enumerate(known) if word_cues and w in word_cues)
    notes = []
    if len(ambiguous_indices) > 1:
        notes.append("several-ambiguous")
    if word_cues is not None and not cue_indices:
        notes.append("no-cue")
    if attended >= 0 and float(mean[attended]) < CLEAR_FOCUS:
        notes.append("no-clear-focus")
    return SentenceReading(status="ok", word_index=word_index, probabilities=probabilities,
                           attention=attention, attended_index=attended,
                           ambiguous_indices=ambiguous_indices, cue_indices=cue_indices,
                           notes=tuple(notes), **base)


def export_classifier(model, vocab, labels: Sequence[str], *,
                      decimals: int = EXPORT_DECIMALS) -> dict:
    """Everything the page needs to run chapter 9's classifier: sizes, words, labels, weights.

    The weights are rounded to ``decimals`` decimals and stored as base64 of little-endian
    int32 (``round(w * 10**decimals)``), in the order embedding, ``W_query``, ``W_key``,
    ``W_value``, ``out_proj`` weight and bias, head weight and bias (row-major, as PyTorch
    stores them). The result is deterministic and survives ``json.dumps``.

    Args:
        model: a trained :class:`~attention_book.train.AttentionClassifier`.
        vocab: its :class:`~attention_book.data.Vocabulary`.
        labels: its class names, ``"word/sense"``.
        decimals: decimals kept per weight (1 to 8).

    Returns:
        A dict: ``d_model``, ``num_heads``, ``context_length``, ``positional_encoding``,
        ``vocab`` (id order, ``"<pad>"`` first), ``labels``, ``decimals``, ``layout``
        (``[name, rows, cols]`` per tensor, ``cols == 0`` for a vector) and ``weights``.

    Taught in chapter 9.
    """
    _check_classifier(model, vocab, labels)
    if isinstance(decimals, bool) or not isinstance(decimals, int) or not 1 <= decimals <= 8:
        raise ValueError(f"decimals must be an int from 1 to 8, got {decimals!r}")
    state = model.state_dict()
    scale = 10.0**decimals
    layout, chunks = [], []
    for name, key in _EXPORT_LAYOUT:
        tensor = state[key].detach().to("cpu", torch.float64)
        if not torch.isfinite(tensor).all():
            raise ValueError(f"{key} holds a NaN or an infinity; train the model again")
        fixed = torch.round(tensor * scale)
        if fixed.abs().max() > 2**31 - 1:
            raise ValueError(f"{key} has a weight too large to store with {decimals} decimals")
        rows, cols = (tensor.shape[0], tensor.shape[1]) if tensor.dim() == 2 else (tensor.shape[0], 0)
        layout.append([name, rows, cols])
        values = [int(v) for v in fixed.flatten().tolist()]
        chunks.append(struct.pack(f"<{len(values)}i", *values))
    return {
        "d_model": model.embedding.embedding_dim,
        "num_heads": model.attention.num_heads,
        "context_length": model.context_length,
        "positional_encoding": bool(model.positional_encoding),
        "vocab": list(vocab.itos),
        "labels": [str(label) for label in labels],
        "decimals": decimals,
        "layout": layout,
        "weights": base64.b64encode(b"".join(chunks)).decode("ascii"),
    }


def classifier_from_export(payload: dict):
    """Rebuild an :class:`~attention_book.train.AttentionClassifier` from :func:`export_classifier`.

    The model holds the page's rounded weights, in float64: what the demo computes with.

    Args:
        payload: the dict returned by :func:`export_classifier`.

    Returns:
        ``(model, vocab, labels)``: the classifier (in eval mode), a
        :class:`~attention_book.data.Vocabulary` and the list of labels.

    Taught in chapter 9.
    """
    from ..data import Vocabulary
    from ..train import AttentionClassifier

    vocab = Vocabulary(payload["vocab"][1:])
    labels = list(payload["labels"])
    model = AttentionClassifier(len(vocab), len(labels), payload["d_model"], payload["num_heads"],
                                payload["context_length"],
                                positional_encoding=payload["positional_encoding"],
                                dtype=torch.float64)
    raw = base64.b64decode(payload["weights"])
    values = torch.tensor(struct.unpack(f"<{len(raw) // 4}i", raw), dtype=torch.float64)
    values = values / 10.0 ** payload["decimals"]
    state, start = {}, 0
    for (name, rows, cols), (expected, key) in zip(payload["layout"], _EXPORT_LAYOUT, strict=True):
        if name != expected:
            raise ValueError(f"unexpected tensor {name!r} in the payload (expected {expected!r})")
        count = rows * max(cols, 1)
        chunk = values[start : start + count]
        state[key] = chunk.view(rows, cols) if cols else chunk
        start += count
    if start != values.numel():
        raise ValueError(f"the payload holds {values.numel()} weights, the layout {start}")
    model.load_state_dict(state)
    return model.eval(), vocab, labels



def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]




def _suggestions(word: str, known: Sequence[str], ambiguous: Sequence[str], count: int = 3) -> list[str]:
    """The ``count`` known words closest to ``word`` in edit distance (ties: vocabulary order).

    An ambiguous word is never offered: putting one in would change which word the model reads.
    """
    candidates = [w for w in known if w not in ambiguous]
    ranked = sorted(range(len(candidates)), key=lambda i: (_edit_distance(word, candidates[i]), i))
    return [candidates[i] for i in ranked[:count]]


def _message(kind: str, text: str) -> str:
    return f'<p class="ab-message" data-message="{kind}">{text}</p>'


def _strong(word: str) -> str:
    return f"<strong>{html.escape(word)}</strong>"


def _and(items: Sequence[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


def _unknown_message(unknown: Sequence[str], known: Sequence[str], ambiguous: Sequence[str]) -> str:
    """One message for every unknown word, each with its suggested replacements as buttons."""

    def chips(word):
        return "".join(
            f'<button type="button" class="ab-chip" data-replace="{html.escape(word)}" '
            f'data-word="{html.escape(s)}">{html.escape(s)}</button>'
            for s in _suggestions(word, known, ambiguous))

    pick = "(or pick one from the list of all its words below)"
    if len(unknown) == 1:
        word = unknown[0]
        return _message("unknown", f"The model has never seen {_strong(word)}, so it reads the "
                                   f"sentence without it. Replace it with a word it knows: "
                                   f"{chips(word)} {pick}.")
    items = " ".join(f'<span class="ab-replace">{_strong(w)}: {chips(w)}</span>' for w in unknown)
    return _message("unknown", f"The model has never seen {_and([_strong(w) for w in unknown])}, "
                               "so it reads the sentence without them. Replace each with a word "
                               f"it knows {pick}: {items}")


def _render_reading(element_id: str, reading: SentenceReading, labels: Sequence[str],
                    known: Sequence[str], ambiguous: Sequence[str], context_length: int,
                    cues: Mapping[str, Sequence[str]]) -> str:
    """The demo's output area for one reading; the script's ``render`` draws the same markup."""
    parts = []
    if reading.words:
        spans = []
        for word in reading.words:
            if word in reading.unknown:
                spans.append(f'<span class="ab-word-unknown">{html.escape(word)} '
                             '<span class="ab-tag">unknown</span></span>')
            elif reading.status == "ok" and word == reading.word:
                spans.append(f"<span><strong>{html.escape(word)}</strong></span>")
            else:
                spans.append(f"<span>{html.escape(word)}</span>")
        parts.append(f'<p class="ab-words">Words: {" ".join(spans)}</p>')
    listed = ", ".join(ambiguous[:-1]) + " or " + ambiguous[-1] if len(ambiguous) > 1 else ambiguous[0]
    if reading.status == "empty":
        parts.append(_message("empty", f"Type a sentence with {html.escape(listed)}."))
    if reading.unknown:
        parts.append(_unknown_message(reading.unknown, known, ambiguous))
    if reading.status == "too-long":
        parts.append(_message(
            "too-long",
            f"This sentence has {len(reading.tokens)} words the model knows; it reads at most "
            f"{context_length} (its context length). Remove "
            f"{len(reading.tokens) - context_length} of them."))
    if reading.status == "no-ambiguous-word":
        parts.append(_message(
            "no-ambiguous-word",
            f"No ambiguous word: the model tells the senses of {html.escape(listed)} apart. "
            "Add one of them."))
    if reading.status == "ok":
        parts.append(_render_prediction(element_id, reading, labels, cues))
    return "".join(parts)


def _render_prediction(element_id: str, reading: SentenceReading, labels: Sequence[str],
                       cues: Mapping[str, Sequence[str]]) -> str:
    probabilities = reading.probabilities.tolist()
    best = max(range(len(labels)), key=lambda c: (probabilities[c], -c))
    word = html.escape(reading.word)
    mean = reading.attention.mean(dim=0).tolist()
    focused = reading.attended_index >= 0 and "no-clear-focus" not in reading.notes
    summary = (f"The model reads <strong>{word}</strong> as <strong>{html.escape(labels[best])}"
               f"</strong> (probability {probabilities[best]:.3f})")
    if focused:
        summary += f"; it attends most to {_strong(reading.attended_word)} (★ below)."
    elif reading.attended_index >= 0:
        summary += ("; no other word stands out: the most attention any other word gets is "
                    f"{mean[reading.attended_index]:.2f} ({_strong(reading.attended_word)}), less "
                    f"than {CLEAR_FOCUS:.2f}, so no word has a ★.")
    else:
        summary += "; there is no other word to attend to."
    notes = []
    if "several-ambiguous" in reading.notes:
        found = [_strong(reading.tokens[t]) for t in reading.ambiguous_indices]
        notes.append(_message(
            "several-ambiguous",
            f"This sentence has {len(found)} ambiguous words ({', then '.join(found)}): the model "
            f"classifies only the first, <strong>{word}</strong>, and reads the others as "
            "ordinary words."))
    if "no-cue" in reading.notes:
        cue_words = cues[reading.word]
        notes.append(_message(
            "no-cue",
            f"No word here is one of the {len(cue_words)} cue words the model learned for "
            f"<strong>{word}</strong> ({', '.join(html.escape(c) for c in cue_words)}): nothing "
            "in this sentence decides its sense, yet the model must answer with one of its "
            "labels, so the probability above is a guess, however high."))
    rows = []
    own = [c for c, label in enumerate(labels) if label.partition("/")[0] == reading.word]
    for c in own:
        rows.append(
            f'<tr><th scope="row">{html.escape(labels[c])}</th><td><div class="ab-bar-track">'
            f'<div class="ab-bar" style="width:{100 * probabilities[c]:.1f}%"></div></div></td>'
            f"<td>{probabilities[c]:.3f}</td></tr>")
    if len(own) < len(labels):
        rest = 0.0
        for c, p in enumerate(probabilities):
            if c not in own:
                rest += p
        rows.append(
            f'<tr><th scope="row">the other {len(labels) - len(own)} labels</th><td>'
            f'<div class="ab-bar-track"><div class="ab-bar" style="width:{100 * rest:.1f}%"></div>'
            f"</div></td><td>{rest:.3f}</td></tr>")
    num_heads = reading.attention.shape[0]
    head_cols = "".join(f'<th scope="col">head {h}</th>' for h in range(num_heads))
    weight_rows = []
    for t, token in enumerate(reading.tokens):
        label = html.escape(token)
        if t == reading.word_index:
            label = f"<strong>{label}</strong> (itself)"
        starred = focused and t == reading.attended_index
        if starred:
            label = (f'<span aria-hidden="true">★ </span>{label}'
                     '<span class="ab-sr-only"> (most attention)</span>')
        cells = "".join(
            f'<td style="background:{cell_background(w)}">{w:.2f}</td>'
            for w in [*reading.attention[:, t].tolist(), mean[t]])
        row_class = ' class="ab-attended"' if starred else ""
        weight_rows.append(f'<tr{row_class}><th scope="row">{label}</th>{cells}</tr>')
    if focused or reading.attended_index < 0:
        star_note = (f"★ marks the word that <strong>{word}</strong> attends to most: the largest "
                     "mean weight over the heads, the word itself left out, when it is at least "
                     f"{CLEAR_FOCUS:.2f}. Each column of weights sums to 1.")
    else:
        star_note = (f"No ★: no word but <strong>{word}</strong> itself gets a mean weight of "
                     f"{CLEAR_FOCUS:.2f} or more. Each column of weights sums to 1.")
    return (
        f'<p class="ab-prediction" id="{element_id}-prediction">{summary}</p>{"".join(notes)}'
        f'<div class="ab-side-by-side"><table><caption>Probability of each sense</caption>'
        f'<thead><tr><th scope="col">label</th><th scope="col">probability as a bar</th>'
        f'<th scope="col">probability</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
        f"<table><caption>Attention from <strong>{word}</strong> to each word</caption>"
        f'<thead><tr><th scope="col">word</th>{head_cols}<th scope="col">mean</th></tr></thead>'
        f'<tbody>{"".join(weight_rows)}</tbody></table></div>'
        f'<p class="ab-note">{star_note}</p>'
    )


def ambiguity_demo(
    model,
    vocab,
    labels: Sequence[str],
    *,
    element_id: str,
    sentence: str,
    title: str = "Type a sentence: the trained classifier reads it in this page",
    cues: Mapping[str, Sequence[str]] | None = None,
) -> HTML:
    """A text box whose sentence chapter 9's trained classifier reads as the reader types.

    The weights travel into the page (:func:`export_classifier`, about 37 KB of base64), and
    the script (``assets/ambiguity.js``) repeats
    :class:`~attention_book.train.AttentionClassifier`'s forward pass in JavaScript:
    embeddings, positional encoding, one multi-head attention layer with its padding mask,
    ``out_proj``, the linear head. It shows the predicted sense with its probabilities and, per
    head, the attention from the ambiguous word to every word, with a star on the word it
    attends to most when that word gets a clear share (:data:`CLEAR_FOCUS`). It says when the
    answer rests on no cue word, when the sentence has several ambiguous words (the model reads
    the first), and lists the unknown words in one message, each with known words offered as
    buttons (never an ambiguous one); a sentence without an ambiguous word, or longer than the
    context, gets a message instead. The first rendering, for ``sentence``, is computed here by
    :func:`read_sentence` in PyTorch.

    Args:
        model: a trained :class:`~attention_book.train.AttentionClassifier`.
        vocab: its :class:`~attention_book.data.Vocabulary`.
        labels: its class names, ``"word/sense"``.
        element_id: a fixed id, unique on the page.
        sentence: the sentence in the box at first.
        title: the caption above the demo.
        cues: the cue words of each ambiguous word; default: those of chapter 9's data set.

    Returns:
        An ``IPython.display.HTML`` with the demo.

    Taught in chapter 9.
    """
    check_element_id(element_id)
    reading = read_sentence(model, vocab, labels, sentence, cues=cues)
    cue_words = _cue_words(labels, cues)
    payload = export_classifier(model, vocab, labels)
    known = list(vocab.itos[1:])
    ambiguous = _ambiguous_words(labels)
    input_id = f"{element_id}-input"
    output = _render_reading(element_id, reading, labels, known, ambiguous, model.context_length,
                             cue_words)

    def chips(words):
        return "".join(f'<button type="button" class="ab-chip" data-word="{html.escape(w)}">'
                       f"{html.escape(w)}</button>" for w in words)

    others = [w for w in known if w not in ambiguous]
    markup = (
        f'{style("ambiguity.css")}<div class="ab-demo ab-sentence-demo" id="{element_id}" '
        f'data-demo="ambiguity"><p class="ab-demo-title">{html.escape(title)}</p>{RUN_HINT}'
        f'<label for="{input_id}">Your sentence (with {html.escape(", ".join(ambiguous))})</label>'
        f'<input type="text" class="ab-sentence-input" id="{input_id}" '
        f'value="{html.escape(sentence)}" autocomplete="off" spellcheck="false" '
        f'aria-describedby="{element_id}-help">'
        f'<p class="ab-note" id="{element_id}-help">The model reads lower-case words, ignores '
        f"punctuation, knows {len(known)} words (listed below) and reads at most "
        f"{model.context_length} of them.</p>"
        f'<div class="ab-demo-output">{output}</div>'
        f'<p class="ab-live ab-sr-only" aria-live="polite"></p>'
        f'<details class="ab-word-list"><summary>The {len(known)} words the model knows (a '
        "button adds its word at the cursor)</summary>"
        f'<p class="ab-note">Ambiguous words: {chips(ambiguous)}</p>'
        f'<p class="ab-note">Other words: {chips(others)}</p></details></div>'
    )
    data = {"model": payload, "cues": cue_words, "focus": CLEAR_FOCUS}
    return HTML(markup + script(element_id, data, "ambiguity.js", "ambiguityDemo"))
