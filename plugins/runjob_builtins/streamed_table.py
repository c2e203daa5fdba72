"""Built-in converter ``table`` and dataset ``streamed_table``: the rows of a CSV file, a Parquet
file or a folder of Parquet files converted to shards (``runjob data convert SOURCE LOCATION --from
table``) and streamed from ``s3://``, ``gs://`` or a local folder of shards, each row the sample the
``csv`` dataset makes of it. Needs the stream extra (``pip install 'runjob-train[stream]'``).

The converter splits the rows as the ``csv`` dataset does (``-o val_fraction=0.2``, ``-o
test_fraction=0``, ``-o split_seed=0``: the same rows are held out for the same options) and writes
each row as ``{"id": row index in the source, "numbers": float64 array, "texts": list of str}``: the
cells of the numeric columns (every cell a finite number) in one array, the others' cells (stripped)
as text. ``runjob.json`` names the columns, which are numeric, each numeric column's training-row
mean and standard deviation (what ``csv`` standardizes a feature with), the classes of each column of
at most :data:`CLASS_LIMIT` distinct values (ordered as ``csv`` orders a class target's) and the
mean-predictor and majority-class baselines per column: the streamed dataset picks its target and
features when a run builds it, and refuses a column the conversion lacks or holds as text there.

```toml
[dataset]
name = "streamed_table"
location = "s3://bucket/tables/diabetes"   # written by `runjob data convert diabetes.csv ... --from table`
target = "target"                          # or a list of columns: ["y1", "y2"]
# features = ["age", "bmi"]                # default: every column but the target(s)
# target_type = "value"                    # or "class"
# standardize = true
```

A Parquet column's values are read as the CSV text that writes them (floats exactly, nulls as empty
cells); a folder's ``*.parquet`` files are read in sorted name order, one table, and must have the
same columns. The table is read whole into memory, as the ``csv`` dataset reads it."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runjob import DataError, DatasetSplits, Options, ShardSource, Streamed, StreamOptions, hookimpl, require_module
from runjob_builtins.tabular import (
    CSVInputs,
    Table,
    class_indices,
    feature_scale,
    listing,
    one_class_column,
    quoted,
    read_table,
    refuse_repeats,
    room_for_training,
    split_rows,
    target_columns,
)

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch, numpy or pyarrow
    import random

    import numpy as np
    import torch

    from runjob import Register

CLASS_LIMIT = 1000
"""The most distinct values a column may hold for the conversion to record them as classes."""
PARQUET_SUFFIXES = (".parquet", ".pq")
PARQUET_MAGIC = b"PAR1"
SPLITS = ("train", "val", "test")
WHAT = "a CSV file (comma-separated, UTF-8, a header line), a Parquet file or a folder of Parquet files"


class TableOptions(Options):
    """``runjob data convert SOURCE LOCATION --from table -o KEY=VALUE``: the ``csv`` dataset's split."""

    val_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of the rows held out for validation."""
    test_fraction: float = Field(0.0, ge=0, lt=1)
    """Share of the rows held out as a test split (0: none)."""
    split_seed: int = Field(0, ge=0)
    """Seed of the random split of the rows: the csv dataset's split for the same file and options."""

    @field_validator("test_fraction")
    @classmethod
    def _room_for_training(cls, test_fraction: float, info: ValidationInfo) -> float:
        return room_for_training(info.data.get("val_fraction"), test_fraction)


# reading the source


@dataclass
class ParquetTable(Table):
    """Parquet files' rows as the CSV cells that write them; ``rows`` numbered from 0 across the
    files, ``starts`` the first row of each file, so a message names the file and its row."""

    starts: tuple[tuple[int, str], ...] = ()

    def where(self, line: int, index: int) -> str:
        start, path = next((start, path) for start, path in reversed(self.starts) if start <= line)
        return f"{path} row {line - start}, column {self.header[index]!r}"


def read_source(source: str) -> Table:
    """The rows of a CSV file, a Parquet file or a folder of Parquet files (sorted by name)."""
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in PARQUET_SUFFIXES)
        if not files:
            raise DataError(f"{source}: a folder without .parquet files; the table converter reads {WHAT}")
        return read_parquet(files, str(path.resolve()))
    if not path.is_file():
        raise DataError(f"{source}: no such file or folder; the table converter reads {WHAT}")
    with path.open("rb") as file:
        head = file.read(8192)
    if head.startswith(PARQUET_MAGIC):
        return read_parquet([path], str(path.resolve()))
    if path.suffix.lower() in PARQUET_SUFFIXES or b"\0" in head:
        raise DataError(f"{source} is neither CSV text nor a Parquet file; the table converter reads {WHAT}")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not a character cut at the end of what was read
            raise DataError(
                f"{source} is neither CSV text (byte {error.start} is not UTF-8) nor a Parquet file; "
                f"the table converter reads {WHAT}"
            ) from None
    return read_table(str(path.resolve()))


def read_parquet(files: list[Path], source: str) -> ParquetTable:
    """Parquet files' rows, one table, each value as the CSV text that writes it."""
    require_module("pyarrow", "stream", "converter 'table' (Parquet)")
    # lazy: plugin modules are imported by `runjob validate`; pyarrow only for a Parquet source
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow has no type information

    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    starts: list[tuple[int, str]] = []
    digest = hashlib.sha256()
    for path in files:
        try:
            table = pq.read_table(path)
        except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds for a file it cannot read
            raise DataError(f"{path}: not a Parquet file pyarrow reads ({type(error).__name__}: {error})") from None
        names = [str(name).strip() for name in table.column_names]
        if header is None:
            header = _parquet_header(names, path)
        elif names != header:
            raise DataError(
                f"{path}: its columns ({listing(names)}) are not those of {files[0].name} ({listing(header)}): "
                "the files of a folder are one table"
            )
        starts.append((len(rows), str(path)))
        columns = [[_cell(value) for value in column.to_pylist()] for column in table.columns]
        rows.extend((len(rows) + i, list(cells)) for i, cells in enumerate(zip(*columns, strict=True)))
        digest.update(path.read_bytes())
    assert header is not None  # files is not empty
    return ParquetTable(source, header, rows, digest.hexdigest()[:16], tuple(starts))


def _parquet_header(names: list[str], path: Path) -> list[str]:
    for number, name in enumerate(names, 1):
        if not name:
            raise DataError(f"{path}: column {number} has no name: name every column")
        if names.index(name) != number - 1:
            raise DataError(f"{path} names column {name!r} twice (columns {names.index(name) + 1} and {number})")
    return names


def _cell(value: object) -> str:
    """A Parquet value as the CSV cell that writes it: a float exactly, a null empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


# what the conversion records


@dataclass
class Rows:
    """A table's cells by kind: the numeric columns' as one float64 matrix, the others' as text."""

    header: list[str]
    numeric: list[str]
    numbers: np.ndarray
    text: list[str]
    texts: list[list[str]]
    """Row by row, the text columns' cells."""
    not_numeric: dict[str, str]
    """Each text column's first cell that is not a finite number, as the csv dataset reports it."""


def sort_columns(table: Table) -> Rows:
    """Which columns hold a finite number in every cell (their cells as floats, as ``csv`` reads
    them) and which do not (their cells as stripped text, an empty string for a missing cell)."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load numpy
    import numpy as np

    numeric, numbers, text, columns, not_numeric = [], [], [], [], {}
    for index, name in enumerate(table.header):
        try:
            numbers.append([row[0] for row in table.numbers([name])])
            numeric.append(name)
        except DataError as error:  # where in the source, relative to it (the digest is of content, not of places)
            not_numeric[name] = _relative(table, error)
            text.append(name)
            columns.append([cells[index].strip() if index < len(cells) else "" for _, cells in table.rows])
    matrix = np.array(numbers, dtype=np.float64).T.copy() if numbers else np.zeros((len(table.rows), 0))
    texts = [list(cells) for cells in zip(*columns, strict=True)] if columns else [[] for _ in table.rows]
    return Rows(table.header, numeric, matrix, text, texts, not_numeric)


def table_facts(table: Table, rows: Rows, train: torch.Tensor, val: torch.Tensor) -> dict[str, Any]:
    """What the streamed dataset needs to pick its target and features among the columns and to
    give ``csv``'s samples, scale and baselines: the training rows' mean and standard deviation of
    each numeric column, each column's classes when it has few, the baselines per column."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load torch
    import torch

    scale, baselines = {}, {}
    for j, name in enumerate(rows.numeric):
        column = torch.from_numpy(rows.numbers[:, j].copy())
        mean, std = feature_scale(column[train].unsqueeze(1))
        scale[name] = [float(mean[0]), float(std[0])]
        target = column.float()  # csv's value targets are float32
        error = target[val].double() - target[train].double().mean(0)
        baselines[name] = {"val_mae": float(error.abs().mean()), "val_mse": float(error.pow(2).mean())}
    classes, not_classes = {}, {}
    for index, name in enumerate(table.header):
        distinct = {cells[index].strip() for _, cells in table.rows if index < len(cells)}
        if len(distinct) > CLASS_LIMIT:
            not_classes[name] = f"more than {CLASS_LIMIT} distinct values"
            continue
        try:
            indices, names = class_indices(table, name)
        except DataError as error:  # an empty or missing cell
            not_classes[name] = _relative(table, error)
            continue
        targets = torch.tensor(indices, dtype=torch.int64)
        majority = torch.bincount(targets[train]).argmax()
        classes[name] = {
            "names": names,
            "numeric": _numeric_classes(names),
            "majority_class_val_accuracy": float((targets[val] == majority).double().mean()),
        }
    return {
        "columns": rows.header,
        "numeric": rows.numeric,
        "text": rows.text,
        "not_numeric": rows.not_numeric,
        "rows": len(table.rows),
        "scale": scale,
        "baselines": baselines,
        "classes": classes,
        "not_classes": not_classes,
    }


def _relative(table: Table, error: DataError) -> str:
    """A cell's message without the source's path (the digest is of the content, not of where it lies)."""
    return str(error).removeprefix(f"{table.path} ").removeprefix(f"{table.path}/")


def _numeric_classes(names: list[str]) -> bool:
    """Whether ``class_indices`` ordered these classes as numbers (every one a number, none nan)."""
    try:
        return all(not math.isnan(float(name)) for name in names)
    except ValueError:
        return False


def split_digest(rows: Rows, ids: list[int]) -> str:
    """A digest of a split's rows: the columns, and each row's id, numbers (float64) and text cells."""
    digest = hashlib.sha256(json.dumps([rows.header, rows.numeric, rows.text]).encode())
    for i in ids:
        digest.update(i.to_bytes(8, "little") + rows.numbers[i].tobytes())
        digest.update(json.dumps(rows.texts[i]).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class TableRow:
    """One row of a table, as the conversion hands it to its worker processes."""

    id: int
    numbers: np.ndarray
    texts: list[str]


def table_record(item: TableRow) -> dict[str, Any]:
    """The record of one row (run in the conversion's worker processes)."""
    return {"id": item.id, "numbers": item.numbers, "texts": item.texts}


def convert_table(source: str, options: Options) -> ShardSource:
    """A table's rows, split as the ``csv`` dataset splits them (``runjob data convert SOURCE
    LOCATION --from table``)."""
    assert isinstance(options, TableOptions)
    table = read_source(str(source))
    if not table.rows:
        raise DataError(f"{table.path} holds no data rows, only the header")
    rows = sort_columns(table)
    train, val, test = split_rows(
        len(table.rows), options.val_fraction, options.test_fraction, options.split_seed, table.path
    )
    ids = {"train": train.tolist(), "val": val.tolist(), "test": test.tolist()}
    ids = {split: found for split, found in ids.items() if found}
    text_bytes = [sum(len(cell) + 8 for cell in cells) for cells in rows.texts]
    return ShardSource(
        splits={
            split: [TableRow(i, rows.numbers[i].copy(), rows.texts[i]) for i in found] for split, found in ids.items()
        },
        record=table_record,
        digests={split: split_digest(rows, found) for split, found in ids.items()},
        source=table.path,
        facts={
            "table_format": "parquet" if isinstance(table, ParquetTable) else "csv",
            **table_facts(table, rows, train, val),
            "split": options.model_dump(),
        },
        sizes={
            split: sum(16 + rows.numbers.shape[1] * 8 + text_bytes[i] for i in found) for split, found in ids.items()
        },
    )


# the streamed dataset


class StreamedTableOptions(StreamOptions):
    target: str | list[str]
    """The target column, or a list of target columns (then the targets are (N, k), even for one)."""
    features: list[str] | None = None
    """The feature columns, in this order; by default every column but the target(s), in the source's order."""
    target_type: Literal["value", "class"] = "value"
    """"value": float targets (regression); "class": one column whose distinct values are the classes."""
    standardize: bool = True
    """Scale each feature to mean 0 and standard deviation 1 over the training rows (a constant
    column is only centred), as the csv dataset does."""

    @field_validator("target")
    @classmethod
    def _some_target(cls, target: str | list[str]) -> str | list[str]:
        names = target_columns(target)
        if not names:
            raise ValueError("names no column: give at least one target column")
        refuse_repeats(names)
        return target

    @field_validator("features")
    @classmethod
    def _some_features(cls, features: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if features is None:
            return None
        if not features:
            raise ValueError("names no column: list at least one, or leave features out to use every other column")
        refuse_repeats(features)
        both = [name for name in features if name in target_columns(info.data.get("target", []))]
        if both:
            raise ValueError(f"{quoted(both)} is also the target (dataset.target): a column is one or the other")
        return features

    @field_validator("target_type")
    @classmethod
    def _one_class_column(cls, target_type: str, info: ValidationInfo) -> str:
        return one_class_column(target_type, info.data.get("target", []))

    @model_validator(mode="after")
    def _needs_litdata(self) -> StreamedTableOptions:
        require_module("litdata", "stream", "dataset 'streamed_table'")
        return self


@dataclass(frozen=True)
class ClassColumn:
    """A class target: where its cell is in a record (``numbers`` or ``texts``, and the place
    there) and each class's index by its value (a float when the classes are numbers)."""

    kind: str
    place: int
    numeric: bool
    by_value: dict[Any, int]

    def index(self, record: dict[str, Any]) -> int:
        value = record[self.kind][self.place]
        try:
            return self.by_value[float(value) if self.numeric else value]
        except (KeyError, ValueError):
            raise DataError(f"sample {record.get('id')}: {value!r} is none of the conversion's classes") from None


class TableRecords:
    """A stored row as the csv dataset's sample: ``(features, target)``, the features float32
    ``(F,)`` (scaled in float64 by the training rows' mean and std when given), the target a float32
    value (``()``, or ``(k,)`` for a list of columns) or an int64 class index."""

    def __init__(
        self,
        features: list[int],
        mean: list[float] | None,
        std: list[float] | None,
        values: list[int] | None,
        one_value: bool,
        classes: ClassColumn | None,
    ) -> None:
        self.features, self.mean, self.std = features, mean, std
        self.values, self.one_value = values, one_value
        self.classes = classes

    def __call__(self, record: dict[str, Any], draw: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
        # lazy: plugin modules are imported by `runjob validate`, which must not load torch
        import torch

        numbers = torch.from_numpy(record["numbers"])
        x = numbers[self.features]
        if self.mean is not None and self.std is not None:
            x = (x - torch.tensor(self.mean, dtype=torch.float64)) / torch.tensor(self.std, dtype=torch.float64)
        if self.classes is None:
            y = numbers[self.values].float()
            return x.float(), y[0] if self.one_value else y
        return x.float(), torch.tensor(self.classes.index(record), dtype=torch.int64)


def build_streamed_table(options: StreamedTableOptions) -> DatasetSplits:
    """The location's converted table, streamed: the csv dataset's samples of its rows."""
    # lazy: plugin modules are imported by `runjob validate`, which reads no store
    from runjob import stream_manifest

    manifest = stream_manifest(options)
    where = f"dataset.location = {options.location!r}"
    if manifest.get("kind") != "table":
        raise DataError(
            f"{where} holds {manifest.get('kind')!r} shards, not a table: give the location of a table's conversion "
            "(`runjob data convert FILE.csv LOCATION --from table`)"
        )
    splits = manifest["splits"]
    if "val" not in splits:
        raise DataError(f"{where}: the conversion has no val split")
    header = [str(name) for name in manifest["columns"]]
    numeric = [str(name) for name in manifest["numeric"]]
    targets = target_columns(options.target)
    for option, named in (("target", targets), ("features", options.features or [])):
        absent = [name for name in named if name not in header]
        if absent:
            raise DataError(
                f"dataset.{option}: {_absent(absent, header)} in {options.location}; its columns: {listing(header)}"
            )
    features = options.features or [name for name in header if name not in targets]
    if not features:
        raise DataError(f"dataset.features: no feature columns left: every column of {options.location} is a target")
    texts = [name for name in features if name not in numeric]
    if texts:
        default = "" if options.features else " (by default every column but the target)"
        raise DataError(
            f"dataset.features{default}: column {texts[0]!r} of {options.location} is not numeric "
            f"({_first_text(manifest, texts[0])}); its numeric columns: {listing(numeric) or 'none'}"
        )
    classes: ClassColumn | None = None
    names: list[str] | None = None
    values: list[int] | None = None
    if options.target_type == "class":
        classes, names = _class_column(manifest, targets[0], options.location)
        baselines = {
            "majority_class_val_accuracy": float(manifest["classes"][targets[0]]["majority_class_val_accuracy"])
        }
    else:
        absent = [name for name in targets if name not in numeric]
        if absent:
            raise DataError(
                f"dataset.target: column {absent[0]!r} of {options.location} is not numeric "
                f"({_first_text(manifest, absent[0])}); "
                'a value target is a numeric column (target_type = "class" takes a column of classes)'
            )
        values = [numeric.index(name) for name in targets]
        each = [manifest["baselines"][name] for name in targets]
        baselines = {
            "mean_predictor_val_mae": sum(float(b["val_mae"]) for b in each) / len(each),
            "mean_predictor_val_rmse": math.sqrt(sum(float(b["val_mse"]) for b in each) / len(each)),
        }
    mean = [float(manifest["scale"][name][0]) for name in features] if options.standardize else None
    std = [float(manifest["scale"][name][1]) for name in features] if options.standardize else None
    transform = TableRecords(
        [numeric.index(name) for name in features], mean, std, values, isinstance(options.target, str), classes
    )

    def split(name: str) -> Streamed:
        info = splits[name]
        return Streamed(options, name, transform, int(info["samples"]), str(info["digest"]))

    return DatasetSplits(
        train=split("train"),
        val=split("val"),
        test=split("test") if "test" in splits else None,
        num_classes=len(names) if names else None,
        classes=names,
        source=options.where.url(),
        digest=str(manifest["source_digest"])[:16],
        baselines=baselines,
        inputs=CSVInputs(features, mean, std),
    )


def _class_column(manifest: dict[str, Any], column: str, location: str) -> tuple[ClassColumn, list[str]]:
    """Where a class target's cells are in the records, and its classes, from the conversion's facts."""
    found = manifest["classes"].get(column)
    if found is None:
        why = manifest["not_classes"].get(column, "no classes recorded")
        raise DataError(
            f"dataset.target: column {column!r} of {location} holds no classes (in {manifest.get('source')}: {why})"
        )
    names = [str(name) for name in found["names"]]
    if len(names) < 2:
        raise DataError(
            f"{location}: column {column!r} holds one value ({names[0]!r}); "
            'target_type = "class" needs at least two classes'
        )
    numeric = bool(found["numeric"])
    by_value = {(float(name) if numeric else name): i for i, name in enumerate(names)}
    if column in manifest["numeric"]:
        return ClassColumn("numbers", list(manifest["numeric"]).index(column), numeric, by_value), names
    return ClassColumn("texts", list(manifest["text"]).index(column), numeric, by_value), names


def _first_text(manifest: dict[str, Any], column: str) -> str:
    """Where the conversion found a cell of ``column`` that is not a number."""
    return f"in {manifest.get('source')}: {manifest['not_numeric'].get(column, 'text')}"


def _absent(missing: list[str], header: list[str]) -> str:
    by_lower = {name.lower(): name for name in header}
    parts = []
    for name in missing:
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
        parts.append(f"{name!r} (did you mean {by_lower[close[0]]!r}?)" if close else repr(name))
    return f"no column {', '.join(parts)}"


@hookimpl
def runjob_register_converters(register: Register) -> None:
    """Register table."""
    register(
        "table",
        convert_table,
        options=TableOptions,
        description="a CSV file, a Parquet file or a folder of Parquet files: each row, split as the csv dataset does",
    )


@hookimpl
def runjob_register_datasets(register: Register) -> None:
    """Register streamed_table."""
    register(
        "streamed_table",
        build_streamed_table,
        options=StreamedTableOptions,
        description="a table converted by `runjob data convert --from table`, streamed from s3://, gs:// or a folder",
    )
