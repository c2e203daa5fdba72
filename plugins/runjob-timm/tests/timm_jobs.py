"""The jobs the tests run, on scikit-learn's digits, one epoch of batches of 64: timm's tiny test
models, a 208k-parameter ConvNeXt (`test_convnext`) and a 255k-parameter ViT (`test_vit`, patches of
4 pixels). Their classes, channels and image size come from the dataset's facts."""

CONVNEXT = """
    [model]
    name = "timm"
    arch = "test_convnext"
"""

VIT = """
    [model]
    name = "timm"
    arch = "test_vit"
    kwargs = { patch_size = 4 }
"""


def digits_job(name: str, model: str = CONVNEXT, *, image_size: int = 32, train: str = "", more: str = "") -> str:
    """A job named ``name`` training ``model`` (its [model] table) on the digits at ``image_size``;
    ``train``: more [train] keys; ``more``: other tables."""
    return f"""
    [job]
    name = "{name}"
    seed = 0
{model}
{more}
    [dataset]
    name = "digits"
    image_size = {image_size}
    [optimizer]
    name = "adamw"
    lr = 0.003
    [train]
    epochs = 1
    batch_size = 64
{train}"""
