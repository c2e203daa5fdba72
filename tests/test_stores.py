"""Reading and writing a streamed dataset's location (runjob.train.stores) on S3 (moto's server,
tests/s3_server.py) and in a local folder, the one-line errors for a store that fails, and
``runjob doctor``'s data check."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
from s3_server import S3Bucket

from runjob.commands import doctor
from runjob.errors import DataError
from runjob.host.streams import StreamOptions
from runjob.testing import free_port
from runjob.train import stores


def one_line(error: pytest.ExceptionInfo[DataError]) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_the_s3_fixture_gives_a_fresh_bucket_on_a_server_that_answers(s3: S3Bucket) -> None:
    s3.client.put_object(Bucket=s3.bucket, Key="data/train/index.json", Body=b"{}")
    assert s3.keys() == ["data/train/index.json"]
    assert s3.client.get_object(Bucket=s3.bucket, Key="data/train/index.json")["Body"].read() == b"{}"
    assert s3.url("data/") == f"s3://{s3.bucket}/data"
    assert s3.endpoint.startswith("http://127.0.0.1:")


# --- round trips ------------------------------------------------------------------------------


def round_trip(stream: StreamOptions) -> None:
    """Write, read, test and delete objects at ``stream``'s location, whatever the store."""
    assert not stores.object_exists(stream, "train", "index.json")
    stores.write_object(stream, b'{"chunks": []}', "train", "index.json")
    stores.write_object(stream, b"\x00\x01chunk", "train", "chunk-0-0.bin")
    stores.write_object(stream, b"other", "train2", "index.json")
    stores.write_object(stream, b"{}", stores.MANIFEST_FILE)

    assert stores.read_object(stream, "train", "index.json") == b'{"chunks": []}'
    assert stores.read_object(stream, "train/chunk-0-0.bin") == b"\x00\x01chunk"
    assert stores.object_exists(stream, "train", "index.json")
    assert not stores.object_exists(stream, "train"), "a folder is not an object"
    stores.write_object(stream, b"replaced", "train", "index.json")
    assert stores.read_object(stream, "train", "index.json") == b"replaced"

    assert stores.delete_prefix(stream, "train") == 2
    assert not stores.object_exists(stream, "train", "index.json")
    assert stores.read_object(stream, "train2", "index.json") == b"other", "train2/ is not under train/"
    assert stores.delete_prefix(stream, "train") == 0
    assert stores.delete_prefix(stream) == 2  # train2/index.json and the manifest
    assert not stores.object_exists(stream, stores.MANIFEST_FILE)


def test_objects_round_trip_on_s3(s3: S3Bucket) -> None:
    stream = StreamOptions(location=s3.url("datasets/digits"))
    round_trip(stream)
    assert s3.keys() == []


def test_objects_round_trip_in_a_local_folder(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    round_trip(StreamOptions(location=str(folder)))
    assert folder.is_dir() and list(folder.iterdir()) == [], "the location's folder stays, emptied"


def test_a_local_write_leaves_no_partial_file_beside_it(tmp_path: Path) -> None:
    stream = StreamOptions(location=str(tmp_path))
    stores.write_object(stream, b"x" * 1000, "val", "index.json")
    assert [p.name for p in (tmp_path / "val").iterdir()] == ["index.json"]


# --- storage options --------------------------------------------------------------------------


def test_storage_options_name_the_endpoint_of_an_s3_location_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    assert stores.storage_options(StreamOptions(location="s3://bucket/p")) == {}
    given = StreamOptions(location="s3://bucket/p", endpoint_url="http://127.0.0.1:9000")
    assert stores.storage_options(given) == {"endpoint_url": "http://127.0.0.1:9000"}

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.internal:9000")
    assert stores.storage_options(StreamOptions(location="s3://bucket/p")) == {
        "endpoint_url": "http://minio.internal:9000"
    }
    assert stores.storage_options(given) == {"endpoint_url": "http://127.0.0.1:9000"}, "the job's wins"
    assert stores.storage_options(StreamOptions(location="gs://bucket/p")) == {}
    assert stores.storage_options(StreamOptions(location="/data/shards")) == {}


# --- failures, one line each ------------------------------------------------------------------


def test_a_missing_bucket_is_named(s3: S3Bucket) -> None:
    stream = StreamOptions(location=f"s3://{s3.bucket}-missing/data")
    with pytest.raises(DataError) as error:
        stores.read_object(stream, "runjob.json")
    message = one_line(error)
    assert f"bucket '{s3.bucket}-missing' does not exist at {s3.endpoint}" in message
    assert message.startswith(f"s3://{s3.bucket}-missing/data/runjob.json: ")


def test_a_missing_manifest_says_the_location_holds_no_finished_conversion(s3: S3Bucket) -> None:
    stream = StreamOptions(location=s3.url("data"))
    with pytest.raises(DataError) as error:
        stores.read_object(stream, "runjob.json")
    assert one_line(error) == (
        f"s3://{s3.bucket}/data/runjob.json not found: the location holds no finished conversion; "
        f"run `runjob data convert SOURCE s3://{s3.bucket}/data`"
    )


def test_a_missing_shard_object_says_to_convert_again(s3: S3Bucket, tmp_path: Path) -> None:
    for stream in (StreamOptions(location=s3.url("data")), StreamOptions(location=str(tmp_path))):
        with pytest.raises(DataError) as error:
            stores.read_object(stream, "train", "index.json")
        message = one_line(error)
        assert message.startswith(f"{stream.where.url('train', 'index.json')} not found: ")
        assert f"run `runjob data convert SOURCE {stream.where.url()}` again" in message


def test_a_missing_local_folder_is_named(tmp_path: Path) -> None:
    stream = StreamOptions(location=str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as error:
        stores.read_object(stream, "runjob.json")
    assert f"folder {tmp_path / 'nowhere'} does not exist" in one_line(error)


def test_wrong_credentials_name_what_to_check_and_never_the_secret(
    s3: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = StreamOptions(location=s3.url("data"))
    stores.write_object(stream, b"{}", "runjob.json")
    with s3.auth() as (key_id, secret):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        assert stores.read_object(stream, "runjob.json") == b"{}", "the right key is let in"

        wrong = "wrong-secret-" + secret[::-1]
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
        with pytest.raises(DataError) as error:
            stores.read_object(stream, "runjob.json")
        message = one_line(error)
        assert message.startswith(f"s3://{s3.bucket}/data/runjob.json: the secret key does not match")
        assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in message
        assert wrong not in message and secret not in message

        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNUNKNOWN00")
        with pytest.raises(DataError) as error:
            stores.write_object(stream, b"{}", "runjob.json")
        assert "the store does not know the access key id: check AWS_ACCESS_KEY_ID" in one_line(error)


def test_no_credentials_say_where_to_put_them(s3: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(DataError) as error:
        stores.read_object(StreamOptions(location=s3.url("data")), "runjob.json")
    message = one_line(error)
    assert message.startswith(f"s3://{s3.bucket}/data/runjob.json: no AWS credentials")
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE" in message


def test_an_unreachable_endpoint_fails_quickly_naming_it_and_where_it_came_from(
    s3: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    stream = StreamOptions(location=s3.url("data"), endpoint_url=closed)
    started = time.monotonic()
    with pytest.raises(DataError) as error:
        stores.read_object(stream, "runjob.json")
    assert time.monotonic() - started < 15
    message = one_line(error)
    assert message.startswith(f"s3://{s3.bucket}/data/runjob.json: cannot reach the store at {closed}")
    assert f"from dataset.endpoint_url) after {stores.PATIENT.attempts} tries" in message

    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(DataError) as error:
        stores.check_readable(StreamOptions(location=s3.url("data")))
    assert f"cannot reach the store at {closed} (from AWS_ENDPOINT_URL) after {stores.QUICK.attempts} tries" in (
        one_line(error)
    )


@pytest.mark.skipif(
    importlib.util.find_spec("google.cloud.storage") is not None
    if importlib.util.find_spec("google.cloud") is not None
    else False,
    reason="asserts the message for a machine without google-cloud-storage",
)
def test_gs_without_its_client_says_what_to_install() -> None:
    with pytest.raises(DataError) as error:
        stores.read_object(StreamOptions(location="gs://bucket/data"), "runjob.json")
    assert one_line(error) == (
        "gs://bucket/data/runjob.json: gs:// locations need Google Cloud Storage's client: "
        "pip install google-cloud-storage"
    )


# --- the doctor's check -----------------------------------------------------------------------


def write_manifest(stream: StreamOptions, splits: list[str]) -> None:
    record = {"splits": {name: {"samples": 10} for name in splits}}
    stores.write_object(stream, json.dumps(record).encode(), stores.MANIFEST_FILE)


def test_the_doctor_reports_what_a_location_holds(s3: S3Bucket, tmp_path: Path) -> None:
    for stream, shown in (
        (StreamOptions(location=s3.url("data")), f"{s3.url('data')} (endpoint {s3.endpoint})"),
        (StreamOptions(location=str(tmp_path)), str(tmp_path)),
    ):
        empty = doctor.check_stream(stream)
        assert empty == doctor.Check(
            "data",
            "ok",
            f"{shown}: readable, empty, no runjob.json yet: run `runjob data convert SOURCE {stream.where.url()}`",
        )
        stores.write_object(stream, b"[]", "train", "index.json")
        assert "holds objects but no runjob.json yet" in doctor.check_stream(stream).detail

        write_manifest(stream, ["train", "val"])
        assert doctor.check_stream(stream) == doctor.Check(
            "data", "ok", f"{shown}: readable, runjob.json found (2 splits: train, val)"
        )

        stores.write_object(stream, b"{not json", stores.MANIFEST_FILE)
        broken = doctor.check_stream(stream)
        assert broken.status == "fail"
        assert broken.detail.startswith(f"{stream.where.url('runjob.json')} is not JSON")


def test_the_doctor_fails_a_location_it_cannot_read_with_the_stores_line(s3: S3Bucket, tmp_path: Path) -> None:
    missing = doctor.check_stream(StreamOptions(location=f"s3://{s3.bucket}-missing/data"))
    assert missing.status == "fail"
    assert f"bucket '{s3.bucket}-missing' does not exist" in missing.detail

    folder = doctor.check_stream(StreamOptions(location=str(tmp_path / "nowhere")))
    assert folder.status == "fail" and f"folder {tmp_path / 'nowhere'} does not exist" in folder.detail

    closed = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    unreachable = doctor.check_stream(StreamOptions(location=s3.url("data"), endpoint_url=closed))
    assert time.monotonic() - started < 15
    assert unreachable.status == "fail" and f"cannot reach the store at {closed}" in unreachable.detail


def test_the_doctor_checks_no_data_for_a_dataset_that_is_not_streamed() -> None:
    assert doctor.check_data(None) == []


def test_the_store_clients_are_made_once_per_endpoint(s3: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stores, "_clients", {})
    stream = StreamOptions(location=s3.url("data"))
    stores.write_object(stream, b"1", "a")
    stores.write_object(stream, b"2", "b")
    assert len(stores._clients) == 1
    other = StreamOptions(location=s3.url("data"), endpoint_url=s3.endpoint.replace("127.0.0.1", "localhost"))
    assert stores.read_object(other, "a") == b"1"
    assert len(stores._clients) == 2
