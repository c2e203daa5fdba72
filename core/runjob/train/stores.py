"""Objects at a streamed dataset's location (:class:`runjob.host.streams.StreamOptions`): read,
write, test, delete, and the doctor's check that the location can be read.

``s3://`` goes through boto3 (on ``options.endpoint``: ``endpoint_url``, else ``AWS_ENDPOINT_URL_S3``
or ``AWS_ENDPOINT_URL``; credentials from boto3's standard places), ``gs://`` through
google-cloud-storage, a local folder through plain files. Transient store errors are retried with
backoff; every failure that is left becomes a :class:`~runjob.errors.DataError` of one line naming
the location, the object and what to do. Secrets are never printed.

boto3 and google-cloud-storage are imported inside the functions: the doctor module imports this
one, and ``runjob validate``/``--help`` must not load boto3 (a third of a second).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from runjob.errors import DataError, describe
from runjob.host.streams import ENDPOINT_VARIABLES, MANIFEST_FILE, Location, StreamOptions


@dataclass(frozen=True)
class Patience:
    """How long one request may take: ``attempts`` tries (botocore's "standard" retries of transient
    errors and throttling, with backoff), each connecting within ``connect_s`` and each read within
    ``read_s`` seconds."""

    attempts: int
    connect_s: float
    read_s: float


PATIENT = Patience(attempts=5, connect_s=5, read_s=30)
"""Reading and writing data."""
QUICK = Patience(attempts=2, connect_s=3, read_s=5)
"""The doctor's check: a store that never answers fails it in about 10 s."""
ONCE = Patience(attempts=1, connect_s=10, read_s=60)
"""A chunk's download: one try, the retries counted by the caller (:mod:`runjob.train.downloads`)."""
TRANSIENT_STATUS = (429, 500, 502, 503, 504)
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "RequestLimitExceeded",
        "TooManyRequests",
    }
)
LISTED_KEYS = 5
DELETE_BATCH = 1000  # the most keys S3's DeleteObjects takes
_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_EC2_METADATA_DISABLED",
)
_T = TypeVar("_T")
Client: TypeAlias = Any
"""A boto3 S3 client or a google-cloud-storage bucket: neither library carries type information."""


def storage_options(stream: StreamOptions) -> dict[str, object]:
    """What LitData's ``StreamingDataset`` and ``optimize`` take as ``storage_options``: the
    S3-compatible endpoint of an s3:// location that has one, else nothing."""
    endpoint = stream.endpoint
    return {"endpoint_url": endpoint} if endpoint else {}


def read_object(stream: StreamOptions, *parts: str) -> bytes:
    """The bytes of the object ``parts`` under the location (``read_object(s, "train", "index.json")``)."""
    where = stream.where
    if where.scheme == "s3":
        key = where.key(*parts)
        return _s3(
            stream, where.url(*parts), lambda c: bytes(c.get_object(Bucket=where.bucket, Key=key)["Body"].read())
        )
    if where.scheme == "gs":
        return _gs(stream, where.url(*parts), lambda b: bytes(b.blob(where.key(*parts)).download_as_bytes()))
    return _local(stream, where.url(*parts), lambda path: path.read_bytes())


def write_object(stream: StreamOptions, data: bytes, *parts: str) -> None:
    """Write ``data`` as the object ``parts`` under the location (whole or not at all)."""
    where = stream.where
    if where.scheme == "s3":
        key = where.key(*parts)
        _s3(stream, where.url(*parts), lambda c: c.put_object(Bucket=where.bucket, Key=key, Body=data))
    elif where.scheme == "gs":
        _gs(stream, where.url(*parts), lambda b: b.blob(where.key(*parts)).upload_from_string(data))
    else:
        _local(stream, where.url(*parts), lambda path: _write_file(path, data))


def object_exists(stream: StreamOptions, *parts: str) -> bool:
    """Whether the object ``parts`` is under the location (a folder is not an object)."""
    where = stream.where
    if where.scheme == "s3":
        return _s3(stream, where.url(*parts), lambda c: _s3_exists(c, where.bucket, where.key(*parts)))
    if where.scheme == "gs":
        return _gs(stream, where.url(*parts), lambda b: bool(b.blob(where.key(*parts)).exists()))
    return _local(stream, where.url(*parts), lambda path: path.is_file())


def delete_prefix(stream: StreamOptions, *parts: str) -> int:
    """Remove every object under ``parts`` of the location (all of it without ``parts``); how many.
    ``parts`` is a folder: ``"train"`` leaves ``"train2/..."`` alone."""
    where = stream.where
    if where.scheme == "s3":
        prefix = _folder(where.key(*parts))
        return _s3(stream, where.url(*parts), lambda c: _s3_delete(c, where.bucket, prefix))
    if where.scheme == "gs":
        prefix = _folder(where.key(*parts))
        return _gs(stream, where.url(*parts), lambda b: _gs_delete(b, prefix))
    removed = _local(stream, where.url(*parts), _delete_files)
    if parts and Path(where.url(*parts)).is_dir():
        _local(stream, where.url(*parts), lambda path: path.rmdir())
    return removed


def check_readable(stream: StreamOptions) -> str:
    """For ``runjob doctor``: list a few keys of the location and read its ``runjob.json`` when
    there is one. One line saying what was found; DataError when the location cannot be read."""
    where = stream.where
    url = where.url()
    shown = f"{url} (endpoint {stream.endpoint})" if stream.endpoint else url
    manifest_url, manifest_key = where.url(MANIFEST_FILE), where.key(MANIFEST_FILE)
    if where.scheme == "s3":
        listed = _s3(stream, url, lambda c: _s3_list(c, where.bucket, _folder(where.key())), QUICK)
        get_manifest = lambda c: _s3_get_or_none(c, where.bucket, manifest_key)  # noqa: E731
        manifest = _s3(stream, manifest_url, get_manifest, QUICK) if listed else None
    elif where.scheme == "gs":
        listed = _gs(stream, url, lambda b: _gs_list(b, _folder(where.key())))
        manifest = _gs(stream, manifest_url, lambda b: _gs_get_or_none(b, manifest_key)) if listed else None
    else:
        listed = _local(stream, url, _list_folder)
        manifest = read_object(stream, MANIFEST_FILE) if object_exists(stream, MANIFEST_FILE) else None
    if manifest is None:
        state = "empty," if not listed else "holds objects but"
        return f"{shown}: readable, {state} no {MANIFEST_FILE} yet: run `runjob data convert SOURCE {url}`"
    return f"{shown}: readable, {MANIFEST_FILE} found{_splits(manifest, where)}"


def _splits(manifest: bytes, where: Location) -> str:
    """`` (2 splits: train, val)`` from a manifest's ``splits``; DataError when it is not JSON."""
    try:
        record = json.loads(manifest)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(
            f"{where.url(MANIFEST_FILE)} is not JSON ({error}): it was not written by `runjob data convert`; "
            f"convert again into {where.url()}"
        ) from error
    splits = record.get("splits") if isinstance(record, dict) else None
    if isinstance(splits, dict | list) and splits:
        names = ", ".join(str(name) for name in splits)
        return f" ({len(splits)} split{'s' if len(splits) != 1 else ''}: {names})"
    return ""


def _folder(key: str) -> str:
    return f"{key}/" if key else ""


def _missing(url: str, location: str) -> str:
    convert = f"run `runjob data convert SOURCE {location}`"
    if url.replace(os.sep, "/").rsplit("/", 1)[-1] == MANIFEST_FILE:
        return f"{url} not found: the location holds no finished conversion; {convert}"
    return f"{url} not found: the conversion at {location} is incomplete or was changed; {convert} again"


# --- S3 -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _S3Client:
    client: Client  # a boto3 S3 client
    credentials: str  # where boto3 found them, for messages ("" when it found none)


_clients: dict[tuple[object, ...], _S3Client] = {}
_clients_lock = threading.Lock()


def _s3_client(endpoint: str | None, patience: Patience) -> _S3Client:
    """One client per endpoint, retry budget and credential settings in this process (a forked
    process makes its own: a client's connections are not to be shared across a fork)."""
    cache_key = (os.getpid(), endpoint, patience, *(os.environ.get(name) for name in _CREDENTIAL_VARIABLES))
    with _clients_lock:
        found = _clients.get(cache_key)
        if found is None:
            # lazy: `runjob validate` and `--help` import the doctor, which imports this module; boto3 takes 0.3 s
            import boto3.session  # type: ignore[import-untyped, unused-ignore]
            from botocore.config import Config  # type: ignore[import-untyped, unused-ignore]

            session = boto3.session.Session()
            credentials = session.get_credentials()
            config = Config(
                retries={"mode": "standard", "total_max_attempts": patience.attempts},  # the first try included
                connect_timeout=patience.connect_s,
                read_timeout=patience.read_s,
            )
            client = session.client("s3", endpoint_url=endpoint, config=config)
            method = str(credentials.method) if credentials is not None else ""
            found = _clients[cache_key] = _S3Client(client, _credential_source(method, session.profile_name))
        return found


def _credential_source(method: str, profile: object) -> str:
    if not method:
        return ""
    if method == "env":
        return "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN if set)"
    if method in ("shared-credentials-file", "config-file"):
        return f"profile {profile!r} in ~/.aws (AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE)"
    if method in ("iam-role", "container-role"):
        return "this machine's role (instance metadata)"
    return f"credentials from {method} (AWS_PROFILE: {profile!r})"


def _s3(stream: StreamOptions, url: str, call: Callable[[Client], _T], patience: Patience = PATIENT) -> _T:
    """``call(client)``; a failure as a DataError of one line about ``url``."""
    # lazy: `runjob validate` and `--help` import the doctor, which imports this module; boto3 takes 0.3 s
    from botocore.exceptions import (  # type: ignore[import-untyped, unused-ignore]
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )
    from botocore.exceptions import (  # type: ignore[import-untyped, unused-ignore]
        ConnectionError as UnreachableError,
    )

    found = _s3_client(stream.endpoint, patience)
    try:
        return call(found.client)
    except ClientError as error:
        raise DataError(_s3_refused(stream, url, error.response, found.credentials)) from error
    except (NoCredentialsError, PartialCredentialsError) as error:
        raise DataError(
            f"{url}: no AWS credentials ({describe(error)}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE, or run on a machine with a role"
        ) from error
    except UnreachableError as error:
        raise DataError(
            f"{url}: cannot reach the store at {_endpoint(stream)} after {patience.attempts} tries: "
            f"{describe(error)}; check that it runs and that the URL is right"
        ) from error
    except ReadTimeoutError as error:
        raise DataError(
            f"{url}: the store at {_endpoint(stream)} did not answer within {patience.read_s:g} s, "
            f"{patience.attempts} tries: check that it runs and is not overloaded"
        ) from error
    except BotoCoreError as error:
        raise DataError(f"{url}: {describe(error)}") from error


def download_object(stream: StreamOptions, bucket: str, key: str, target: str) -> None:
    """One try at GET ``s3://bucket/key`` (under ``stream``'s endpoint and credentials) into the file
    ``target``; a failure is a DataError of one line whose ``__cause__`` is boto's error (see
    :func:`transient`)."""
    url = f"s3://{bucket}/{key}"

    def get(client: Client) -> None:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with open(target, "wb") as file:
            for piece in body.iter_chunks(1 << 20):
                file.write(piece)

    _s3(stream, url, get, ONCE)


def transient(error: BaseException) -> str | None:
    """What makes a store's error worth another try (throttling, a 5xx answer, a dropped or timed-out
    connection), in a few words; None for one that would happen again (a missing object, refused
    credentials)."""
    # lazy: boto3's errors only where a download failed
    from botocore.exceptions import (  # type: ignore[import-untyped, unused-ignore]
        ClientError,
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status in TRANSIENT_STATUS or code in TRANSIENT_CODES:
            return f"HTTP {status} {code}".strip()
        return None
    if isinstance(
        error, (ConnectionError, HTTPClientError, IncompleteReadError, ReadTimeoutError, ResponseStreamingError)
    ):
        return type(error).__name__
    return None


def _endpoint(stream: StreamOptions) -> str:
    """The endpoint and where it came from, for messages."""
    if stream.endpoint_url:
        return f"{stream.endpoint_url} (from dataset.endpoint_url)"
    for name in ENDPOINT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return f"{value} (from {name})"
    return "Amazon S3 (no dataset.endpoint_url or AWS_ENDPOINT_URL set)"


def _s3_refused(stream: StreamOptions, url: str, response: dict[str, Client], credentials: str) -> str:
    """One line for an error answer of the store."""
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    where = stream.where
    checked = credentials or "the AWS credentials"
    if code == "NoSuchBucket":
        at = f" at {stream.endpoint}" if stream.endpoint else ""
        return f"{url}: bucket {where.bucket!r} does not exist{at}: create it or correct dataset.location"
    if code == "NoSuchKey":
        return _missing(url, where.url())
    if code in ("404", "") and status == 404:  # an answer without S3's error document
        return (
            f"{url}: {_endpoint(stream)} answered 404 Not Found without an S3 error: check that it is an S3 API "
            f"and that bucket {where.bucket!r} exists"
        )
    if code == "InvalidAccessKeyId":
        return f"{url}: the store does not know the access key id: check {checked}"
    if code == "SignatureDoesNotMatch":
        return f"{url}: the secret key does not match the access key id: check {checked}"
    if code in ("AccessDenied", "403", "AllAccessDisabled") or status == 403:
        return (
            f"{url}: access denied: {checked} may be wrong, or lack permission for bucket {where.bucket!r} "
            "(reading needs s3:ListBucket and s3:GetObject; converting s3:PutObject too)"
        )
    message = str(error.get("Message", "")).splitlines()[0] if error.get("Message") else ""
    return f"{url}: the store answered {code or status}{': ' + message if message else ''}"


def _s3_exists(client: Client, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError  # type: ignore[import-untyped, unused-ignore]  # lazy: see _s3

    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
            return False
        raise
    return True


def _s3_get_or_none(client: Client, bucket: str, key: str) -> bytes | None:
    from botocore.exceptions import ClientError  # type: ignore[import-untyped, unused-ignore]  # lazy: see _s3

    try:
        return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "NoSuchKey":
            return None
        raise


def _s3_keys(client: Client, bucket: str, prefix: str) -> Iterator[str]:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            yield str(item["Key"])


def _s3_list(client: Client, bucket: str, prefix: str) -> list[str]:
    answer = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=LISTED_KEYS)
    return [str(item["Key"]) for item in answer.get("Contents", [])]


def _s3_delete(client: Client, bucket: str, prefix: str) -> int:
    keys = list(_s3_keys(client, bucket, prefix))
    for start in range(0, len(keys), DELETE_BATCH):
        batch = [{"Key": key} for key in keys[start : start + DELETE_BATCH]]
        answer = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        failed = answer.get("Errors", [])
        if failed:
            first = failed[0]
            raise DataError(
                f"s3://{bucket}/{first.get('Key')}: not deleted ({first.get('Code')}: {first.get('Message')}); "
                f"{len(failed)} object(s) of this batch failed: check the credentials' s3:DeleteObject permission"
            )
    return len(keys)


# --- Google Cloud Storage -------------------------------------------------------------------------

_gcs_clients: dict[int, Client] = {}


def _gs(stream: StreamOptions, url: str, call: Callable[[Client], _T]) -> _T:
    """``call(bucket)`` on the location's bucket; a failure as a DataError of one line about ``url``."""
    try:
        # lazy: only gs:// locations need Google Cloud Storage's client (an optional dependency)
        from google.api_core import exceptions  # type: ignore[import-not-found, import-untyped, unused-ignore]
        from google.auth.exceptions import DefaultCredentialsError  # type: ignore[import-not-found, unused-ignore]
        from google.cloud import storage  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        raise DataError(
            f"{url}: gs:// locations need Google Cloud Storage's client: pip install google-cloud-storage"
        ) from None
    where = stream.where
    try:
        client = _gcs_clients.get(os.getpid())
        if client is None:
            client = _gcs_clients[os.getpid()] = storage.Client()
        return call(client.bucket(where.bucket))
    except DefaultCredentialsError as error:
        raise DataError(
            f"{url}: no Google Cloud credentials ({describe(error)}): set GOOGLE_APPLICATION_CREDENTIALS to a key "
            "file or run `gcloud auth application-default login`"
        ) from error
    except exceptions.NotFound as error:
        if "bucket does not exist" in str(error):  # GCS: "The specified bucket does not exist."
            raise DataError(
                f"{url}: bucket {where.bucket!r} does not exist: create it or correct dataset.location"
            ) from error
        raise DataError(_missing(url, where.url())) from error
    except (exceptions.Forbidden, exceptions.Unauthorized) as error:
        raise DataError(
            f"{url}: access denied ({describe(error)}): check GOOGLE_APPLICATION_CREDENTIALS and the account's "
            f"permissions on bucket {where.bucket!r}"
        ) from error
    except exceptions.GoogleAPIError as error:
        raise DataError(f"{url}: {describe(error)}") from error


def _gs_list(bucket: Client, prefix: str) -> list[str]:
    return [str(blob.name) for blob in bucket.list_blobs(prefix=prefix, max_results=LISTED_KEYS)]


def _gs_get_or_none(bucket: Client, key: str) -> bytes | None:
    blob = bucket.blob(key)
    return bytes(blob.download_as_bytes()) if blob.exists() else None


def _gs_delete(bucket: Client, prefix: str) -> int:
    blobs = list(bucket.list_blobs(prefix=prefix))
    for blob in blobs:
        blob.delete()
    return len(blobs)


# --- a local folder -------------------------------------------------------------------------------


def _local(stream: StreamOptions, path: str, call: Callable[[Path], _T]) -> _T:
    """``call(path)``; a failure as a DataError of one line about ``path``."""
    try:
        return call(Path(path))
    except FileNotFoundError as error:
        if not Path(stream.where.prefix).is_dir():
            raise DataError(
                f"{path}: folder {stream.where.prefix} does not exist: correct dataset.location or run "
                f"`runjob data convert SOURCE {stream.where.url()}`"
            ) from error
        raise DataError(_missing(path, stream.where.url())) from error
    except PermissionError as error:
        raise DataError(f"{path}: permission denied ({describe(error)}): check the folder's owner and mode") from error
    except OSError as error:
        raise DataError(f"{path}: {describe(error)}") from error


def _write_file(path: Path, data: bytes) -> None:
    """Written beside and renamed: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _delete_files(path: Path) -> int:
    """The files under ``path`` (or the file ``path``) removed; the location's own folder stays."""
    if path.is_file() or path.is_symlink():
        path.unlink()
        return 1
    if not path.is_dir():
        return 0
    count = sum(1 for item in path.rglob("*") if not item.is_dir())
    for item in path.iterdir():
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink()
    return count


def _list_folder(path: Path) -> list[str]:
    if not path.is_dir():
        if path.exists():
            raise NotADirectoryError(f"{path} is a file, not a folder")
        raise FileNotFoundError(path)
    return sorted(item.name for item in path.iterdir())[:LISTED_KEYS]
