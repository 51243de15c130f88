"""The ambiguity data set of chapter 9: which sense of *minute* (bank, bat, crane) is meant?

Every sentence holds one ambiguous word and two *cue* words: the **deciding word**, a
cue for the true sense that stands in the same clause, one to four words away, before
or after the ambiguous word; and a **distractor**, a cue for a sense picked by a coin
flip, that stands in the other clause, at least two words further away. Both clauses
are drawn from the same frames for every word and sense, so the frame words say
nothing about the answer.

A model that averages all the words (chapter 1's baseline) sees a bag of two cues:
when they agree (half the sentences) the bag gives the answer away, when they
disagree it can only guess, so it tops out near 75 %. A model that attends to the
right word, the nearer cue, can be right every time.

The committed copy lives in ``data/ambiguity.csv``; :func:`generate_ambiguity_dataset`
recreates it exactly from its seed and :func:`load_ambiguity_dataset` reads it.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "AMBIGUOUS_WORDS",
    "DATA_SEED",
    "AmbiguityExample",
    "Vocabulary",
    "generate_ambiguity_dataset",
    "write_ambiguity_csv",
    "load_ambiguity_dataset",
    "default_data_path",
    "encode_examples",
    "encode_splits",
]

#: The seed of the committed ``data/ambiguity.csv``.
DATA_SEED = 2024

#: For each ambiguous word, its two senses and the cue words (nouns) of each sense.
AMBIGUOUS_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "minute": {
        "time": ("clock", "timer", "watch", "hour", "delay", "calendar"),
        "size": ("dust", "speck", "grain", "crumb", "atom", "detail"),
    },
    "bank": {
        "river": ("river", "shore", "stream", "reeds", "mud", "fish"),
        "money": ("money", "loan", "cash", "teller", "account", "deposit"),
    },
    "bat": {
        "animal": ("cave", "wings", "fur", "insect", "roost", "night"),
        "sport": ("ball", "pitch", "cricket", "glove", "swing", "umpire"),
    },
    "crane": {
        "bird": ("nest", "feather", "marsh", "egg", "pond", "beak"),
        "machine": ("steel", "tower", "cargo", "hook", "truck", "concrete"),
    },
}

# Clause frames shared by every word and sense. In a target frame, {w} is the
# ambiguous word and {c} the deciding word; the frames put the deciding word
# 1 to 4 words before, or 1 to 3 words after, the ambiguous word.
_TARGET_FRAMES = (
    "the {c} {w}",  # -1
    "that {c} {w} was odd",  # -1
    "the {c} and {w}",  # -2
    "the {c} near the {w}",  # -3
    "the {c} next to the {w}",  # -4
    "the {w} {c}",  # +1
    "a {w} with {c}",  # +2
    "the {w} by the {c}",  # +3
    "one {w} and one {c}",  # +2
    "the {w} of the {c}",  # +3
)
# In a distractor frame, {c} is a cue for either sense (a coin flip).
_DISTRACTOR_FRAMES = (
    "we saw the {c}",
    "there was one {c}",
    "the {c} was there",
    "nobody spoke of the {c}",
    "they talked about the {c}",
)
# The distractor stands at least this many words further from the ambiguous word
# than the deciding word does.
_MIN_GAP = 2
# Give up after this many draws in a row that add no new sentence.
_MAX_MISSES = 10_000
_CONNECTORS = ("while", "but", "and then", "because", "although")
_SPLITS = (("train", 0.7), ("validation", 0.15), ("test", 0.15))
_COLUMNS = (
    "split", "sentence", "word", "sense", "label", "word_index",
    "cue", "cue_index", "distractor", "distractor_index",
)


@dataclass(frozen=True)
class AmbiguityExample:
    """One sentence of the data set.

    Attributes:
        split: ``"train"``, ``"validation"`` or ``"test"``.
        sentence: the sentence, tokens separated by single spaces.
        word: the ambiguous word (e.g. ``"minute"``).
        sense: its sense in this sentence (e.g. ``"time"``).
        label: ``"word/sense"`` (e.g. ``"minute/time"``), the class to predict.
        word_index: position of the ambiguous word in ``sentence.split()``.
        cue: the context word that decides the sense.
        cue_index: position of the cue in ``sentence.split()``.
        distractor: a cue word of a random sense, placed further away.
        distractor_index: position of the distractor in ``sentence.split()``.

    Taught in chapter 9.
    """

    split: str
    sentence: str
    word: str
    sense: str
    label: str
    word_index: int
    cue: str
    cue_index: int
    distractor: str
    distractor_index: int

    @property
    def tokens(self) -> list[str]:
        """The sentence split on spaces: the data set's tokenisation."""
        return self.sentence.split()


def _make_sentence(rng: random.Random, word: str, sense: str, other: str) -> AmbiguityExample:
    senses = AMBIGUOUS_WORDS[word]
    cue = rng.choice(senses[sense])
    # The distractor's sense is a coin flip, so it says nothing about the answer.
    distractor_sense = rng.choice((sense, other))
    distractor = rng.choice([c for c in senses[distractor_sense] if c != cue])
    target = rng.choice(_TARGET_FRAMES).format(w=word, c=cue).split()
    side = rng.choice(_DISTRACTOR_FRAMES).format(c=distractor).split()
    connector = rng.choice(_CONNECTORS).split()
    tokens = target + connector + side if rng.random() < 0.5 else side + connector + target
    # Cue words never repeat within a sentence, so .index finds the one we placed.
    word_index = tokens.index(word)
    cue_index = tokens.index(cue)
    distractor_index = tokens.index(distractor)
    return AmbiguityExample(
        split="", sentence=" ".join(tokens), word=word, sense=sense, label=f"{word}/{sense}",
        word_index=word_index, cue=cue, cue_index=cue_index,
        distractor=distractor, distractor_index=distractor_index,
    )


def generate_ambiguity_dataset(
    per_sense: int = 300, seed: int = DATA_SEED
) -> list[AmbiguityExample]:
    """Generate the ambiguity data set, with train/validation/test splits.

    For each word and sense, draws ``per_sense`` distinct sentences; within each
    label the sentences are shuffled and split 70/15/15, so every split holds
    every label in the same proportion.

    Args:
        per_sense: number of distinct sentences per (word, sense) label.
        seed: seed of the random generator; the same seed gives the same data.

    Shapes:
        returns ``8 * per_sense`` examples (4 words x 2 senses).

    Returns:
        A list of :class:`AmbiguityExample`, ordered by split, then label.

    Taught in chapter 9.
    """
    if isinstance(per_sense, bool) or not isinstance(per_sense, int):
        raise TypeError(f"per_sense must be an int, got {type(per_sense).__name__}")
    if per_sense < 3:
        raise ValueError(f"per_sense must be >= 3 (one sentence per split at least), got {per_sense}")
    rng = random.Random(seed)
    by_split: dict[str, list[AmbiguityExample]] = {name: [] for name, _ in _SPLITS}
    for word, senses in AMBIGUOUS_WORDS.items():
        first, second = senses
        for sense, other in ((first, second), (second, first)):
            seen: dict[str, AmbiguityExample] = {}
            misses = 0  # draws in a row that gave no new sentence
            while len(seen) < per_sense:
                if misses > _MAX_MISSES:
                    raise ValueError(
                        f"could not draw {per_sense} distinct sentences for {word}/{sense} "
                        f"(found {len(seen)}); ask for fewer"
                    )
                example = _make_sentence(rng, word, sense, other)
                cue_distance = abs(example.cue_index - example.word_index)
                if (abs(example.distractor_index - example.word_index) < cue_distance + _MIN_GAP
                        or example.sentence in seen):
                    # keep "the nearest cue decides" true in every sentence; no duplicates
                    misses += 1
                    continue
                misses = 0
                seen[example.sentence] = example
            examples = list(seen.values())
            rng.shuffle(examples)
            start = 0
            for index, (name, fraction) in enumerate(_SPLITS):
                stop = len(examples) if index == len(_SPLITS) - 1 else start + round(
                    fraction * len(examples))
                for example in examples[start:stop]:
                    by_split[name].append(_with_split(example, name))
                start = stop
    return [example for name, _ in _SPLITS for example in by_split[name]]


def _with_split(example: AmbiguityExample, split: str) -> AmbiguityExample:
    fields = {name: getattr(example, name) for name in _COLUMNS}
    fields["split"] = split
    return AmbiguityExample(**fields)


def default_data_path() -> Path:
    """Where the committed data set lives: ``data/ambiguity.csv`` in the repository.

    Returns:
        The path of the CSV file (it may be absent when the package is installed
        without the repository; :func:`load_ambiguity_dataset` then regenerates it).

    Taught in chapter 9.
    """
    return Path(__file__).resolve().parents[2] / "data" / "ambiguity.csv"


def write_ambiguity_csv(examples: Sequence[AmbiguityExample], path: str | Path) -> Path:
    """Write examples to a CSV file with one column per field.

    Args:
        examples: the sentences, e.g. from :func:`generate_ambiguity_dataset`.
        path: the file to write (overwritten).

    Returns:
        The path written.

    Taught in chapter 9.
    """
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(_COLUMNS)
        for example in examples:
            writer.writerow([getattr(example, name) for name in _COLUMNS])
    return path


def load_ambiguity_dataset(path: str | Path | None = None) -> list[AmbiguityExample]:
    """Read the ambiguity data set from a CSV file (default: the committed copy).

    Args:
        path: the CSV file; ``None`` reads ``data/ambiguity.csv``. When the package
            is installed without the repository (e.g. on Colab) that file is absent,
            and the same data are regenerated from :data:`DATA_SEED` instead (a unit
            test checks that the two are identical).

    Returns:
        A list of :class:`AmbiguityExample`, in file order.

    Taught in chapter 9.
    """
    if path is None and not default_data_path().is_file():
        return generate_ambiguity_dataset(seed=DATA_SEED)
    path = default_data_path() if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no data set at {path}; recreate it with "
            "write_ambiguity_csv(generate_ambiguity_dataset(), path)"
        )
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != _COLUMNS:
            raise ValueError(
                f"{path.name} has columns {reader.fieldnames}, expected {list(_COLUMNS)}"
            )
        examples = []
        for row in reader:
            for name in ("word_index", "cue_index", "distractor_index"):
                row[name] = int(row[name])
            examples.append(AmbiguityExample(**row))
    return examples


class Vocabulary:
    """A word <-> id table; id 0 is the padding token ``<pad>``.

    Args:
        words: the words to number, in order (duplicates are ignored).

    Taught in chapter 9.
    """

    pad = "<pad>"

    def __init__(self, words: Sequence[str]):
        self.itos = [self.pad]
        for word in words:
            if word not in self.itos:
                self.itos.append(word)
        self.stoi = {word: index for index, word in enumerate(self.itos)}

    @classmethod
    def from_examples(cls, examples: Sequence[AmbiguityExample]) -> Vocabulary:
        """Build a vocabulary of every token in ``examples``, sorted alphabetically."""
        return cls(sorted({token for example in examples for token in example.tokens}))

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Map tokens to ids; an unknown token raises ``KeyError`` naming it."""
        unknown = [token for token in tokens if token not in self.stoi]
        if unknown:
            raise KeyError(f"tokens not in the vocabulary: {unknown}")
        return [self.stoi[token] for token in tokens]


def encode_examples(
    examples: Sequence[AmbiguityExample], vocab: Vocabulary, labels: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Turn examples into padded tensors for the classifier.

    Args:
        examples: the sentences.
        vocab: maps tokens to ids (``0`` pads).
        labels: the class names; a label's index is its class id.

    Shapes:
        returns ``token_ids (N, T_max)``, ``lengths (N,)``, ``word_index (N,)``,
        ``cue_index (N,)``, ``distractor_index (N,)``, ``targets (N,)``.

    Returns:
        A dict of those tensors (all ``torch.long``).

    Taught in chapter 9.
    """
    if not examples:
        raise ValueError("examples is empty")
    label_ids = {label: index for index, label in enumerate(labels)}
    missing = sorted({e.label for e in examples} - set(label_ids))
    if missing:
        raise ValueError(f"labels {missing} are not in labels={list(labels)}")
    max_len = max(len(example.tokens) for example in examples)
    token_ids = torch.zeros(len(examples), max_len, dtype=torch.long)  # (N, T_max)
    for row, example in enumerate(examples):
        ids = vocab.encode(example.tokens)
        token_ids[row, : len(ids)] = torch.tensor(ids)
    return {
        "token_ids": token_ids,
        "lengths": torch.tensor([len(e.tokens) for e in examples]),
        "word_index": torch.tensor([e.word_index for e in examples]),
        "cue_index": torch.tensor([e.cue_index for e in examples]),
        "distractor_index": torch.tensor([e.distractor_index for e in examples]),
        "targets": torch.tensor([label_ids[e.label] for e in examples]),
    }


def encode_splits(
    examples: Sequence[AmbiguityExample],
) -> tuple[Vocabulary, list[str], dict[str, dict[str, torch.Tensor]]]:
    """Build the vocabulary and label list of ``examples`` and encode each split.

    Args:
        examples: the whole data set (every split).

    Returns:
        ``(vocab, labels, tensors)`` where ``labels`` is the sorted list of
        ``"word/sense"`` labels and ``tensors[split]`` is :func:`encode_examples`'s
        dict for ``"train"``, ``"validation"`` and ``"test"``.

    Taught in chapter 9.
    """
    vocab = Vocabulary.from_examples(examples)
    labels = sorted({example.label for example in examples})
    tensors = {}
    for name, _ in _SPLITS:
        part = [example for example in examples if example.split == name]
        if not part:
            raise ValueError(f"the {name!r} split is empty")
        tensors[name] = encode_examples(part, vocab, labels)
    return vocab, labels, tensors


if __name__ == "__main__":  # python -m attention_book.data [PATH] recreates the CSV
    import sys

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else default_data_path()
    rows = generate_ambiguity_dataset()
    write_ambiguity_csv(rows, target)
    print(f"wrote {len(rows)} sentences to {target}")
