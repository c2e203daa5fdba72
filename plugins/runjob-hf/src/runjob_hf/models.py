"""The model ``hf``: a transformers model as it is (no wrapper), from the Hugging Face cache or a
local folder (nothing is downloaded), or built from a config with random weights. What the data
decides (vocabulary size, number of labels and their names, pad id, context) comes from the
dataset's facts unless the job's config states it, so it is written once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from runjob_hf.options import HFModelOptions, looks_local

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch or transformers
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

    from runjob import DataFacts

_CAUSAL = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM", "AutoModel")


def auto_class(name: str) -> Any:
    """The transformers auto class called ``name``, or a ValueError listing what there is."""
    import transformers  # lazy: plugin modules are imported by `runjob validate`, which must not load transformers

    found = getattr(transformers, name, None)
    if found is None or not hasattr(found, "from_config"):
        known = sorted(n for n in dir(transformers) if n.startswith("AutoModelFor"))
        raise ValueError(
            f"task_class {name!r}: transformers {transformers.__version__} has no such class; it has {', '.join(known)}"
        )
    return found


def _fact(data: DataFacts | None, name: str) -> Any:  # a fact of any kind: a number, class names
    return getattr(data, name, None) if data is not None else None


def data_settings(
    options: HFModelOptions, data: DataFacts | None, given: set[str], config: PretrainedConfig
) -> dict[str, object]:
    """The config keys the data decides, where ``given`` (the job's config keys, by their canonical
    names) does not state them."""
    settings: dict[str, object] = {}
    canonical: dict[str, str] = getattr(config, "attribute_map", {}) or {}

    def unset(key: str) -> bool:
        return canonical.get(key, key) not in given and key not in given

    vocab = _fact(data, "vocab_size")
    if vocab is not None and unset("vocab_size") and hasattr(config, "vocab_size"):
        settings["vocab_size"] = int(vocab)
    context = _fact(data, "context")
    if context is not None and unset("max_position_embeddings") and hasattr(config, "max_position_embeddings"):
        settings["max_position_embeddings"] = int(context)
    pad = _fact(data, "pad_id")
    if pad is not None and unset("pad_token_id"):
        settings["pad_token_id"] = int(pad)
    settings.update(label_settings(options, data, given))
    return settings


def label_settings(options: HFModelOptions, data: DataFacts | None, given: set[str]) -> dict[str, object]:
    """``num_labels`` (as ``id2label``/``label2id`` when the data names its classes) for a model
    that classifies, from the data's classes, unless the config states them."""
    if options.auto_class in _CAUSAL or {"num_labels", "id2label"} & given:
        return {}
    classes, count = _fact(data, "classes"), _fact(data, "num_classes")
    if classes:
        names = [str(name) for name in classes]
        return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}
    return {"num_labels": int(count)} if count else {}


def _dtype(options: HFModelOptions) -> torch.dtype | str:
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    return "auto" if options.dtype == "auto" else cast("torch.dtype", getattr(torch, options.dtype))


def build_hf_model(options: HFModelOptions, data: DataFacts | None = None) -> PreTrainedModel:
    """The transformers model the options name, its data-decided settings from ``data`` (the
    dataset's ``runjob.DataFacts``), ``use_cache`` off (training)."""
    import transformers  # lazy: plugin modules are imported by `runjob validate`, which must not load transformers

    # "Loading weights": runjob's terminal keeps its own lines (transformers leaves this function unannotated)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    auto = auto_class(options.auto_class)
    user = dict(options.config or {})
    extra: dict[str, str] = {}
    if options.attn_implementation is not None:
        extra["attn_implementation"] = options.attn_implementation
    if options.model is None:
        model_type = options.config_from or user.pop("model_type")
        user.pop("model_type", None)
        try:
            config = transformers.AutoConfig.for_model(model_type, **user)
        except ValueError as error:
            raise ValueError(f"config_from = {model_type!r}: {str(error).splitlines()[0]}") from None
        given = {getattr(config, "attribute_map", {}).get(k, k) for k in user} | set(user)
        for key, value in data_settings(options, data, given, config).items():
            setattr(config, key, value)
        vocab = getattr(config, "vocab_size", None)
        for key in ("bos_token_id", "eos_token_id"):  # GPT-2's 50256 past a small tokenizer's ids
            value = getattr(config, key, None)
            if key not in given and isinstance(value, int) and vocab is not None and value >= vocab:
                setattr(config, key, None)
        config.use_cache = False
        model = auto.from_config(config, trust_remote_code=options.trust_remote_code, dtype=_dtype(options), **extra)
    else:
        labels = label_settings(options, data, set(user))
        pad = _fact(data, "pad_id")
        try:
            model = auto.from_pretrained(
                options.model,
                revision=options.revision,
                trust_remote_code=options.trust_remote_code,
                local_files_only=True,
                # transformers 5 looks for a PEFT adapter_config.json first and does not pass
                # local_files_only on to that look-up: offline, 5 retries (~25 s) against the Hub
                adapter_kwargs={"local_files_only": True},
                dtype=_dtype(options),
                **labels,
                **user,
                **extra,
            )
        except OSError as error:
            if looks_local(options.model):
                raise ValueError(f"model folder {options.model}: {str(error).splitlines()[0]}") from None
            # lazy: plugin modules are imported by `runjob validate`, which must not load huggingface_hub
            from huggingface_hub import constants

            revision = f" (revision {options.revision})" if options.revision else ""
            raise ValueError(
                f"model {options.model!r}{revision} is not in the Hugging Face cache {constants.HF_HUB_CACHE}: nothing "
                f"is downloaded (local_files_only); fetch it on a machine online (`hf download {options.model}`) "
                "and copy the cache, or name a local folder"
            ) from None
        vocab = _fact(data, "vocab_size")
        embeddings = model.get_input_embeddings()
        if vocab is not None and embeddings is not None and embeddings.num_embeddings < int(vocab):
            model.resize_token_embeddings(int(vocab))  # the tokenizer has more ids than the model
        if pad is not None and getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = int(pad)
        model.config.use_cache = False
    return cast("PreTrainedModel", model)  # the auto class's (transformers types them loosely)
