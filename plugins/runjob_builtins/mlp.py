"""Built-in model ``mlp``: a multi-layer perceptron for feature vectors (tabular data, the ``csv``
dataset), giving class logits or values.

Job files use it as::

    [model]
    name = "mlp"
    in_features = 10       # the feature columns (by default: as many as the dataset's samples have)
    hidden = [64, 64]      # one linear layer and activation per entry
    outputs = 1            # values to predict, or classes (by default: the dataset's classes, else 1)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from runjob import DataFacts, Options, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register


class MLPOptions(Options):
    in_features: int | None = Field(None, ge=1)
    """Inputs per sample; inputs of more dimensions are flattened first. By default the dataset's
    (its samples' size)."""
    hidden: list[int] = Field(default_factory=lambda: [64])
    """Width of each hidden layer; [] gives a linear model."""
    outputs: int | None = Field(None, ge=1)
    """Outputs per sample: values for regression, classes for classification. By default the
    dataset's classes, or 1 (one value) when its targets are values."""
    activation: Literal["relu", "gelu", "tanh"] = "relu"
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout after each hidden layer's activation."""

    @field_validator("hidden")
    @classmethod
    def _positive(cls, widths: list[int]) -> list[int]:
        if any(width < 1 for width in widths):
            raise ValueError(f"every hidden width must be 1 or more, got {widths}")
        return widths


def build_mlp(options: MLPOptions, data: DataFacts) -> torch.nn.Sequential:
    import torch.nn as nn  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    if options.in_features is None and data.input_shape is None:
        raise ValueError("in_features is not given, and the dataset's samples do not say it: set model.in_features")
    in_features = options.in_features or math.prod(data.input_shape or ())
    outputs = options.outputs or data.num_classes or 1

    activation = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}[options.activation]
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for hidden in options.hidden:
        layers += [nn.Linear(width, hidden), activation()]
        if options.dropout:
            layers.append(nn.Dropout(options.dropout))
        width = hidden
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


@hookimpl
def runjob_register_models(register: Register) -> None:
    """Register mlp."""
    register("mlp", build_mlp, options=MLPOptions, description="linear layers and activations, for feature vectors")
