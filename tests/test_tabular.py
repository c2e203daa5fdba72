"""The ``csv`` dataset: header problems reported by ``runjob validate`` against the job file, bad
cells named by file, line and column, the split, standardization fitted on the training rows only,
class and value targets."""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from runjob.errors import DataError
from runjob_builtins.tabular import CSVOptions, build_csv

SMALL = "age,bmi,label,y\n" + "".join(f"{20 + i},{18 + (i * 7) % 11}.5,{'ab'[i % 2]},{i}\n" for i in range(20))
"""20 rows: two numeric features, a text column and a target y holding the row number (0-19)."""


def write_csv(folder: Path, text: str, name: str = "table.csv") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def build(path: Path, **options) -> object:
    return build_csv(CSVOptions.model_validate({"path": str(path), **options}))


def rows_of(split) -> list[int]:
    """The row numbers (the target y of SMALL) a split holds, in order."""
    return [int(y) for y in split.tensors[1].tolist()]


# runjob validate: the header is checked against the job, each problem at its key's line

JOB = """
    [model]
    name = "resnet18"
    [dataset]
    name = "csv"
    path = "table.csv"
    {dataset}
"""


@pytest.mark.parametrize(
    ("csv_text", "dataset", "expected"),
    [
        (
            SMALL,
            'target = "y"\nfeatures = ["age", "bmii"]',
            "job.toml:7: dataset.features: no column 'bmii' (did you mean 'bmi'?) in {path}; its columns: age, bmi, "
            "label, y (got ['age', 'bmii'])",
        ),
        (
            SMALL,
            'target = "Y"',
            "job.toml:6: dataset.target: no column 'Y' (did you mean 'y'?) in {path}; its columns: age, bmi, label, y",
        ),
        (
            SMALL,
            'target = "y"\nfeatures = ["age", "y"]',
            "job.toml:7: dataset.features: 'y' is also the target (dataset.target): a column is one or the other",
        ),
        (
            SMALL,
            'target = ["y", "age"]\ntarget_type = "class"',
            "job.toml:7: dataset.target_type: takes one target column, but dataset.target names 2 ('y', 'age')",
        ),
        ("y\n1\n2\n", 'target = "y"', "job.toml:3: dataset.features: no feature columns left: every column of {path}"),
        ("", 'target = "y"', "job.toml:5: dataset.path: {path} is empty: its first line must name the columns"),
        ("a,,b\n1,2,3\n", 'target = "a"', "job.toml:5: dataset.path: column 2 of the header of {path} has no name"),
    ],
    ids=["feature-typo", "target-case", "target-as-feature", "class-two-targets", "no-features", "empty", "unnamed"],
)
def test_validate_names_header_problems_with_file_and_line(runjob_tester, csv_text, dataset, expected):
    path = write_csv(runjob_tester.path, csv_text)
    runjob_tester.write_job("job.toml", JOB.format(dataset=dataset.replace("\n", "\n    ")))
    result = runjob_tester.cli("validate", "job.toml")
    assert result.returncode == 2
    assert f"runjob: {expected.format(path=path)}" in result.stderr
    assert "Traceback" not in result.stderr


def test_semicolon_file_gets_a_hint(tmp_path):
    path = write_csv(tmp_path, "age;bmi;y\n1;2;3\n")
    with pytest.raises(ValueError, match="separate its columns by something other than commas"):
        CSVOptions.model_validate({"path": str(path), "target": "y"})


def test_features_default_to_every_other_column_in_file_order(tmp_path):
    path = write_csv(tmp_path, SMALL)
    options = CSVOptions.model_validate({"path": str(path), "target": "label", "target_type": "class"})
    assert options.features == ["age", "bmi", "y"]  # filled in: the resolved job records what was used


def test_options_are_checked_without_torch_or_numpy(tmp_path):
    path = write_csv(tmp_path, SMALL)
    code = (
        "import sys; from runjob_builtins.tabular import CSVOptions; "
        f"CSVOptions.model_validate({{'path': {str(path)!r}, 'target': 'y', 'features': ['age']}}); "
        "heavy = {'torch', 'numpy'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# reading the rows: a bad cell is named by file, line (the header is line 1), column and value


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ("33,abc,a,7", "line 4, column 'bmi': 'abc' is not a number"),
        ("33,,a,7", "line 4, column 'bmi': empty cell"),
        ("33,nan,a,7", "line 4, column 'bmi': 'nan' is not a finite number"),
        ("33,20.5,a,seven", "line 4, column 'y': 'seven' is not a number"),
        ("33", "line 4, column 'bmi': missing (the line has 1 cells, the header 4 columns)"),
        ("33,20.5,a,7,8", "line 4: 5 cells, but the header names 4 columns"),
    ],
    ids=["text", "empty", "nan", "target", "short-row", "long-row"],
)
def test_bad_cell_names_file_line_column_and_value(tmp_path, bad_line, expected):
    lines = SMALL.splitlines()
    lines[3] = bad_line
    path = write_csv(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        build(path, target="y", features=["age", "bmi"])
    assert str(caught.value).startswith(f"{path} {expected}")
    assert "\n" not in str(caught.value)


def test_unused_columns_and_blank_lines_are_not_read(tmp_path):
    lines = SMALL.splitlines()
    lines[5] = "25,20.5,,4"  # an empty cell in 'label', which this job does not use
    path = write_csv(tmp_path, "\n".join(lines[:8]) + "\n\n" + "\n".join(lines[8:]) + "\n\n")
    splits = build(path, target="y", features=["age", "bmi"])
    assert len(splits.train) + len(splits.val) == 20


def test_too_few_rows_for_the_splits_says_how_many(tmp_path):
    path = write_csv(tmp_path, "x,y\n1,2\n")
    with pytest.raises(DataError, match=r"holds 1 data row: too few for a training and a validation split"):
        build(path, target="y")


# the split and the scaling


def test_split_is_fixed_by_its_seed_disjoint_and_complete(tmp_path):
    path = write_csv(tmp_path, SMALL)
    a = build(path, target="y", features=["age", "bmi"], val_fraction=0.25)
    again = build(path, target="y", features=["age", "bmi"], val_fraction=0.25)
    other = build(path, target="y", features=["age", "bmi"], val_fraction=0.25, split_seed=1)
    assert (len(a.train), len(a.val)) == (15, 5) and a.test is None
    assert rows_of(a.val) == rows_of(again.val) and rows_of(a.train) == rows_of(again.train)
    assert rows_of(a.val) != rows_of(other.val)
    assert sorted(rows_of(a.train) + rows_of(a.val)) == list(range(20))


def test_test_fraction_adds_a_test_split(tmp_path):
    path = write_csv(tmp_path, SMALL)
    splits = build(path, target="y", features=["age", "bmi"], val_fraction=0.2, test_fraction=0.1)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (14, 4, 2)
    assert sorted(rows_of(splits.train) + rows_of(splits.val) + rows_of(splits.test)) == list(range(20))


def test_features_are_standardized_with_the_training_rows_statistics(tmp_path):
    lines = SMALL.splitlines()
    path = write_csv(tmp_path, "\n".join(f"{line},{'c' if n == 0 else 3}" for n, line in enumerate(lines)) + "\n")
    splits = build(path, target="y", features=["age", "bmi", "c"], val_fraction=0.3)
    raw = [[float(cell) for cell in line.split(",")[:2]] for line in lines[1:]]
    train_rows = rows_of(splits.train)
    for column in range(2):
        values = [raw[row][column] for row in train_rows]
        mean, std = statistics.fmean(values), statistics.pstdev(values)
        for split in (splits.train, splits.val):
            expected = [(raw[row][column] - mean) / std for row in rows_of(split)]
            assert split.tensors[0][:, column].tolist() == pytest.approx(expected, abs=1e-5)
    train_features = splits.train.tensors[0]
    assert train_features[:, :2].mean(0).abs().max() < 1e-5
    assert train_features[:, :2].std(0, unbiased=False).tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
    assert splits.val.tensors[0][:, 0].mean().abs() > 1e-3, "validation rows are scaled with train's statistics"
    assert splits.train.tensors[0][:, 2].abs().max() == 0 and splits.val.tensors[0][:, 2].abs().max() == 0
    assert splits.train.tensors[0].dtype.is_floating_point and splits.train.tensors[0].dtype.itemsize == 4


def test_standardize_false_keeps_the_values(tmp_path):
    path = write_csv(tmp_path, SMALL)
    splits = build(path, target="y", features=["age"], standardize=False)
    assert [int(x) for x in splits.val.tensors[0][:, 0].tolist()] == [20 + row for row in rows_of(splits.val)]


# targets


def test_value_targets_keep_their_units_and_shape(tmp_path):
    path = write_csv(tmp_path, SMALL)
    one = build(path, target="y", features=["age"])
    listed = build(path, target=["y"], features=["age"])
    two = build(path, target=["y", "bmi"], features=["age"])
    features, target = one.train[0]
    assert tuple(features.shape) == (1,) and tuple(target.shape) == ()
    assert tuple(one.train.tensors[1].shape) == (16,) and one.num_classes is None and one.classes is None
    assert tuple(listed.train.tensors[1].shape) == (16, 1)
    assert tuple(two.train.tensors[1].shape) == (16, 2) and str(two.train.tensors[1].dtype) == "torch.float32"
    assert two.train.tensors[1][:, 0].tolist() == [float(row) for row in rows_of(one.train)]


def test_class_targets_in_numeric_order_when_all_are_numbers(tmp_path):
    grades = ["10", "2", "1", "2", "10", "1.0", "2", "1", "10", "2"]
    path = write_csv(tmp_path, "x,grade\n" + "".join(f"{i},{g}\n" for i, g in enumerate(grades)))
    splits = build(path, target="grade", target_type="class", standardize=False)
    assert splits.num_classes == 3 and splits.classes == ["1", "2", "10"]  # not string order: 1, 10, 2
    by_x = {int(x): int(y) for split in (splits.train, splits.val) for x, y in zip(*split.tensors, strict=True)}
    assert [by_x[i] for i in range(10)] == [2, 1, 0, 1, 2, 0, 1, 0, 2, 1]  # "1.0" is class "1"
    assert str(splits.train.tensors[1].dtype) == "torch.int64"


def test_class_targets_as_text_in_string_order(tmp_path):
    path = write_csv(tmp_path, SMALL)
    splits = build(path, target="label", target_type="class", features=["age", "bmi"])
    assert splits.num_classes == 2 and splits.classes == ["a", "b"]
    y = build(path, target="y", features=["age"])
    labels = {row: int(label) for row, label in zip(rows_of(y.train), splits.train.tensors[1].tolist(), strict=True)}
    assert all(label == row % 2 for row, label in labels.items())  # row i holds 'ab'[i % 2]


def test_diabetes_file_records_its_digest_and_source(tmp_path):
    path = write_diabetes(tmp_path)
    splits = build(path, target="target")
    assert (len(splits.train), len(splits.val)) == (354, 88)
    assert tuple(splits.train.tensors[0].shape) == (354, 10)
    assert splits.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert splits.source == str(path.resolve())
    # predicting the training mean is what R^2 = 0 means: the baseline a model must beat
    assert 50 < splits.baselines["mean_predictor_val_mae"] < splits.baselines["mean_predictor_val_rmse"] < 100


def write_diabetes(folder: Path) -> Path:
    """scikit-learn's bundled diabetes table (442 rows, 10 features, no download) as a CSV."""
    import csv

    from sklearn.datasets import load_diabetes

    data = load_diabetes(scaled=False)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "diabetes.csv"
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([*data.feature_names, "target"])
        writer.writerows([*row, y] for row, y in zip(data.data.tolist(), data.target.tolist(), strict=True))
    return path


# training: the shipped regression job learns from the CSV


@pytest.mark.timeout(120)
def test_diabetes_job_learns_a_regression(runjob_tester):
    write_diabetes(runjob_tester.path / "data")
    run = runjob_tester.run(
        REPO / "jobs" / "diabetes.toml",  # as shipped, shortened: path = "data/diabetes.csv" from the working folder
        "train.epochs=6",
        "train.batch_size=8",
        "optimizer.lr=0.05",
        "dataset.test_fraction=0.1",
        "tracking.system_metrics_interval=0",
        "tracking.log_model=none",
    )
    assert run.status == "FINISHED"
    metrics = run.metrics
    assert metrics["val/r2"] > 0.2, metrics  # 0: no better than predicting the training mean
    baselines = {key: float(value) for key, value in run.tags.items() if key.startswith("runjob.baseline.")}
    assert metrics["val/mae"] < baselines["runjob.baseline.mean_predictor_val_mae"]
    assert metrics["val/rmse"] < baselines["runjob.baseline.mean_predictor_val_rmse"]
    assert not [key for key in metrics if key.startswith("baseline/")], "tags: as metrics they sorted first"
    assert metrics["val/rmse"] ** 2 == pytest.approx(metrics["val/loss"], rel=1e-4)  # mse, in the target's units
    assert {"test/r2", "test/mae", "test/rmse"} <= set(metrics)
    assert json.loads(run.params["dataset.features"]) == (
        ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
    )
