"""runjob plugin: Hugging Face models, tokenizers and datasets.

Components: the model ``hf`` (any transformers ``AutoModelFor...`` model, pretrained from the
cache or a folder, or built from a config), the datasets ``hf_text``, ``hf_classification`` and
``hf_token_classification`` (tables read memory-mapped with ``datasets``, text files; a tokenizer
loaded or trained on the training split), the converter ``hf_text`` and the dataset
``hf_text_streamed`` (hf_text's windows as shards streamed from an object store), their inputs
``hf_prompts``, ``hf_texts`` and ``hf_words`` (kept by a run as data: its tokenizer.json, special
token ids and class names), the task ``token_classification``, the callback ``bits_per_byte`` and
the export format ``hf`` (``save_pretrained``). Only pydantic and runjob are imported here: torch,
transformers, tokenizers, datasets and litdata load inside the factories and methods.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING

import runjob
from runjob_hf import streamed
from runjob_hf.export import export_hf
from runjob_hf.inputs import Prompts, Texts, Words
from runjob_hf.models import build_hf_model
from runjob_hf.options import (
    HFClassificationOptions,
    HFModelOptions,
    HFTextOptions,
    HFTokenClassificationOptions,
)
from runjob_hf.tasks import BitsPerByte, BitsPerByteOptions, TokenClassification, TokenClassificationOptions

if TYPE_CHECKING:  # annotations only: loading plugins never imports transformers
    from transformers import PreTrainedModel

__version__ = version("runjob-hf")  # stated once, in pyproject.toml: the installed metadata


def _build_model(options: HFModelOptions, data: runjob.DataFacts | None = None) -> PreTrainedModel:
    return build_hf_model(options, data)


def _build_text(options: HFTextOptions) -> runjob.DatasetSplits:
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`, which must not
    # load them
    from runjob_hf.data import build_hf_text

    return build_hf_text(options)


def _build_classification(options: HFClassificationOptions) -> runjob.DatasetSplits:
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`, which must not
    # load them
    from runjob_hf.data import build_hf_classification

    return build_hf_classification(options)


def _build_token_classification(options: HFTokenClassificationOptions) -> runjob.DatasetSplits:
    # lazy: runjob_hf.data imports torch and numpy; plugin modules are imported by `runjob validate`, which must not
    # load them
    from runjob_hf.data import build_hf_token_classification

    return build_hf_token_classification(options)


def _export_hf(request: runjob.ExportRequest) -> str:
    return export_hf(request)


@runjob.hookimpl
def runjob_register_models(register: runjob.Register) -> None:
    register(
        "hf",
        _build_model,
        options=HFModelOptions,
        description="a transformers AutoModelFor... model: pretrained from the HF cache or a folder, or from a config",
        libraries=("transformers",),
    )


@runjob.hookimpl
def runjob_register_datasets(register: runjob.Register) -> None:
    libraries = ("transformers", "tokenizers", "datasets")
    register(
        "hf_text",
        _build_text,
        options=HFTextOptions,
        description="text files or a table's text column as token windows for language modelling (HF tokenizer)",
        libraries=libraries,
    )
    register(
        "hf_classification",
        _build_classification,
        options=HFClassificationOptions,
        description="a table's text and label columns (or files by class) tokenized, for the classification task",
        libraries=libraries,
    )
    register(
        "hf_token_classification",
        _build_token_classification,
        options=HFTokenClassificationOptions,
        description="a table's words and tags columns, tags on each word's first token, for token_classification",
        libraries=libraries,
    )
    streamed.register_datasets(register)


@runjob.hookimpl
def runjob_register_converters(register: runjob.Register) -> None:
    streamed.register_converters(register)


@runjob.hookimpl
def runjob_register_inputs(register: runjob.Register) -> None:
    register("hf_prompts", Prompts, description="prompts for hf_text's language models, tokenized as its documents")
    register("hf_texts", Texts, description="texts to classify, tokenized and padded as hf_classification's rows")
    register("hf_words", Words, description="text split into words, tokenized as hf_token_classification's rows")


@runjob.hookimpl
def runjob_register_tasks(register: runjob.Register) -> None:
    register(
        "token_classification",
        lambda options, data: TokenClassification(options, data.num_classes),
        options=TokenClassificationOptions,
        description="a class per token (labels -100 not scored); val/accuracy over scored tokens, val/loss",
    )


@runjob.hookimpl
def runjob_register_callbacks(register: runjob.Register) -> None:
    register(
        "bits_per_byte",
        BitsPerByte,
        options=BitsPerByteOptions,
        description="val/bits_per_byte of a language model on hf_text: val/loss x tokens a byte / ln 2",
    )


@runjob.hookimpl
def runjob_register_exporters(register: runjob.Register) -> None:
    register(
        "hf",
        _export_hf,
        description="save_pretrained of a transformers model and its tokenizer into a folder",
        libraries=("transformers",),
    )
