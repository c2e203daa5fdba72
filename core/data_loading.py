"""DataLoaders for a job's datasets, with clear errors for data that cannot be batched."""

from __future__ import annotations

from typing import Any

from runjob.components import DatasetSplits
from runjob.errors import DataError


def collate(batch: list[Any]) -> Any:
    """torch's default collation, with a clear message when inputs differ in shape."""
    from torch.utils.data import default_collate

    try:
        return default_collate(batch)
    except RuntimeError as error:
        if "stack expects each tensor to be equal size" not in str(error):
            raise
        raise DataError(
            f"inputs in one batch have different shapes ({error}); the dataset must give inputs of one size "
            "(for image folders: set dataset.image_size)"
        ) from None


def make_loaders(splits: DatasetSplits, job: Any, accelerator: Any) -> tuple[Any, Any]:
    """Training (shuffled, seeded) and validation (in order, every sample once) DataLoaders."""
    import torch
    from torch.utils.data import DataLoader

    dataset_name = job.dataset.name
    global_batch = job.train.batch_size * accelerator.num_processes
    for split, data in (("train", splits.train), ("val", splits.val)):
        if len(data) == 0:
            raise DataError(f"dataset {dataset_name!r}: the {split} split is empty")
    if job.train.drop_last and len(splits.train) < global_batch:
        raise DataError(
            f"dataset {dataset_name!r} has {len(splits.train)} training samples, fewer than one batch "
            f"({job.train.batch_size} x {accelerator.num_processes} processes); lower train.batch_size or set train.drop_last = false"
        )
    loader = job.loader
    common = {
        "num_workers": loader.num_workers,
        "pin_memory": accelerator.device.type == "cuda" if loader.pin_memory is None else loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
        "collate_fn": collate,
    }
    train = DataLoader(
        splits.train,
        batch_size=job.train.batch_size,
        shuffle=True,
        drop_last=job.train.drop_last,
        generator=torch.Generator().manual_seed(job.job.seed),
        **common,
    )
    val = DataLoader(splits.val, batch_size=job.train.eval_batch_size or job.train.batch_size, shuffle=False, **common)
    return train, val
