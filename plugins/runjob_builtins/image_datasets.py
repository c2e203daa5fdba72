"""Built-in image datasets: ``cifar10`` (torchvision's CIFAR10) and ``imagefolder``."""

from __future__ import annotations

import hashlib
import io
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runjob import AbsolutePath, DataError, DatasetSplits, ExistingDir, ImageTensors, Inputs, Options, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch, torchvision or Pillow
    from collections.abc import Callable

    import torch
    from PIL.Image import Image
    from torch.utils.data import TensorDataset
    from torchvision.datasets import CIFAR10, ImageFolder

    from runjob import Register

CIFAR_MEAN = [0.4914, 0.4822, 0.4465]
CIFAR_STD = [0.2470, 0.2435, 0.2616]
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_cifar10_files(root: Path, per_batch: int, test_count: int | None = None, seed: int = 0) -> Path:
    """Files in CIFAR-10's python layout under ``root/cifar-10-batches-py`` (five training batches of
    ``per_batch`` images, a test batch of ``test_count``, the meta file) with random pixels and
    labels: data to test and benchmark the ``cifar10`` dataset offline. Their md5 sums are not
    CIFAR's, so a job reads them with ``verify = false``. Returns ``root``."""
    import numpy as np  # lazy: plugin modules are imported by `runjob validate`, which must not load numpy

    rng = np.random.default_rng(seed)
    folder = root / CIFAR_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    counts = [(f"data_batch_{i}", per_batch) for i in range(1, 6)]
    counts.append(("test_batch", per_batch if test_count is None else test_count))
    for name, count in counts:
        batch = {
            "batch_label": name,
            "data": rng.integers(0, 256, size=(count, 3072), dtype=np.uint8),
            "labels": [int(x) for x in rng.integers(0, 10, size=count)],
        }
        with open(folder / name, "wb") as file:
            pickle.dump(batch, file)
    with open(folder / "batches.meta", "wb") as file:
        pickle.dump({"label_names": CIFAR_CLASSES, "num_cases_per_batch": per_batch, "num_vis": 3072}, file)
    return root


class CIFAR10Options(Options):
    download: bool = True
    """Download into root when the files are not there yet (needs internet)."""
    verify: bool = True
    """Check the files' md5 sums against torchvision's; false accepts any complete copy."""
    root: AbsolutePath = "data/cifar10"
    """The folder holding cifar-10-batches-py/ (or where to download it)."""
    augment: bool = True
    """Random crop (padding 4) and horizontal flip for training."""
    in_memory: bool = True
    """Keep the decoded images (150 MB) on the training device and crop, flip and normalize whole
    batches there; false: torchvision's per-image transforms in the DataLoader (and its workers)."""

    @field_validator("root")
    @classmethod
    def _copy_present_without_download(cls, root: str, info: ValidationInfo) -> str:
        if not info.data.get("download", True) and not (Path(root) / CIFAR_FOLDER).is_dir():
            raise ValueError(
                f"folder not found: {Path(root) / CIFAR_FOLDER} (download = false, so a copy must be there)"
            )
        return root


class ImageNormalization(Options):
    """``mean`` and ``std`` of an image dataset's normalization, one per RGB channel, checked: the
    options of ``imagefolder`` and ``streamed_images`` take them alike."""

    mean: list[float] = Field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = Field(default_factory=lambda: list(IMAGENET_STD))

    @field_validator("mean")
    @classmethod
    def _three_values(cls, values: list[float]) -> list[float]:
        if len(values) != 3:
            raise ValueError(f"needs 3 numbers (one per RGB channel), got {values}")
        return values

    @field_validator("std")
    @classmethod
    def _three_positive(cls, values: list[float]) -> list[float]:
        if len(values) != 3 or not all(v > 0 for v in values):
            raise ValueError(f"needs 3 positive numbers (one per RGB channel), got {values}")
        return values


class ImageFolderOptions(ImageNormalization):
    root: ExistingDir
    """A folder holding train/<class>/ and val/<class>/ images."""
    image_size: int | None = Field(None, ge=1)
    """Resize every image to image_size x image_size; by default images keep their size."""
    augment: bool = False
    """Random horizontal flip for training."""
    in_memory: bool = False
    """Decode every image once at the start and keep them all on the training device (the images must
    have one size: set image_size); batches are then flipped and normalized there as whole tensors."""

    @field_validator("root")
    @classmethod
    def _train_and_val_with_same_classes(cls, root: str) -> str:
        splits = {name: Path(root) / name for name in ("train", "val")}
        missing = [str(path) for path in splits.values() if not path.is_dir()]
        if missing:
            raise ValueError(f"folder not found: {', '.join(missing)} (root needs train/<class>/ and val/<class>/)")
        classes = {name: sorted(p.name for p in path.iterdir() if p.is_dir()) for name, path in splits.items()}
        if not classes["train"]:
            raise ValueError(f"no class folders in {splits['train']}")
        if classes["train"] != classes["val"]:
            only_train = sorted(set(classes["train"]) - set(classes["val"]))
            only_val = sorted(set(classes["val"]) - set(classes["train"]))
            raise ValueError(
                f"train/ and val/ must hold the same class folders; only in train: {only_train}, only in val: "
                f"{only_val}"
            )
        return root


def build_cifar10(options: CIFAR10Options) -> DatasetSplits:
    """torchvision's CIFAR10, with the standard augmentation for training."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torchvision
    from torchvision import datasets, transforms

    normalize = transforms.Normalize(CIFAR_MEAN, CIFAR_STD)
    eval_tf = transforms.Compose([transforms.ToTensor(), normalize])
    train_tf = eval_tf
    if options.augment:
        train_tf = transforms.Compose(
            [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]
        )

    if options.in_memory:  # the arrays as torchvision read them; the transforms run batched on the device
        train_tf = eval_tf = None
    cifar = datasets.CIFAR10
    if not options.verify:

        class PresenceCheckedCIFAR10(datasets.CIFAR10):  # type: ignore[misc]  # torchvision has no type information
            """CIFAR10 that accepts any copy whose files are all present (torchvision skips the
            md5 comparison for a file whose expected sum is None)."""

            train_list = [[name, None] for name, _ in datasets.CIFAR10.train_list]
            test_list = [[name, None] for name, _ in datasets.CIFAR10.test_list]
            meta = {**datasets.CIFAR10.meta, "md5": None}

        cifar = PresenceCheckedCIFAR10

    folder = Path(options.root) / CIFAR_FOLDER
    try:
        train = cifar(options.root, train=True, download=options.download, transform=train_tf)
        val = cifar(options.root, train=False, download=False, transform=eval_tf)
    except RuntimeError as error:  # torchvision: "Dataset not found or corrupted"
        check = (
            "whose md5 sums match torchvision's (dataset.verify = false accepts any complete copy)"
            if options.verify
            else "with all batch files"
        )
        raise DataError(
            f"CIFAR-10 not found or incomplete in {folder}: put a copy of {CIFAR_FOLDER}/ there {check}; ({error})"
        ) from None
    except OSError as error:  # network failures while downloading
        raise DataError(
            f"could not download CIFAR-10 into {options.root} ({error}); put a copy of {CIFAR_FOLDER}/ in dataset.root "
            "and set dataset.download = false"
        ) from None
    except Exception as error:  # a corrupt pickle batch
        raise DataError(f"cannot read CIFAR-10 from {folder}: {type(error).__name__}: {error}") from None
    train_classes = train.classes
    digest = _cifar_digest(train, val)
    if options.in_memory:
        train, val = _cifar_tensors(train, options.augment), _cifar_tensors(val, False)
    return DatasetSplits(
        train=train,
        val=val,
        num_classes=len(train_classes),
        classes=list(train_classes),
        source=str(folder.resolve()),
        digest=digest,
        # images of any size, made 32x32 as the models were trained on
        inputs=ImageFileInputs(32, CIFAR_MEAN, CIFAR_STD),
    )


def _cifar_tensors(split: CIFAR10, augment: bool) -> ImageTensors:
    """torchvision's decoded CIFAR arrays (N, 32, 32, 3 uint8) as ImageTensors with the same augmentation."""
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    images = torch.from_numpy(split.data).permute(0, 3, 1, 2).contiguous()
    labels = torch.tensor(split.targets, dtype=torch.long)
    return ImageTensors(images, labels, CIFAR_MEAN, CIFAR_STD, crop_padding=4 if augment else 0, flip=augment)


def _cifar_digest(train: CIFAR10, val: CIFAR10) -> str:
    """The md5 sums of the batch files: torchvision's list when it checked them, else read here."""
    sums = []
    for dataset, files in ((train, train.train_list), (val, val.test_list)):
        for name, md5 in files:
            sums.append(md5 or hashlib.md5((Path(dataset.root) / dataset.base_folder / name).read_bytes()).hexdigest())
    return hashlib.sha256(" ".join(sums).encode()).hexdigest()[:16]


def _listing_digest(root: Path) -> str:
    """A fingerprint of an image folder: every file's path (relative to root) and size."""
    entries = sorted(f"{p.relative_to(root).as_posix()}:{p.stat().st_size}" for p in root.rglob("*") if p.is_file())
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:16]


def _read_image(path: str) -> Image:
    from PIL import Image  # lazy: plugin modules are imported by `runjob validate`, which must not load PIL

    try:
        with open(path, "rb") as file:
            return Image.open(file).convert("RGB")
    except Exception as error:
        raise DataError(f"cannot read image {path}: {type(error).__name__}: {error}") from None


class ImageFileInputs(Inputs):
    """Image files (PNG, JPEG, ...) as the model's inputs: decoded as RGB (then to one gray channel,
    repeated three times, when ``gray``), resized to ``size`` when set, scaled to [0, 1] and
    normalized with ``mean`` and ``std``: the validation split's transform. A record is
    ``{"image": the file's bytes}`` (``runjob predict --input`` reads it from the file); the run's
    MLflow model takes a column ``image`` of such bytes."""

    columns = {"image": "binary"}
    reads = "image"

    def __init__(self, size: int | None, mean: list[float], std: list[float], gray: bool = False) -> None:
        if size is not None and size < 1:  # a run's predictor is data: checked when it is rebuilt
            raise ValueError(f"size {size}: must be at least 1")
        if len(mean) not in (1, 3) or len(std) != len(mean) or not all(s > 0 for s in std):
            raise ValueError(f"mean {list(mean)} and std {list(std)}: one or three values each, std above 0")
        self.size, self.mean, self.std, self.gray = size, [float(m) for m in mean], [float(s) for s in std], gray
        self._transform: Callable[[Image], torch.Tensor] | None = None

    def read(self, path: Path) -> list[tuple[str, dict[str, Path]]]:
        """The image file ``path``, or every image file in the folder and its subfolders (named by
        their path relative to it), in path order; each read when it is encoded. Files that are not
        images are left out by :meth:`runjob.Inputs.files`."""
        root = Path(path)
        return [
            (file.name if file == root else file.relative_to(root).as_posix(), {"image": file})
            for file in self.files(root)
        ]

    def encode(self, record: dict[str, Path | bytes]) -> torch.Tensor:
        from PIL import Image  # lazy: plugin modules are imported by `runjob validate`, which must not load PIL

        if "image" not in record:
            raise ValueError("no 'image' column (an image file's bytes)")
        image = record["image"]
        try:
            if isinstance(image, Path):
                with image.open("rb") as file:
                    decoded = Image.open(file).convert("RGB")
            else:
                decoded = Image.open(io.BytesIO(bytes(image))).convert("RGB")
        except Exception as error:  # noqa: BLE001 - PIL raises many kinds for a file that is not an image
            raise ValueError(f"cannot read the image: {type(error).__name__}: {error}") from None
        return self.transform(decoded)

    @property
    def transform(self) -> Callable[[Image], torch.Tensor]:
        if self._transform is None:
            # lazy: plugin modules are imported by `runjob validate`, which must not load torchvision
            from torchvision import transforms

            steps = [transforms.Grayscale(1)] if self.gray else []
            steps += [transforms.Resize((self.size, self.size))] if self.size else []
            steps.append(transforms.ToTensor())
            steps += [transforms.Lambda(_three_channels)] if self.gray else []
            steps.append(transforms.Normalize(self.mean, self.std))
            self._transform = transforms.Compose(steps)
        return self._transform


def _three_channels(image: torch.Tensor) -> torch.Tensor:
    return image.expand(3, -1, -1)


def build_imagefolder(options: ImageFolderOptions) -> DatasetSplits:
    """torchvision's ImageFolder over root/train and root/val."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torchvision
    from torchvision import datasets, transforms

    resize = [transforms.Resize((options.image_size, options.image_size))] if options.image_size else []
    tail = [transforms.ToTensor(), transforms.Normalize(options.mean, options.std)]
    flip = [transforms.RandomHorizontalFlip()] if options.augment else []
    root = Path(options.root)
    try:
        train = datasets.ImageFolder(
            str(root / "train"), transform=transforms.Compose(resize + flip + tail), loader=_read_image
        )
        val = datasets.ImageFolder(str(root / "val"), transform=transforms.Compose(resize + tail), loader=_read_image)
    except FileNotFoundError as error:  # a class folder without any image
        raise DataError(f"{error} (dataset.root = {root})") from None
    classes = list(train.classes)
    if options.in_memory:
        train = _decoded(train, options, flip=options.augment)
        val = _decoded(val, options, flip=False)
    return DatasetSplits(
        train=train,
        val=val,
        num_classes=len(classes),
        classes=classes,
        source=str(root.resolve()),
        digest=_listing_digest(root),
        inputs=ImageFileInputs(options.image_size, options.mean, options.std),  # the validation split's transform
    )


def _decoded(folder: ImageFolder, options: ImageFolderOptions, flip: bool) -> ImageTensors:
    """Every image of an ImageFolder decoded once (resized when image_size is set) into one uint8 tensor."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torch and torchvision
    import torch
    from torchvision import transforms

    resize = [transforms.Resize((options.image_size, options.image_size))] if options.image_size else []
    folder.transform = transforms.Compose([*resize, transforms.PILToTensor()])
    images = [folder[index][0] for index in range(len(folder))]
    sizes = sorted({tuple(image.shape[1:]) for image in images})
    if len(sizes) > 1:
        raise DataError(
            f"dataset.in_memory = true needs images of one size, but {folder.root} holds {len(sizes)} sizes "
            f"({', '.join('x'.join(map(str, size)) for size in sizes[:4])}{', ...' if len(sizes) > 4 else ''}): set "
            "dataset.image_size"
        )
    return ImageTensors(
        torch.stack(images), torch.tensor(folder.targets, dtype=torch.long), options.mean, options.std, flip=flip
    )


class SyntheticOptions(Options):
    num_train: int = Field(50_000, ge=1)
    num_val: int = Field(10_000, ge=1)
    image_size: int = Field(32, ge=1)
    num_classes: int = Field(10, ge=2)
    seed: int = Field(0, ge=0)
    in_memory: bool = True
    """Batches built on the training device from one tensor; false: a TensorDataset through the DataLoader."""
    augment: bool = False
    """With in_memory: CIFAR's random crop (padding 4) and flip, batched on the device (to measure their cost)."""

    @model_validator(mode="after")
    def _augment_needs_in_memory(self) -> SyntheticOptions:
        if self.augment and not self.in_memory:
            raise ValueError("augment = true needs in_memory = true")
        return self


def build_synthetic(options: SyntheticOptions) -> DatasetSplits:
    """Random uint8 images and labels of CIFAR's shape by default: for throughput checks, not learning."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torch
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(options.seed)
    size = (3, options.image_size, options.image_size)
    mean, std = [127.5 / 255] * 3, [64 / 255] * 3  # roughly zero mean, unit spread

    def split(count: int, augment: bool) -> ImageTensors | TensorDataset:
        images = torch.randint(0, 256, (count, *size), generator=generator, dtype=torch.uint8)
        labels = torch.randint(0, options.num_classes, (count,), generator=generator)
        if options.in_memory:
            return ImageTensors(images, labels, mean, std, crop_padding=4 if augment else 0, flip=augment)
        scaled = (images.float() / 255 - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
        return TensorDataset(scaled, labels)

    train = split(options.num_train, options.augment)
    return DatasetSplits(train=train, val=split(options.num_val, False), num_classes=options.num_classes)


@hookimpl
def runjob_register_inputs(register: Register) -> None:
    """Register image_files (the image datasets' inputs, kept by a run as its size and normalization)."""
    register("image_files", ImageFileInputs, description="image files, resized and normalized as the validation split")


@hookimpl
def runjob_register_datasets(register: Register) -> None:
    """Register cifar10, imagefolder and synthetic."""
    register(
        "cifar10",
        build_cifar10,
        options=CIFAR10Options,
        description="CIFAR-10 through torchvision (download, md5 check, standard augmentation)",
    )
    register(
        "imagefolder",
        build_imagefolder,
        options=ImageFolderOptions,
        description="torchvision ImageFolder over root/train and root/val",
    )
    register(
        "synthetic",
        build_synthetic,
        options=SyntheticOptions,
        description="random CIFAR-shaped images, for throughput and GPU checks",
    )
