"""Built-in models: torchvision's image classification models, by their torchvision names."""

from __future__ import annotations

from functools import partial

from pydantic import Field

from runjob import Options, hookimpl

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
    """Options every torchvision classifier takes (randomly initialised; no weights download)."""

    num_classes: int = Field(1000, ge=2)


class ResNetOptions(ClassifierOptions):
    """ResNet-family options."""

    cifar_stem: bool = False
    """3x3 stride-1 first convolution and no max-pool, for 32x32 inputs such as CIFAR-10."""
    zero_init_residual: bool = False


def build(name: str, options: ClassifierOptions):
    """Build torchvision model ``name`` with the job's options."""
    import torch.nn as nn
    import torchvision.models

    kwargs = {"num_classes": options.num_classes, **_SINGLE_OUTPUT.get(name, {})}
    if isinstance(options, ResNetOptions):
        kwargs["zero_init_residual"] = options.zero_init_residual
    model = torchvision.models.get_model(name, **kwargs)
    if isinstance(options, ResNetOptions) and options.cifar_stem:
        model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


@hookimpl
def runjob_register_models(register):
    """Register every torchvision classification model under its torchvision name."""
    for name in RESNETS:
        register(
            name, partial(build, name), options=ResNetOptions, description=f"torchvision {name} (cifar_stem available)"
        )
    for name in OTHERS:
        register(name, partial(build, name), options=ClassifierOptions, description=f"torchvision {name}")
