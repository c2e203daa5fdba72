"""``runjob export RUN --format hf``: the trained transformers model and its tokenizer as a folder
``from_pretrained`` reads (``AutoModelFor....from_pretrained(folder)``, ``AutoTokenizer.from_pretrained(folder)``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from runjob_hf.tokenizing import Vocabulary, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from runjob import ExportRequest


def _vocabulary(request: ExportRequest) -> Vocabulary | None:
    """The run's tokenizer: its Inputs' (runjob-hf's datasets), else its ``tokenizer.json`` artifact."""
    held = getattr(request.inputs, "vocabulary", None)
    if isinstance(held, Vocabulary):
        return held
    path = (request.artifacts or {}).get("tokenizer.json")
    if path is None:
        return None

    return load_tokenizer(str(path), None)


def export_hf(request: ExportRequest) -> str:
    """Write ``request.output`` (a folder): ``save_pretrained`` of the model (safetensors, its
    config with the data's label names and special token ids) and of its tokenizer."""
    model = cast("PreTrainedModel", request.model)  # checked below: a transformers model
    if not hasattr(model, "save_pretrained") or not hasattr(model, "config"):
        raise ValueError(
            f"the model is a {type(model).__name__}, not a transformers PreTrainedModel: --format hf is for [model] "
            'name = "hf" (use --format onnx or pt2 for others)'
        )
    vocabulary = _vocabulary(request)
    classes = getattr(request.inputs, "classes", None)
    config = model.config
    if classes and getattr(config, "num_labels", None) == len(classes):
        config.id2label = dict(enumerate(str(name) for name in classes))
        config.label2id = {str(name): i for i, name in enumerate(classes)}
    if vocabulary is not None:
        for key, value in (
            ("pad_token_id", vocabulary.pad_id),
            ("eos_token_id", vocabulary.eos_id),
            ("bos_token_id", vocabulary.bos_id),
        ):
            if value is not None:
                setattr(config, key, value)
    config.use_cache = True  # for generation by whoever loads it
    # lazy: plugin modules are imported by `runjob validate`, which must not load transformers
    from transformers.utils import logging

    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    output = Path(request.output)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    parameters = sum(p.numel() for p in model.parameters())
    said = f"save_pretrained: {type(model).__name__} ({parameters:,} parameters)"
    if vocabulary is not None:
        vocabulary.pretrained().save_pretrained(output)
        return f"{said} and its tokenizer ({vocabulary.size:,} token ids)"
    return f"{said}, no tokenizer (the run's dataset kept none)"
