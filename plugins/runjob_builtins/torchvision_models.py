"""Built-in models: torchvision's image classification models, by their torchvision names,
randomly initialised or from torchvision's pretrained weights (``weights = "DEFAULT"``)."""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import importlib.util
import os
import re
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, cast
from urllib.parse import urlparse

from pydantic import Field, field_validator

from runjob import DataFacts, Options, RunjobError, hookimpl, say
from runjob.errors import describe

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch or torchvision
    import torch
    from torchvision.models import WeightsEnum

    from runjob import Register

# torchvision.models.list_models() needs torch imported; the names are listed here so that
# loading plugins stays fast. tests/test_builtin_plugins.py checks them against torchvision.
RESNETS = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnext50_32x4d",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "wide_resnet50_2",
    "wide_resnet101_2",
)
OTHERS = (
    "alexnet",
    "convnext_tiny",
    "convnext_small",
    "convnext_base",
    "convnext_large",
    "densenet121",
    "densenet161",
    "densenet169",
    "densenet201",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_s",
    "efficientnet_v2_m",
    "efficientnet_v2_l",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "regnet_x_400mf",
    "regnet_x_800mf",
    "regnet_x_1_6gf",
    "regnet_x_3_2gf",
    "regnet_x_8gf",
    "regnet_y_400mf",
    "regnet_y_800mf",
    "regnet_y_1_6gf",
    "regnet_y_3_2gf",
    "regnet_y_8gf",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "swin_t",
    "swin_s",
    "swin_b",
    "swin_v2_t",
    "swin_v2_s",
    "swin_v2_b",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "vit_b_16",
    "vit_b_32",
    "vit_l_16",
    "vit_l_32",
    "vit_h_14",
)
# Models whose training-mode forward returns auxiliary outputs unless told not to.
_SINGLE_OUTPUT = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


class ClassifierOptions(Options):
    """Options every torchvision classifier takes."""

    model_name: ClassVar[str | None] = None
    """The torchvision builder these options are for (set on each registered model's own subclass)."""

    num_classes: int | None = Field(None, ge=2)
    """Classes of the head; by default the dataset's (1000 when it has none to say)."""
    weights: str | None = Field(None, min_length=1)
    """torchvision's pretrained weights: ``"DEFAULT"`` (the best torchvision has) or a name of the
    model's weights enum (``"IMAGENET1K_V1"``), read from torch's cache (``$TORCH_HOME/hub/checkpoints``),
    downloaded there when missing. With another ``num_classes`` the head keeps its fresh init."""

    @field_validator("weights")
    @classmethod
    def _known_weights(cls, value: str | None) -> str | None:
        if value is None or not cls.model_name:
            return value
        known = known_weights(cls.model_name)
        if known and value not in known:
            raise ValueError(unknown_weights(cls.model_name, value, known))
        return value


class ResNetOptions(ClassifierOptions):
    """ResNet-family options."""

    cifar_stem: bool = False
    """3x3 stride-1 first convolution and no max-pool, for 32x32 inputs such as CIFAR-10."""
    zero_init_residual: bool = False


def unknown_weights(model: str, value: str, known: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(value, known, n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{model} has no weights {value!r}; {hint}torchvision has: {', '.join(known) or 'none'}"


@functools.cache
def known_weights(model: str) -> tuple[str, ...] | None:
    """The names of ``model``'s torchvision weights enum (``DEFAULT``, ``IMAGENET1K_V1``, ...), read
    from torchvision's source without importing it (``runjob validate`` imports no torch); None
    when they cannot be found that way (then the build checks the name)."""
    try:
        spec = importlib.util.find_spec("torchvision")
        if spec is None or not spec.submodule_search_locations:
            return None
        for file in sorted((Path(next(iter(spec.submodule_search_locations))) / "models").glob("*.py")):
            text = file.read_text(encoding="utf-8")
            if f"def {model}(" not in text:
                continue
            tree = ast.parse(text)
            builder = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == model)
            argument = next(a for a in builder.args.kwonlyargs if a.arg == "weights")
            if argument.annotation is None:
                return None
            enum = next(
                n.id for n in ast.walk(argument.annotation) if isinstance(n, ast.Name) and n.id.endswith("_Weights")
            )
            body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == enum).body
            names = [t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
            return tuple(names) or None
    except (OSError, SyntaxError, StopIteration, AttributeError, ValueError):
        return None
    return None


def _weights_entry(name: str, value: str) -> WeightsEnum:
    """torchvision's weights enum member for ``model.weights = value``."""
    import torchvision.models  # lazy: plugin modules are imported by `runjob validate`, which must not load torchvision

    enum = torchvision.models.get_model_weights(name)
    known = list(enum.__members__)
    if value not in known:
        raise RunjobError(f"model.weights: {unknown_weights(name, value, known)}")
    return enum[value]


def _sha256_prefix_matches(path: Path, prefix: str) -> str | None:
    """None when the file's sha256 starts with ``prefix``, else its own digest's first characters."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    found = digest.hexdigest()
    return None if found.startswith(prefix) else found[: len(prefix)]


def weights_file(entry: WeightsEnum, value: str) -> Path:
    """The local file of torchvision weights ``entry``, in torch hub's checkpoint folder
    (``$TORCH_HOME/hub/checkpoints``): downloaded there (hash-checked) when missing; a file already
    there is checked against the sha256 prefix its name carries, as a download would be."""
    import torch.hub  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    filename: str = os.path.basename(urlparse(entry.url).path)
    folder = Path(torch.hub.get_dir()) / "checkpoints"
    path = folder / filename
    found = torch.hub.HASH_REGEX.search(filename)
    prefix = found.group(1) if found else ""
    what = f"model.weights = {value!r} ({entry!r})"
    if not path.is_file():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(entry.url, str(path), prefix or None, progress=False)
        except Exception as error:  # noqa: BLE001 - no network, a proxy, a wrong hash: the remedy is the same
            raise RunjobError(
                f"{what}: {filename} is not in {folder} and cannot be downloaded ({describe(error)}); place the file "
                f"from {entry.url} there (the folder is $TORCH_HOME/hub/checkpoints)"
            ) from None
    elif prefix:
        other = _sha256_prefix_matches(path, prefix)
        if other is not None:
            raise RunjobError(
                f"{what}: {path} is not the file torchvision published: its sha256 starts {other}, its name says "
                f"{prefix} (a partial download or another file); delete it and place the one from {entry.url}"
            )
    return path


def _architecture(name: str, entry: WeightsEnum) -> dict[str, object]:
    """What torchvision's builder sets when it loads these weights (the architecture they need)."""
    if name in _SINGLE_OUTPUT:  # trained with inputs transformed from ImageNet's normalization
        return {"transform_input": True}
    if name.startswith("vit_") and "min_size" in entry.meta:  # SWAG weights are for larger images
        return {"image_size": entry.meta["min_size"][0]}
    return {}


def load_pretrained(model: torch.nn.Module, name: str, entry: WeightsEnum, value: str) -> str:
    """Load torchvision weights ``entry`` into ``model`` (built with the job's options) by name;
    tensors of another shape (a head for another ``num_classes``) keep their fresh init. Returns
    the line to show."""
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    path = weights_file(entry, value)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if name.startswith("densenet"):  # old names, as torchvision's own loader renames them
        old = re.compile(r"^(.*denselayer\d+\.(?:norm|relu|conv))\.([12]\.(?:weight|bias|running_mean|running_var))$")
        state = {(m.group(1) + m.group(2) if (m := old.match(k)) else k): v for k, v in state.items()}
    # the auxiliary classifiers of googlenet and inception_v3: the model is built without them
    state = {k: v for k, v in state.items() if not (name in _SINGLE_OUTPUT and k.startswith("aux"))}
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise RunjobError(
            f"model.weights = {value!r} ({entry!r}) do not fit {name}: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    other = {k: (tuple(own[k].shape), tuple(v.shape)) for k, v in state.items() if own[k].shape != v.shape}
    model.load_state_dict({k: v for k, v in state.items() if k not in other}, strict=False)
    line = f"model.weights: {name} from {entry!r} ({path}): {len(state) - len(other)} of {len(own)} tensors"
    if other:
        shapes = ", ".join(f"{k} {list(here)} here, {list(there)} in the weights" for k, (here, there) in other.items())
        line += f"; re-initialised, their shape differs (the model's fresh init kept): {shapes}"
    return line


def build(name: str, options: ClassifierOptions, data: DataFacts | None = None) -> torch.nn.Module:
    """Build torchvision model ``name`` with the job's options (and its pretrained weights); its
    head has the dataset's classes unless ``num_classes`` says otherwise."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torch and torchvision
    import torch.nn as nn
    import torchvision.models

    weights = options.weights
    entry = _weights_entry(name, weights) if weights else None
    classes = options.num_classes or (data.num_classes if data is not None else None) or 1000
    kwargs: dict[str, object] = {"num_classes": classes, **_SINGLE_OUTPUT.get(name, {})}
    if entry is not None:
        kwargs.update(_architecture(name, entry))
    if isinstance(options, ResNetOptions):
        kwargs["zero_init_residual"] = options.zero_init_residual
    model = torchvision.models.get_model(name, **kwargs)  # torchvision has no type information
    if isinstance(options, ResNetOptions) and options.cifar_stem:
        model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    if entry is not None and weights:  # an entry only for weights
        line = load_pretrained(model, name, entry, weights)
        say(f"runjob: {line}")  # one line for the job, not one per process
    return cast("torch.nn.Module", model)


def _options_for(name: str, base: type[ClassifierOptions]) -> type[ClassifierOptions]:
    """``base`` for model ``name``: its ``weights`` are checked against that model's."""
    return type(base.__name__, (base,), {"__module__": __name__, "__doc__": base.__doc__, "model_name": name})


@hookimpl
def runjob_register_models(register: Register) -> None:
    """Register every torchvision classification model under its torchvision name."""
    for name in RESNETS:
        register(
            name,
            partial(build, name),
            options=_options_for(name, ResNetOptions),
            description=f"torchvision {name} (cifar_stem available)",
        )
    for name in OTHERS:
        register(
            name, partial(build, name), options=_options_for(name, ClassifierOptions), description=f"torchvision {name}"
        )
