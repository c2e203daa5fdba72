"""runjob plugin: the model ``timm``, any of timm's image models by its architecture name.

    [model]
    name = "timm"
    arch = "vit_tiny_patch16_224"   # checked by `runjob validate` against timm's names, without timm
    kwargs = { patch_size = 4 }     # anything else timm.create_model takes

``num_classes``, ``in_chans`` and ``img_size`` come from the dataset's facts unless the job sets
them. Importing this module imports neither torch nor timm: the factory does.
"""

from __future__ import annotations

import difflib
import warnings
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

import runjob
from runjob_timm.pretrained import find_weights

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch or timm
    import torch

# Keys of model.kwargs that have an option of their own, or that would bypass the offline cache.
OWN_OPTIONS = ("num_classes", "in_chans", "img_size", "pretrained", "drop_rate")
REFUSED_KWARGS = {
    "pretrained_cfg": "the architecture's tag (arch = 'name.tag') chooses timm's pretrained config",
    "pretrained_cfg_overlay": "runjob-timm sets it to the cached weights file",
    "cache_dir": "runjob-timm reads weights from the Hugging Face cache: set $HF_HUB_CACHE or $HF_HOME",
    "checkpoint_path": "start from a file with [model] init_from",
}


def _choices(names: list[str]) -> str:
    return f"did you mean {' or '.join(repr(n) for n in names)}? " if names else ""


def check_arch(value: str) -> str:
    """``model.arch``: a timm architecture, optionally with a pretrained tag (``name.tag``), checked
    against the shipped list (``architectures.txt``); no torch, no timm. A name the list lacks is
    accepted, with a warning, when the installed timm is another version than the list's: that timm
    decides when the model is built."""
    if ":" in value:
        raise ValueError(
            f"{value!r}: give a timm architecture name (arch or arch.tag), not a hub or folder reference; "
            "its weights come from the local cache with pretrained = true"
        )
    from runjob_timm import names  # lazy: here, so that `python -m runjob_timm.names` runs it fresh

    arch, dot, tag = value.partition(".")
    listed = names.known()
    installed = names.installed_timm()
    other_timm = installed is not None and installed != listed.version
    if arch in listed.deprecated:
        return value  # timm builds it under its new name, with its own deprecation warning
    if arch not in listed.tags:
        hint = _choices(listed.close(arch))
        if other_timm:
            nearest = hint.strip() or "no close name listed"
            warnings.warn(
                f"model.arch: {arch!r} is not among the architectures of timm {listed.version} runjob-timm lists; "
                f"the installed timm {installed} decides when the model is built ({nearest})",
                runjob.PluginWarning,
                stacklevel=2,
            )
            return value
        raise ValueError(
            f"{arch!r} is not a timm {listed.version} architecture; {hint}"
            f"the {len(listed.tags)} names are in runjob_timm/architectures.txt"
        )
    tags = listed.tags[arch]
    if dot and tag not in tags:
        hint = _choices(difflib.get_close_matches(tag, tags, n=2, cutoff=0.5))
        said = f"its tags: {', '.join(tags)}" if tags else "it has no pretrained weights"
        if other_timm:
            warnings.warn(
                f"model.arch: timm {listed.version} has no pretrained tag {tag!r} for {arch} ({said}); the installed "
                f"timm {installed} decides when the model is built",
                runjob.PluginWarning,
                stacklevel=2,
            )
            return value
        raise ValueError(f"timm {listed.version} has no pretrained tag {tag!r} for {arch}; {hint}{said}")
    return value


class TimmOptions(runjob.Options):
    """Options of the ``timm`` model: every key of ``[model]`` except ``name``."""

    arch: str = Field(..., min_length=1)
    """A timm architecture (``timm.list_models()``), optionally with a pretrained tag: ``name.tag``."""
    num_classes: int | None = Field(None, ge=1)
    """Outputs of the head; None: the dataset's number of classes."""
    in_chans: int | None = Field(None, ge=1)
    """Input channels; None: the dataset's image channels (timm's 3 when the dataset has none)."""
    img_size: int | None = Field(None, ge=1)
    """Input side, for architectures that take one (ViTs, Swin...); None: the dataset's image size,
    given only to architectures that take ``img_size``."""
    pretrained: bool = False
    """timm's pretrained weights, from the local Hugging Face cache only (never downloaded)."""
    drop_rate: float = Field(0.0, ge=0, lt=1)
    """Dropout before the classifier (timm's ``drop_rate``; given to timm only when not 0)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Anything else ``timm.create_model`` takes (``patch_size``, ``depth``, ``drop_path_rate``...)."""

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, value: str) -> str:
        return check_arch(value)

    @field_validator("kwargs")
    @classmethod
    def _own_keys(cls, value: dict[str, object]) -> dict[str, object]:
        for key in value:
            if key in OWN_OPTIONS:
                raise ValueError(f"{key!r} is an option of its own: set model.{key}, not model.kwargs.{key}")
            if key in REFUSED_KWARGS:
                raise ValueError(f"{key!r} is not taken here: {REFUSED_KWARGS[key]}")
        return value


def _timm_name_error(arch: str) -> ValueError | None:
    """A ValueError saying what is wrong with ``arch`` (``name`` or ``name.tag``) for the installed
    timm, or None when timm builds it."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load timm
    import timm
    from timm.models import get_deprecated_models

    name, dot, tag = arch.partition(".")
    if name in get_deprecated_models():
        return None
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        return ValueError(f"model.arch: {name!r} is not an architecture of timm {timm.__version__}; {_choices(close)}")
    if dot:
        tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{name}.*")]
        if tag not in tags:
            said = f"its tags: {', '.join(tags)}" if tags else "it has no pretrained weights"
            return ValueError(f"model.arch: timm {timm.__version__} has no pretrained tag {tag!r} for {name}; {said}")
    return None


def _create(arch: str, img_size: int | None, img_size_given: bool, **kwargs: Any) -> torch.nn.Module:
    """``timm.create_model``, with ``img_size`` when there is one; an ``img_size`` from the data is
    left out for architectures that take none (convolutional networks)."""
    import timm  # lazy: plugin modules are imported by `runjob validate`, which must not load timm

    if img_size is None:
        return timm.create_model(arch, **kwargs)
    try:
        return timm.create_model(arch, img_size=img_size, **kwargs)
    except TypeError as error:  # raised when the model class is called, before it builds anything
        if "img_size" not in str(error):
            raise
        if img_size_given:
            raise ValueError(f"model.img_size: timm {arch} takes no img_size ({error}); leave it out") from None
        return timm.create_model(arch, **kwargs)


def build_timm(options: TimmOptions, data: runjob.DataFacts | None = None) -> torch.nn.Module:
    """The timm model the options name, sized by the dataset's facts (``runjob.DataFacts``; None
    or empty when the run has none: then the options must say it)."""
    num_classes = options.num_classes if options.num_classes is not None else getattr(data, "num_classes", None)
    if num_classes is None:
        raise ValueError(
            "model.num_classes: the dataset states no number of classes; set model.num_classes (the head's outputs)"
        )
    in_chans = options.in_chans if options.in_chans is not None else getattr(data, "channels", None)
    img_size = options.img_size if options.img_size is not None else getattr(data, "image_size", None)
    problem = _timm_name_error(options.arch)
    if problem is not None:
        raise problem
    kwargs: dict[str, object] = {"num_classes": num_classes, **options.kwargs}
    if in_chans is not None:
        kwargs["in_chans"] = in_chans
    if options.drop_rate:
        kwargs["drop_rate"] = options.drop_rate
    weights = None
    if options.pretrained:
        weights = find_weights(options.arch)
        kwargs.update(pretrained=True, pretrained_cfg_overlay={"file": str(weights.path)})
    model = _create(options.arch, img_size, options.img_size is not None, **kwargs)
    if weights is not None:  # one line for the job, not one per process
        runjob.say(f"runjob: model.pretrained: timm {options.arch} from {weights.path} ({weights.checked})")
    return model


@runjob.hookimpl
def runjob_register_models(register: runjob.Register) -> None:
    """Register the model ``timm``."""
    register(
        "timm",
        build_timm,
        options=TimmOptions,
        description="any timm image model by name (model.arch); pretrained weights from the local Hugging Face cache",
        libraries=("timm",),
    )
