"""A third-party runjob plugin: registers the model ``tiny_mlp``.

Job files use it as::

    [model]
    name = "tiny_mlp"
    num_classes = 10
    in_features = 3072   # 3 x 32 x 32 images, flattened
    hidden_size = 64
"""

from pydantic import Field

import runjob


class TinyMLPOptions(runjob.Options):
    num_classes: int = Field(..., ge=2)
    in_features: int = Field(3 * 32 * 32, ge=1)
    """Inputs are flattened: channels x height x width (3x32x32 by default)."""
    hidden_size: int = Field(64, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)


def build_tiny_mlp(options: TinyMLPOptions):
    # torch is imported here, not at module level, so `runjob --help` stays fast
    import torch.nn as nn

    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(options.in_features, options.hidden_size),
        nn.ReLU(),
        nn.Dropout(options.dropout),
        nn.Linear(options.hidden_size, options.num_classes),
    )


@runjob.hookimpl
def runjob_register_models(register):
    """Register tiny_mlp."""
    register("tiny_mlp", build_tiny_mlp, options=TinyMLPOptions, description="Flatten, one hidden layer, logits")
