"""The built-in adapters (``[model.adapters.NAME]``): ``lora``, low-rank adapters through PEFT.

LoRA layers are put into the model where it is (``peft.inject_adapter_in_model``), not around it:
the model keeps its class and its ``forward`` (a Hugging Face model still generates, a task still
passes it the keywords it names), and only the adapters (and ``modules_to_save``) train. The run's
``model.safetensors`` holds the adapted model (its base weights under ``...base_layer``), so
``evaluate``, ``predict`` and the MLflow model rebuild it from the run's folder alone; the adapter's
own weights and configuration are also written to ``OUTPUT_DIR/adapters/lora/`` (PEFT's file names),
and ``runjob export`` folds them into the base weights (``merge``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from runjob import Adapter, Options, hookimpl, require_module

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch or peft
    import torch
    from peft import LoraConfig

    from runjob import Register

ALL_LINEAR: Literal["all-linear"] = "all-linear"


class LoraOptions(Options):
    """``[model.adapters.lora]``: PEFT's LoraConfig, by its names."""

    r: int = Field(8, ge=1)
    """The rank of each adapter."""
    alpha: float = Field(16.0, gt=0)
    """The scale of the adapters' output is alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = ALL_LINEAR
    """The layers that get adapters: names (or name suffixes, as PEFT matches them) of the model's
    Linear, Conv or Embedding layers, or ``"all-linear"``: every Linear layer but the output one."""
    modules_to_save: list[str] = Field(default_factory=list)
    """Layers trained in full beside the adapters (a new classification head)."""
    bias: Literal["none", "all", "lora_only"] = "none"

    @model_validator(mode="after")
    def _needs_peft(self) -> LoraOptions:
        require_module("peft", "lora", "[model.adapters.lora]")
        return self


class Lora(Adapter):
    def __init__(self, options: LoraOptions) -> None:
        self.options = options

    def config(self) -> LoraConfig:
        from peft import LoraConfig  # lazy: plugin modules are imported by `runjob validate`, which must not load peft

        options = self.options
        return LoraConfig(
            r=options.r,
            lora_alpha=options.alpha,  # type: ignore[arg-type]  # PEFT annotates an int, and takes a float
            lora_dropout=options.dropout,
            target_modules=options.target_modules,
            modules_to_save=options.modules_to_save or None,
            bias=options.bias,
        )

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        # lazy: plugin modules are imported by `runjob validate`, which must not load peft
        from peft import inject_adapter_in_model

        names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
        if self.options.target_modules != ALL_LINEAR:
            missing = [t for t in self.options.target_modules if t.rpartition(".")[2] not in names]
            if missing:
                layers = sorted(n for n, m in model.named_modules() if type(m).__name__ in ("Linear", "Conv1D"))
                raise ValueError(
                    f"target_modules {missing} name no layer of the model; its Linear layers: "
                    f"{', '.join(layers[:12])}{' ...' if len(layers) > 12 else ''}"
                )
        with warnings.catch_warnings():  # PEFT's advice about models it does not know by type
            warnings.simplefilter("ignore", UserWarning)
            adapted = inject_adapter_in_model(self.config(), model)
        for name, parameter in adapted.named_parameters():  # only the adapters (and modules_to_save) train
            parameter.requires_grad = "lora_" in name or "modules_to_save" in name or _trained_bias(name, self.options)
        return adapted

    def merge(self, model: torch.nn.Module) -> torch.nn.Module:
        """Each LoRA layer folded into its base layer and replaced by it, and each of
        ``modules_to_save`` replaced by its trained copy: the plain model."""
        # lazy: plugin modules are imported by `runjob validate`, which must not load peft
        from peft.tuners.lora import LoraLayer
        from peft.utils import ModulesToSaveWrapper

        for name, module in list(model.named_modules()):
            if isinstance(module, LoraLayer):
                module.merge()
                plain = module.get_base_layer()
            elif isinstance(module, ModulesToSaveWrapper):
                plain = next(iter(module.modules_to_save.values()))
            else:
                continue
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            setattr(parent, name.rpartition(".")[2], plain)
        return model

    def save(self, model: torch.nn.Module, folder: Path) -> None:
        """``adapter_model.safetensors`` and ``adapter_config.json``, as PEFT names them."""
        # lazy: plugin modules are imported by `runjob validate`, which must not load peft and safetensors
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        weights = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}
        save_file(weights, str(folder / "adapter_model.safetensors"))
        config = self.config().to_dict()  # type: ignore[no-untyped-call]  # PEFT leaves to_dict unannotated
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=1, default=str) + "\n")


def _trained_bias(name: str, options: LoraOptions) -> bool:
    return name.endswith(".bias") and options.bias == "all"


@hookimpl
def runjob_register_adapters(register: Register) -> None:
    register(
        "lora",
        Lora,
        options=LoraOptions,
        description="low-rank adapters (LoRA) through PEFT, in the model's own layers",
        libraries=("peft",),
    )
