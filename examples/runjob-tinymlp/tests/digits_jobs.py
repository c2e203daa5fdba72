"""The job the plugin's tests train: tiny_mlp on scikit-learn's digits, 2 epochs of batches of 64."""

ADAM = """
    [optimizer]
    name = "adam"
    lr = 0.01
"""


def tiny_mlp_digits(name: str, *, image_size: int = 8, tables: str = ADAM, train: str = "") -> str:
    """The job named ``name`` on ``image_size`` x ``image_size`` scans (flattened: 3 x size x size
    inputs), with ``tables`` (other job tables) and ``train`` (more ``[train]`` keys) added."""
    return f"""
    [job]
    name = "{name}"
    [model]
    name = "tiny_mlp"
    num_classes = 10
    in_features = {3 * image_size * image_size}
    hidden_size = 32
    [dataset]
    name = "digits"
    image_size = {image_size}
{tables}
    [train]
    epochs = 2
    batch_size = 64
{train}"""
