"""Built-in dataset ``csv``: a table of numbers in a CSV file with a header row, for regression
(``target_type = "value"``) or classification (``"class"``).

Every row is one sample: the feature columns become a float32 vector ``(F,)``; the target column
becomes a float32 value (``(N,)`` targets for one column named as a string, ``(N, k)`` for a list
of k columns), or, for ``"class"``, a class index (int64) into the column's distinct values, in
numeric order when they are all numbers, else in string order. The rows are split at random into
training, validation and (with ``test_fraction``) test rows, with a fixed seed so runs compare;
features are standardized with the training rows' mean and standard deviation only, so nothing of
the held-out rows leaks into training. Targets are left as they are: metrics stay in their units.

```toml
[dataset]
name = "csv"
path = "data/diabetes.csv"     # comma-separated, UTF-8, the first line names the columns
target = "target"              # or a list of columns: ["y1", "y2"]
# features = ["age", "bmi"]    # default: every column but the target(s)
# target_type = "value"        # or "class"
# val_fraction = 0.2
# test_fraction = 0.0
# split_seed = 0
# standardize = true
```

``runjob validate`` reads only the header line: a column the job names that the file lacks is
reported there with the closest names. Cells are read when training starts; an empty, missing or
non-numeric cell stops the run naming the file, line (the header is line 1), column and value.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationInfo, field_validator

from runjob import DataError, DatasetSplits, ExistingFile, Inputs, Options, hookimpl

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch
    import torch

    from runjob import Register

LISTED_COLUMNS = 30
"""How many of a file's column names a message lists before it says '... (N columns)'."""


class CSVOptions(Options):
    path: ExistingFile
    """A comma-separated UTF-8 file whose first line names the columns."""
    target: str | list[str]
    """The target column, or a list of target columns (then the targets are (N, k), even for one)."""
    features: list[str] | None = Field(None, validate_default=True)
    """The feature columns, in this order; by default every column but the target(s), in file order."""
    target_type: Literal["value", "class"] = "value"
    """"value": float targets (regression); "class": one column whose distinct values are the classes."""
    val_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of the rows held out for validation."""
    test_fraction: float = Field(0.0, ge=0, lt=1)
    """Share of the rows held out as a test split, evaluated once with the final weights (0: none)."""
    split_seed: int = Field(0, ge=0)
    """Seed of the random split of the rows (fixed, so runs compare)."""
    standardize: bool = True
    """Scale each feature to mean 0 and standard deviation 1 over the training rows (a constant
    column is only centred); the validation and test rows get the training rows' scaling."""

    # The checks below read the header line only (validate stays fast); each runs only when the
    # fields it needs passed their own checks.

    @field_validator("path")
    @classmethod
    def _has_a_header(cls, path: str) -> str:
        read_header(path)
        return path

    @field_validator("target")
    @classmethod
    def _targets_in_header(cls, target: str | list[str], info: ValidationInfo) -> str | list[str]:
        names = target_columns(target)
        if not names:
            raise ValueError("names no column: give at least one target column")
        refuse_repeats(names)
        if "path" in info.data:
            _require_columns(names, info.data["path"])
        return target

    @field_validator("features")
    @classmethod
    def _features_in_header(cls, features: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if features is not None:
            if not features:
                raise ValueError("names no column: list at least one, or leave features out to use every other column")
            refuse_repeats(features)
        if "path" not in info.data:
            return features
        path = info.data["path"]
        if features is not None:
            _require_columns(features, path)
        if "target" not in info.data:
            return features
        targets = target_columns(info.data["target"])
        if features is None:  # filled in, so the resolved job (and MLflow) records which columns were used
            features = [name for name in read_header(path) if name not in targets]
            if not features:
                raise ValueError(f"no feature columns left: every column of {path} is a target")
            return features
        both = [name for name in features if name in targets]
        if both:
            raise ValueError(f"{quoted(both)} is also the target (dataset.target): a column is one or the other")
        return features

    @field_validator("target_type")
    @classmethod
    def _one_class_column(cls, target_type: str, info: ValidationInfo) -> str:
        return one_class_column(target_type, info.data.get("target", []))

    @field_validator("test_fraction")
    @classmethod
    def _room_for_training(cls, test_fraction: float, info: ValidationInfo) -> float:
        return room_for_training(info.data.get("val_fraction"), test_fraction)


def room_for_training(val_fraction: float | None, test_fraction: float) -> float:
    """``test_fraction``, checked: with ``val_fraction`` it leaves rows for training."""
    if val_fraction is not None and val_fraction + test_fraction >= 1:
        raise ValueError(
            f"val_fraction + test_fraction must be below 1 to leave rows for training "
            f"({val_fraction} + {test_fraction} = {val_fraction + test_fraction:g})"
        )
    return test_fraction


def one_class_column(target_type: str, target: str | list[str]) -> str:
    """``target_type``, checked: "class" takes one target column."""
    targets = target_columns(target)
    if target_type == "class" and len(targets) > 1:
        raise ValueError(
            f"takes one target column, but dataset.target names {len(targets)} ({quoted(targets)}); "
            'name one, or use target_type = "value" for several value columns'
        )
    return target_type


def target_columns(target: str | list[str]) -> list[str]:
    """The target option as a list of column names."""
    return [target] if isinstance(target, str) else list(target)


def read_header(path: str) -> list[str]:
    """The column names on the first line of the CSV file ``path``; a ValueError saying what is
    wrong when it has none, an unnamed or a repeated column, or is not UTF-8 text."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as file:
            row = next(csv.reader(file), None)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text (byte {error.start}: {error.reason})") from None
    except csv.Error as error:
        raise ValueError(f"cannot read the header line of {path}: {error}") from None
    return _checked_header(row, path)


def _checked_header(row: list[str] | None, path: str) -> list[str]:
    if row is None:
        raise ValueError(f"{path} is empty: its first line must name the columns")
    names = [name.strip() for name in row]
    if not any(names):
        raise ValueError(f"the first line of {path} is blank: it must name the columns")
    for number, name in enumerate(names, 1):
        if not name:
            raise ValueError(f"column {number} of the header of {path} has no name: name every column")
    seen: dict[str, int] = {}
    for number, name in enumerate(names, 1):
        if name in seen:
            raise ValueError(f"the header of {path} names column {name!r} twice (columns {seen[name]} and {number})")
        seen[name] = number
    return names


def refuse_repeats(names: list[str]) -> None:
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"names {quoted(repeated)} more than once")


def _require_columns(names: list[str], path: str) -> None:
    header = read_header(path)
    missing = [name for name in names if name not in header]
    if missing:
        raise ValueError(_missing_columns_message(missing, header, path))


def _missing_columns_message(missing: list[str], header: list[str], path: str) -> str:
    by_lower = {name.lower(): name for name in header}
    parts = []
    for name in missing:
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
        parts.append(f"{name!r} (did you mean {by_lower[close[0]]!r}?)" if close else repr(name))
    message = f"no column {', '.join(parts)} in {path}; its columns: {listing(header)}"
    if len(header) == 1 and any(sep in header[0] for sep in ";\t|"):
        message += " (one column: the file seems to separate its columns by something other than commas)"
    return message


def listing(header: list[str]) -> str:
    shown = ", ".join(header[:LISTED_COLUMNS])
    return shown if len(header) <= LISTED_COLUMNS else f"{shown}, ... ({len(header)} columns)"


def quoted(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)


@dataclass
class Table:
    """A CSV file read whole: its header, its data rows with their 1-based line numbers, and the
    digest of its bytes."""

    path: str
    header: list[str]
    rows: list[tuple[int, list[str]]]
    digest: str

    def numbers(self, columns: list[str]) -> list[list[float]]:
        """The cells of ``columns`` as finite floats, row by row; a DataError names the first bad cell."""
        indices = [self.header.index(name) for name in columns]
        values = []
        for line, cells in self.rows:
            row = []
            for index in indices:
                cell = self.cell(line, cells, index)
                try:
                    number = float(cell)
                except ValueError:
                    number = math.nan
                if not math.isfinite(number):
                    raise DataError(f"{self.where(line, index)}: {cell!r} is not a {_number_kind(cell)}")
                row.append(number)
            values.append(row)
        return values

    def cell(self, line: int, cells: list[str], index: int) -> str:
        """The stripped cell ``index`` of a row; a DataError when it is missing or empty."""
        if index >= len(cells):
            raise DataError(
                f"{self.where(line, index)}: missing (the line has {len(cells)} cells, the header "
                f"{len(self.header)} columns)"
            )
        cell = cells[index].strip()
        if not cell:
            raise DataError(f"{self.where(line, index)}: empty cell")
        return cell

    def where(self, line: int, index: int) -> str:
        return f"{self.path} line {line}, column {self.header[index]!r}"


def _number_kind(cell: str) -> str:
    try:
        float(cell)
    except ValueError:
        return "number"
    return "finite number"  # nan, inf: would poison every weight they reach


def read_table(path: str) -> Table:
    """Every row of the CSV file ``path``; a DataError for text that is not UTF-8 or not CSV, a
    missing header, or a row with more cells than the header has columns."""
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 text (byte {error.start}: {error.reason})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = _checked_header(next(reader, None), path)
    except (ValueError, csv.Error) as error:
        raise DataError(str(error)) from None
    rows = []
    while True:
        line = reader.line_num + 1  # where this row starts (a quoted cell may span lines)
        try:
            cells = next(reader, None)
        except csv.Error as error:
            raise DataError(f"{path} line {line}: not valid CSV ({error})") from None
        if cells is None:
            break
        if not cells:  # a blank line holds no sample
            continue
        if len(cells) > len(header):
            raise DataError(
                f"{path} line {line}: {len(cells)} cells, but the header names {len(header)} columns "
                f"(a stray comma, or a value with a comma that needs quotes?)"
            )
        rows.append((line, cells))
    return Table(path, header, rows, digest)


def class_indices(table: Table, column: str) -> tuple[list[int], list[str]]:
    """Each row's class index in ``column`` and the class names: the distinct values in numeric
    order when they are all numbers (values equal as numbers are one class, named as first
    written), else in string order."""
    index = table.header.index(column)
    cells = [table.cell(line, row, index) for line, row in table.rows]
    numeric: dict[float, str] = {}
    for cell in cells:
        try:
            numeric.setdefault(float(cell), cell)
        except ValueError:
            numeric = {}
            break
    if numeric and all(not math.isnan(value) for value in numeric):
        order = sorted(numeric)
        by_number = {value: i for i, value in enumerate(order)}
        return [by_number[float(cell)] for cell in cells], [numeric[value] for value in order]
    classes = sorted(set(cells))
    by_name = {name: i for i, name in enumerate(classes)}
    return [by_name[cell] for cell in cells], classes


def split_rows(
    count: int, val_fraction: float, test_fraction: float, seed: int, path: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed random split of ``range(count)`` into (train, val, test) index tensors, each in
    file order; a DataError when a split would be empty."""
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    val_count = max(1, round(count * val_fraction))
    test_count = max(1, round(count * test_fraction)) if test_fraction > 0 else 0
    if count - val_count - test_count < 1:
        raise DataError(
            f"{path} holds {count} data row{'' if count == 1 else 's'}: too few for a training and a validation "
            f"split (val_fraction = {val_fraction}, test_fraction = {test_fraction}); at least one row each is needed"
        )
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    val, test, train = order[:val_count], order[val_count : val_count + test_count], order[val_count + test_count :]
    return train.sort().values, val.sort().values, test.sort().values


def standardized(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """``train`` and ``others`` (float64 (N, F) tensors) scaled by train's per-column mean and
    standard deviation (population, ddof 0; 1 for a constant column), as float32."""
    mean, std = feature_scale(train)
    return [((split - mean) / std).float() for split in (train, *others)]


def feature_scale(train: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-column mean and standard deviation (population; 1 for a constant column) that
    :func:`standardized` scales by."""
    mean = train.mean(0)
    std = train.std(0, unbiased=False)
    std = std.where(std > 1e-12 * mean.abs().clamp(min=1.0), 1.0)  # constant up to rounding: centre only
    return mean, std


class CSVInputs(Inputs):
    """Rows of the feature columns the model was trained on, as raw numbers (a target column or
    other columns in the file are ignored), standardized with the training rows' mean and standard
    deviation when the job standardized. They travel in the run's MLflow model, which then takes
    raw rows (a DataFrame with these columns) as ``runjob predict`` takes a CSV file."""

    reads = "csv"

    def __init__(self, features: list[str], mean: list[float] | None, std: list[float] | None) -> None:
        self.features = list(features)
        for name, scale in (("mean", mean), ("std", std)):  # a run's predictor is data: checked when rebuilt
            if scale is not None and len(scale) != len(self.features):
                raise ValueError(f"{len(scale)} {name} value(s) for {len(self.features)} feature column(s)")
        self.mean, self.std = mean, std  # float64 values as Python floats: plain JSON values, exact
        self.columns = {name: "double" for name in self.features}

    def read(self, path: Path) -> list[tuple[str, dict[str, float]]]:
        """A CSV file's rows, named ``line N`` (the header is line 1)."""
        path = Path(path)
        if not path.is_file():
            what = "no such file" if not path.exists() else "a folder"
            raise DataError(
                f"--input {path}: {what}; the csv dataset reads a CSV file with the columns {listing(self.features)}"
            )
        [path] = self.files(path)  # a binary file is refused here, before it is parsed as CSV
        table = read_table(str(path))
        absent = [name for name in self.features if name not in table.header]
        if absent:
            raise DataError(_missing_columns_message(absent, table.header, str(path)))
        if not table.rows:
            raise DataError(f"--input {path} holds no data rows, only the header line")
        rows = table.numbers(self.features)
        return [
            (f"line {line}", dict(zip(self.features, row, strict=True)))
            for (line, _), row in zip(table.rows, rows, strict=True)
        ]

    def encode(self, record: dict[str, float]) -> torch.Tensor:
        """The features in training order as float32, scaled in float64 as the training rows were."""
        import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

        absent = [name for name in self.features if name not in record]
        if absent:
            raise ValueError(f"missing feature column(s) {quoted(absent)}; the model takes {listing(self.features)}")
        try:
            values = [float(record[name]) for name in self.features]
        except (TypeError, ValueError):
            bad = next(name for name in self.features if not _is_number(record[name]))
            raise ValueError(f"column {bad!r}: {record[bad]!r} is not a number") from None
        if not all(math.isfinite(value) for value in values):
            bad = next(name for name, value in zip(self.features, values, strict=True) if not math.isfinite(value))
            raise ValueError(f"column {bad!r}: {record[bad]!r} is not a finite number")
        row = torch.tensor(values, dtype=torch.float64)
        if self.mean is not None and self.std is not None:
            row = (row - torch.tensor(self.mean, dtype=torch.float64)) / torch.tensor(self.std, dtype=torch.float64)
        return row.float()


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]  # any value: float() says whether it is a number
    except (TypeError, ValueError):
        return False
    return True


def _baselines(
    targets: torch.Tensor, train_idx: torch.Tensor, val_idx: torch.Tensor, target_type: str
) -> dict[str, float]:
    """What a model that ignores the features scores on the validation rows: the training mean
    (values) or the most frequent training class."""
    import torch  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    val = targets[val_idx]
    if target_type == "class":
        majority = torch.bincount(targets[train_idx]).argmax()
        return {"majority_class_val_accuracy": float((val == majority).double().mean())}
    error = val.double() - targets[train_idx].double().mean(0)
    return {
        "mean_predictor_val_mae": float(error.abs().mean()),
        "mean_predictor_val_rmse": float(error.pow(2).mean().sqrt()),
    }


def build_csv(options: CSVOptions) -> DatasetSplits:
    """The file's rows as ``(features, target)`` TensorDatasets, split and standardized."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torch
    import torch
    from torch.utils.data import TensorDataset

    table = read_table(options.path)
    targets_named = target_columns(options.target)
    features_named = options.features or [name for name in table.header if name not in targets_named]
    absent = [name for name in targets_named + features_named if name not in table.header]
    if absent:  # the file changed since the job was checked
        raise DataError(_missing_columns_message(absent, table.header, options.path))
    if not table.rows:
        raise DataError(f"{options.path} holds no data rows, only the header line")

    features = torch.tensor(table.numbers(features_named), dtype=torch.float64)
    num_classes = classes = None
    if options.target_type == "class":
        indices, classes = class_indices(table, targets_named[0])
        if len(classes) < 2:
            raise DataError(
                f"{options.path}: column {targets_named[0]!r} holds one value ({classes[0]!r}); "
                'target_type = "class" needs at least two classes'
            )
        targets = torch.tensor(indices, dtype=torch.int64)
        num_classes = len(classes)
    else:
        targets = torch.tensor(table.numbers(targets_named), dtype=torch.float32)
        if isinstance(options.target, str):
            targets = targets[:, 0]

    train_idx, val_idx, test_idx = split_rows(
        len(table.rows), options.val_fraction, options.test_fraction, options.split_seed, options.path
    )
    parts = [features[train_idx], features[val_idx], features[test_idx]]
    scale = feature_scale(parts[0]) if options.standardize else None
    parts = standardized(*parts) if options.standardize else [part.float() for part in parts]
    train, val, test = (
        TensorDataset(part, targets[idx]) for part, idx in zip(parts, (train_idx, val_idx, test_idx), strict=True)
    )
    return DatasetSplits(
        train=train,
        val=val,
        test=test if len(test_idx) else None,
        num_classes=num_classes,
        classes=classes,
        source=str(Path(options.path).resolve()),
        digest=table.digest,
        baselines=_baselines(targets, train_idx, val_idx, options.target_type),
        inputs=CSVInputs(features_named, *([part.tolist() for part in scale] if scale else [None, None])),
    )


@hookimpl
def runjob_register_inputs(register: Register) -> None:
    """Register csv_rows (the csv dataset's inputs, kept by a run as its feature names and scale)."""
    register("csv_rows", CSVInputs, description="rows of a CSV's feature columns, standardized as in training")


@hookimpl
def runjob_register_datasets(register: Register) -> None:
    """Register csv."""
    register(
        "csv",
        build_csv,
        options=CSVOptions,
        description="a CSV file with a header row: numeric features, value or class targets",
    )
