"""Tables streamed: a CSV or Parquet table converted by `runjob data convert --from table` and read
back by the `streamed_table` dataset gives the `csv` dataset's samples, split, scale, classes and
baselines for the same file and options; mistakes are one line naming the column or option."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from test_streaming import convert, loader

pytest.importorskip("litdata")

FEATURES = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    """Downloaded shards in the test's folder, never the user's ~/.cache."""
    monkeypatch.setenv("RUNJOB_CACHE_DIR", str(tmp_path / "stream-cache"))


def diabetes_columns() -> dict[str, list]:
    """scikit-learn's diabetes table (442 rows, raw features) and a text column ``band`` of the target."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes(scaled=False)
    columns: dict[str, list] = {name: data.data[:, j].tolist() for j, name in enumerate(data.feature_names)}
    columns["target"] = data.target.tolist()
    columns["band"] = ["low" if y < 100 else "mid" if y < 200 else "high" for y in columns["target"]]
    return columns


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    columns = diabetes_columns()
    path = tmp_path_factory.mktemp("table") / "diabetes.csv"
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(list(columns))
        writer.writerows(zip(*columns.values(), strict=True))
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory, table) -> Path:
    folder = tmp_path_factory.mktemp("shards") / "diabetes"
    convert(table, str(folder), "--from", "table", "-o", "test_fraction=0.1", "-o", "split_seed=3")
    return folder


SPLIT = {"test_fraction": 0.1, "split_seed": 3}


def csv_dataset(path: Path, **options):
    from runjob_builtins.tabular import CSVOptions, build_csv

    return build_csv(CSVOptions(path=str(path), **SPLIT, **options))


def streamed_dataset(location: Path, **options):
    from runjob_builtins.streamed_table import StreamedTableOptions, build_streamed_table

    return build_streamed_table(StreamedTableOptions(location=str(location), **options))


def rows(split) -> Counter:
    """A TensorDataset's samples as (features bytes, target bytes)."""
    features, targets = split.tensors
    return Counter((x.numpy().tobytes(), y.numpy().tobytes()) for x, y in zip(features, targets, strict=True))


def streamed_rows(streamed, training: bool) -> Counter:
    """One epoch of a streamed split, as :func:`rows` writes samples (their dtypes too)."""
    stream = loader(streamed, workers=1, batch_size=100, training=training)
    stream.set_epoch(0)
    found: Counter = Counter()
    for inputs, targets in stream:
        assert inputs.dtype.is_floating_point and inputs.element_size() == 4
        valid = stream.valid.tolist()
        found.update(
            (x.numpy().tobytes(), y.numpy().tobytes()) for x, y, v in zip(inputs, targets, valid, strict=True) if v
        )
    return found


@pytest.mark.parametrize(
    ("target", "target_type"),
    [
        pytest.param("target", "value", id="value"),
        pytest.param(["target", "bp"], "value", id="two-values", marks=pytest.mark.slow),
        pytest.param("band", "class", id="text-classes"),
        pytest.param("sex", "class", id="number-classes", marks=pytest.mark.slow),
    ],
)
def test_streamed_rows_are_the_csv_datasets_samples(table, shards, target, target_type):
    features = [name for name in FEATURES if name not in target]
    expected = csv_dataset(table, target=target, features=features, target_type=target_type)
    streamed = streamed_dataset(shards, target=target, features=features, target_type=target_type)
    assert (len(streamed.train), len(streamed.val), len(streamed.test)) == (310, 88, 44)
    assert streamed_rows(streamed.train, training=True) == rows(expected.train)
    assert streamed_rows(streamed.val, training=False) == rows(expected.val)
    assert (streamed.num_classes, streamed.classes) == (expected.num_classes, expected.classes)
    assert streamed.baselines == pytest.approx(expected.baselines, rel=1e-12)
    assert streamed.inputs.features == expected.inputs.features == features
    assert streamed.inputs.mean == pytest.approx(expected.inputs.mean, rel=1e-14)
    assert streamed.inputs.std == pytest.approx(expected.inputs.std, rel=1e-14)


def test_a_parquet_folder_converts_to_the_csv_files_rows(tmp_path, table, shards):
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = diabetes_columns()
    (tmp_path / "parts").mkdir()
    for name, rows_ in (("part-0.parquet", slice(0, 200)), ("part-1.parquet", slice(200, None))):
        pq.write_table(pa.table({key: values[rows_] for key, values in columns.items()}), tmp_path / "parts" / name)
    convert(
        tmp_path / "parts",
        str(tmp_path / "from-parquet"),
        "--from",
        "table",
        "-o",
        "test_fraction=0.1",
        "-o",
        "split_seed=3",
    )
    from_parquet = json.loads((tmp_path / "from-parquet" / "runjob.json").read_text())
    from_csv = json.loads((shards / "runjob.json").read_text())
    assert from_parquet["table_format"] == "parquet" and from_csv["table_format"] == "csv"
    assert from_parquet["splits"] == from_csv["splits"]  # the same rows in each split, the same digests
    for key in ("columns", "numeric", "scale", "baselines", "classes"):
        assert from_parquet[key] == from_csv[key], key
    streamed = streamed_dataset(tmp_path / "from-parquet", target="band", features=FEATURES, target_type="class")
    expected = csv_dataset(table, target="band", features=FEATURES, target_type="class")
    assert streamed_rows(streamed.val, training=False) == rows(expected.val)


def test_columns_a_job_cannot_use_are_one_line_naming_the_column(shards):
    from runjob.errors import DataError

    where = str(shards)
    cases = [
        ({"target": "targte"}, f"dataset.target: no column 'targte' (did you mean 'target'?) in {where}; its columns:"),
        (
            {"target": "target", "features": ["age", "BMI"]},
            "dataset.features: no column 'BMI' (did you mean 'bmi'?)",
        ),
        (
            {"target": "target"},  # every other column: band is text
            f"dataset.features (by default every column but the target): column 'band' of {where} is not numeric (",
        ),
        ({"target": "band", "features": FEATURES}, "dataset.target: column 'band' of"),
    ]
    for options, message in cases:
        with pytest.raises(DataError) as error:
            streamed_dataset(shards, **options)
        assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
    with pytest.raises(DataError, match=r"line 2, column 'band': 'mid' is not a number\); its numeric columns: age"):
        streamed_dataset(shards, target="target")


def test_bad_sources_and_options_stop_the_conversion_in_one_line(tmp_path, table, capsys):
    from pydantic import ValidationError

    from runjob.commands.cli import main
    from runjob.errors import DataError
    from runjob_builtins.streamed_table import TableOptions, convert_table

    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(64))
    cases = [
        ((table, "-o", "val_fraction=2"), "-o val_fraction = 2: Input should be less than 1"),
        ((tmp_path / "image.png",), "image.png is neither CSV text nor a Parquet file"),
    ]
    for (source, *options), message in cases:
        code = main(["data", "convert", str(source), str(tmp_path / "out"), "--from", "table", *options])
        error = capsys.readouterr().err
        assert code == 2 and message in error and len(error.strip().splitlines()) == 1, error
        assert not (tmp_path / "out").exists()
    with pytest.raises(ValidationError, match=r"val_fraction \+ test_fraction must be below 1"):
        TableOptions(val_fraction=0.6, test_fraction=0.5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="a folder without .parquet files; the table converter reads a CSV file"):
        convert_table(str(tmp_path / "empty"), TableOptions())


@pytest.mark.slow
def test_a_job_trains_on_a_streamed_table_and_predicts_from_a_csv(tester, table, shards):
    tester.write_job(
        "job.toml",
        f"""
        [job]
        name = "streamed-table"
        [task]
        name = "regression"
        loss = "mse"
        [model]
        name = "mlp"
        hidden = [16]
        [dataset]
        name = "streamed_table"
        location = "{shards}"
        target = "target"
        features = {json.dumps(FEATURES)}
        [optimizer]
        name = "adamw"
        lr = 0.03
        [train]
        epochs = 2
        batch_size = 32
        """,
    )
    run = tester.run("job.toml", "tracking.system_metrics_interval=0", "tracking.log_model=none")
    assert run.status == "FINISHED"
    expected = csv_dataset(table, target="target", features=FEATURES).baselines
    assert float(run.tags["runjob.baseline.mean_predictor_val_mae"]) == pytest.approx(
        expected["mean_predictor_val_mae"]
    )
    assert {"val/mae", "test/mae"} <= set(run.metrics)
    result = tester.cli("predict", run.output_dir, "--input", table)
    assert result.returncode == 0, result.stderr
    predicted = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(predicted) == 442 and predicted[0]["input"] == "line 2"
