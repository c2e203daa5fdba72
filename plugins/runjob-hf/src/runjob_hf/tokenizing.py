"""Tokenizers: loaded from the Hugging Face cache, a local folder or a ``tokenizer.json`` (nothing is
downloaded), or trained with ``tokenizers`` on the training split's text. Either way the dataset
works with a :class:`Vocabulary`: the ``tokenizers.Tokenizer`` (its JSON) and its special token ids,
plain values that a run keeps as data (its predictor's ``inputs/tokenizer.json`` and the ids as
JSON: :meth:`runjob_hf.inputs._TextInputs.to_data`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runjob_hf.options import HFDataOptions, TrainTokenizer, looks_local

if TYPE_CHECKING:  # annotations only: loading plugins never imports tokenizers or transformers
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

# Special tokens a trained tokenizer gets, by use
END_OF_TEXT, PAD = "<|endoftext|>", "<pad>"
CLS, SEP, UNK, MASK, BERT_PAD = "[CLS]", "[SEP]", "[UNK]", "[MASK]", "[PAD]"

_NAMES = {
    "pad": ("[PAD]", "<pad>", "<|pad|>", "<|padding|>"),
    "eos": ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]"),
    "bos": ("<s>", "<|begin_of_text|>", "<bos>", "[CLS]"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
}


class LazyTokenizer:
    """A ``tokenizers.Tokenizer`` built from its JSON where it is first used (a DataLoader worker,
    datasets' map, a loaded MLflow model): no padding, and cut at ``max_length`` when given. Copied
    as the JSON alone (``__getstate__``) where DataLoader workers and datasets' map (its fingerprint,
    its worker processes) pickle the encoders holding it; a run never keeps it as a pickle."""

    def __init__(self, json: str, max_length: int | None = None) -> None:
        self.json, self.max_length = json, max_length
        self._tokenizer: Tokenizer | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_tokenizer": None}

    def get(self) -> Tokenizer:
        if self._tokenizer is None:
            # lazy: plugin modules are imported by `runjob validate`, which must not load tokenizers
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self.json)
            tokenizer.no_padding()
            if self.max_length is None:
                tokenizer.no_truncation()
            else:
                tokenizer.enable_truncation(self.max_length)
            self._tokenizer = tokenizer
        return self._tokenizer


@dataclass
class Vocabulary:
    """A tokenizer as plain values: its ``tokenizer.json`` text and special token ids."""

    json: str
    pad_id: int | None = None
    eos_id: int | None = None
    bos_id: int | None = None
    special: dict[str, str] = field(default_factory=dict)
    """The special tokens by role (``pad_token``, ``eos_token``, ...), for ``save_pretrained``."""
    _tokenizer: Tokenizer | None = field(default=None, repr=False, compare=False)

    @property
    def tokenizer(self) -> Tokenizer:
        """The ``tokenizers.Tokenizer`` (built once; left out of a copy made for a DataLoader worker)."""
        if self._tokenizer is None:
            # lazy: plugin modules are imported by `runjob validate`, which must not load tokenizers
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_str(self.json)
        return self._tokenizer

    @property
    def size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.json.encode()).hexdigest()[:16]

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_tokenizer": None}

    def save(self, folder: Path) -> Path:
        """``folder/tokenizer-<digest>.json`` (written once)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"tokenizer-{self.digest}.json"
        if not path.exists():
            partial = path.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(self.json, encoding="utf-8")
            partial.replace(path)
        return path

    def pretrained(self) -> PreTrainedTokenizerFast:
        """A transformers ``PreTrainedTokenizerFast`` of this tokenizer (for ``save_pretrained``)."""
        # lazy: plugin modules are imported by `runjob validate`, which must not load transformers
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=self.tokenizer, **self.special)  # type: ignore[no-untyped-call]


def _find(tokenizer: Tokenizer, role: str) -> str | None:
    for name in _NAMES[role]:
        if tokenizer.token_to_id(name) is not None:
            return name
    return None


def _from_backend(backend: Tokenizer, special: dict[str, str]) -> Vocabulary:
    """A Vocabulary of a ``tokenizers.Tokenizer``, its special tokens as given or found by name."""
    for role in ("pad", "eos", "bos", "cls", "sep"):
        key = f"{role}_token"
        if key not in special:
            found = _find(backend, role)
            if found is not None:
                special[key] = found
    ids = {
        role: backend.token_to_id(special[f"{role}_token"])
        for role in ("pad", "eos", "bos")
        if f"{role}_token" in special
    }
    pad = ids.get("pad", ids.get("eos"))  # a tokenizer without padding pads with its end-of-text: masked anyway
    return Vocabulary(backend.to_str(), pad, ids.get("eos"), ids.get("bos"), special)


def load_tokenizer(name: str, revision: str | None) -> Vocabulary:
    """A tokenizer from a ``tokenizer.json`` file, a local folder or the Hugging Face cache."""
    if name.endswith(".json") and os.path.isfile(name):
        # lazy: plugin modules are imported by `runjob validate`, which must not load tokenizers
        from tokenizers import Tokenizer

        return _from_backend(Tokenizer.from_file(name), {})
    # lazy: plugin modules are imported by `runjob validate`, which must not load transformers
    from transformers import AutoTokenizer

    try:
        loaded = AutoTokenizer.from_pretrained(name, revision=revision, local_files_only=True)
    except (OSError, ValueError) as error:
        if looks_local(name):
            raise ValueError(f"tokenizer {name}: cannot be read ({str(error).splitlines()[0]})") from None
        raise ValueError(f"tokenizer {name!r} is not in the Hugging Face cache ({_hub_cache()}); {_OFFLINE}") from None
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"tokenizer {name}: needs a fast tokenizer (tokenizer.json), {type(loaded).__name__} is not one"
        )
    special = {
        key: str(value)
        for key, value in loaded.special_tokens_map.items()
        if isinstance(value, str) and key.endswith("_token")
    }
    return _from_backend(backend, special)


_OFFLINE = (
    "nothing is downloaded (local_files_only): put it there on a machine online "
    "(`hf download NAME`), or name a local folder"
)


def _hub_cache() -> str:
    # lazy: plugin modules are imported by `runjob validate`, which must not load huggingface_hub
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def train_tokenizer(
    settings: TrainTokenizer, texts: Iterable[str], purpose: str, cache: Path, fingerprint: str
) -> Vocabulary:
    """A tokenizer trained on ``texts`` (the training split's), cached in ``cache`` under a digest of
    ``fingerprint`` (the training text's) and the settings. ``purpose``: "lm" (an end-of-text token
    between documents and a padding token) or "encoder" (BERT's [CLS] text [SEP], [PAD], [UNK], [MASK])."""
    key = hashlib.sha256(f"{settings.model_dump_json()}|{purpose}|{fingerprint}".encode()).hexdigest()[:16]
    path = cache / "tokenizers" / f"trained-{key}.json"
    if path.exists():
        return _trained(path.read_text(encoding="utf-8"), purpose)
    # lazy: plugin modules are imported by `runjob validate`, which must not load tokenizers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = [END_OF_TEXT, PAD] if purpose == "lm" else [BERT_PAD, UNK, CLS, SEP, MASK]
    if settings.kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=purpose != "lm")
        tokenizer.decoder = decoders.ByteLevel()
        trainer: trainers.Trainer = trainers.BpeTrainer(
            vocab_size=settings.vocab_size,
            min_frequency=settings.min_frequency,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        unknown = UNK if purpose != "lm" else "[UNK]"
        if unknown not in specials:
            specials.append(unknown)
        tokenizer = Tokenizer(models.WordPiece(unk_token=unknown))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=settings.vocab_size,
            min_frequency=settings.min_frequency,
            special_tokens=specials,
            show_progress=False,
        )
    tokenizer.train_from_iterator(_limited(texts, settings.max_bytes), trainer=trainer)
    if purpose != "lm":
        cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, cls_id), (SEP, sep_id)],
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(tokenizer.to_str(), encoding="utf-8")
    partial.replace(path)
    return _trained(tokenizer.to_str(), purpose)


def _trained(text: str, purpose: str) -> Vocabulary:
    # lazy: plugin modules are imported by `runjob validate`, which must not load tokenizers
    from tokenizers import Tokenizer

    if purpose == "lm":
        special = {"eos_token": END_OF_TEXT, "bos_token": END_OF_TEXT, "pad_token": PAD}
        if "[UNK]" in json.loads(text).get("model", {}).get("vocab", {}):
            special["unk_token"] = "[UNK]"
    else:
        special = {"pad_token": BERT_PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP, "mask_token": MASK}
    return _from_backend(Tokenizer.from_str(text), special)


def _limited(texts: Iterable[str], max_bytes: int | None) -> Iterator[str]:
    total = 0
    for text in texts:
        if max_bytes is not None and total >= max_bytes:
            return
        if max_bytes is not None:
            text = text[: max_bytes - total]
        total += len(text.encode("utf-8", errors="replace"))
        yield text


def vocabulary(
    options: HFDataOptions, texts: Callable[[], Iterable[str]], purpose: str, cache: Path, fingerprint: str
) -> Vocabulary:
    """The dataset's tokenizer: ``options.tokenizer`` loaded, or one trained on ``texts()`` (a
    callable giving the training split's texts, called only when training)."""
    if options.tokenizer is not None:
        return load_tokenizer(options.tokenizer, options.revision)
    assert options.train_tokenizer is not None
    return train_tokenizer(options.train_tokenizer, _Lazy(texts), purpose, cache, fingerprint)


class _Lazy:
    def __init__(self, texts: Callable[[], Iterable[str]]) -> None:
        self.texts = texts

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts())
