"""Built-in model ``gpt``: a decoder-only transformer for next-token prediction, in plain torch.

Token and learned position embeddings, ``layers`` pre-LayerNorm blocks (causal self-attention
through ``scaled_dot_product_attention``, a 4x GELU MLP), a final LayerNorm and an output head
tied to the token embedding. ``forward(tokens (B, T) int64) -> logits (B, T, vocab_size)``.

The layers live in :mod:`runjob_builtins.gpt_layers` (``GPT``, ``Block``, ``CausalSelfAttention``),
imported when a model is built, so loading plugins does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, ValidationInfo, field_validator

from runjob import DataFacts, Options, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    from runjob import Register
    from runjob_builtins.gpt_layers import GPT


class GPTOptions(Options):
    vocab_size: int | None = Field(None, ge=2)
    """Token ids 0 .. vocab_size - 1; by default the dataset's (256 for text_files' bytes)."""
    context: int | None = Field(None, ge=1)
    """The longest sequence the model takes (its learned positions), at least the dataset's; by
    default the dataset's context (128 when it has none)."""
    layers: int = Field(4, ge=1)
    width: int = Field(128, ge=1)
    """Channels of the residual stream (the embedding size)."""
    heads: int = Field(4, ge=1)
    """Attention heads; width must be a multiple of heads."""
    dropout: float = Field(0.0, ge=0, lt=1)
    bias: bool = True
    """Biases in the linear layers and LayerNorms."""
    tie_weights: bool = True
    """The output head shares the token embedding's weights (GPT-2 does)."""

    @field_validator("heads")
    @classmethod
    def _width_divides(cls, heads: int, info: ValidationInfo) -> int:
        width = info.data.get("width")
        if width is not None and width % heads:
            lower, upper = (width // heads) * heads, (width // heads + 1) * heads
            suggest = f"{lower} or {upper}" if lower else f"{upper}"
            raise ValueError(f"width = {width} is not a multiple of heads = {heads}; set width to e.g. {suggest}")
        return heads


def build_gpt(options: GPTOptions, data: DataFacts | None = None) -> GPT:
    """A randomly initialised GPT (GPT-2's initialisation), sized for the data unless the job says."""
    # lazy: gpt_layers imports torch; plugin modules are imported by `runjob validate`, which must not load torch
    from runjob_builtins.gpt_layers import GPT  # imports torch: only when a model is built

    data = data or DataFacts()
    sizes = {
        "vocab_size": options.vocab_size or data.vocab_size or data.num_classes or 256,
        "context": options.context or data.context or 128,
    }
    return GPT(options.model_copy(update=sizes))


@hookimpl
def runjob_register_models(register: Register) -> None:
    """Register gpt."""
    register(
        "gpt",
        build_gpt,
        options=GPTOptions,
        description="decoder-only transformer for next-token prediction (tokens (B, T) -> logits (B, T, vocab))",
    )
