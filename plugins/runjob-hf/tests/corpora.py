"""Small data the tests write, seeded: a text corpus, labelled reviews, tagged sentences."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "the quick brown fox jumps over lazy dog and cat sat on mat while birds sing songs".split()
POSITIVE = "good great fine lovely excellent happy nice".split()
NEGATIVE = "bad awful poor terrible sad ugly nasty".split()
FILLER = "the a movie film plot was is and really very".split()
NAMES = {"alice": "PER", "bob": "PER", "carol": "PER", "paris": "LOC", "rome": "LOC", "oslo": "LOC"}
OTHER = "went to with met in the and saw visited".split()


def write_corpus(folder: Path, files: int = 6, lines: int = 60) -> Path:
    """``files`` text files of ``lines`` lines of 12 words each."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        generator = random.Random(i)
        text = "\n".join(" ".join(generator.choice(WORDS) for _ in range(12)) for _ in range(lines))
        (folder / f"part{i}.txt").write_text(text + "\n", encoding="utf-8")
    return folder


def reviews(count: int = 240, seed: int = 0) -> list[dict[str, str]]:
    """Rows ``{"text", "label"}``: six filler words and one that says "pos" or "neg"."""
    generator = random.Random(seed)
    rows = []
    for _ in range(count):
        label = generator.choice(["pos", "neg"])
        words = [generator.choice(FILLER) for _ in range(6)]
        words.append(generator.choice(POSITIVE if label == "pos" else NEGATIVE))
        generator.shuffle(words)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def tagged(count: int = 240, seed: int = 0) -> list[dict[str, list[str]]]:
    """Rows ``{"tokens", "tags"}``: eight words, names tagged PER or LOC, the rest O."""
    generator = random.Random(seed)
    rows = []
    for _ in range(count):
        words = [generator.choice(OTHER + list(NAMES)) for _ in range(8)]
        rows.append({"tokens": words, "tags": [NAMES.get(w, "O") for w in words]})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


TINY_BERT = (
    "{num_hidden_layers = 1, hidden_size = 32, num_attention_heads = 2, intermediate_size = 64, "
    "hidden_dropout_prob = 0.0, attention_probs_dropout_prob = 0.0}"
)
TINY_GPT2 = "{n_layer = 2, n_embd = 32, n_head = 2}"
