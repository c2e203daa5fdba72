"""An S3 API on 127.0.0.1 for the streamed-data tests: moto's standalone server in a process of its own.

``s3_server`` (one per session and xdist worker) starts ``python -m moto.server`` on a free port and
stops it at the end; ``s3`` points the standard AWS variables at it (fake credentials, no instance
metadata, ``AWS_ENDPOINT_URL``) and makes a fresh bucket for the test. Registered in conftest.py's
``pytest_plugins``. The server runs in its own process so the test process's boto3 is never patched
by moto, and a runjob process a test starts reads the same store through ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(endpoint: str) -> bool:
    """Whether an HTTP server answers at ``endpoint`` (any status: an error page is an answer)."""
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _start(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto's server on a free port, answering; a few tries, in case another process takes the port
    between choosing it and the server binding it."""
    problems: list[str] = []
    for _ in range(3):
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        env = {**os.environ, "MOTO_PORT": str(port)}
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)  # authentication off until a test asks (S3Bucket.auth)
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            if _answers(endpoint):
                return process, endpoint
            time.sleep(0.1)
        code = process.poll()
        _stop(process)
        problems.append(
            f"port {port}: " + (f"exited with {code}" if code is not None else f"no answer in {START_TIMEOUT_S:.0f} s")
        )
        if code is None:  # it ran but never answered: trying again would not help
            break
    raise RuntimeError(f"moto's S3 server did not start ({'; '.join(problems)}); its log {log}:\n{_tail(log)}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 for the session: its endpoint URL, ``http://127.0.0.1:PORT``."""
    log = tmp_path_factory.mktemp("moto") / "server.log"
    process, endpoint = _start(log)
    try:
        yield endpoint
    finally:
        _stop(process)


def _reset_auth(endpoint: str, count: str) -> None:
    """moto's switch for request authentication: after ``count`` more requests ("inf": never)."""
    # not urllib's default form type: the server would parse the body as a form and read nothing
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST", headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=10.0) as answer:
        answer.read()


@dataclass
class S3Bucket:
    """A fresh bucket on the test's S3 server, with a client for it."""

    endpoint: str
    bucket: str
    client: Any  # a boto3 S3 client on ``endpoint``

    def url(self, prefix: str = "") -> str:
        """``s3://BUCKET/PREFIX``."""
        prefix = prefix.strip("/")
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key in the bucket under ``prefix``, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    @contextlib.contextmanager
    def auth(self) -> Iterator[tuple[str, str]]:
        """The server checks every request's signature inside the ``with``: yields the access key id
        and secret key of an IAM user allowed everything (``AWS_ACCESS_KEY_ID``'s "testing" is then
        unknown to the server). Authentication is off again afterwards."""
        import boto3  # lazy: conftest loads this module in every session; boto3 only for the tests that use S3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION)
        user = f"runjob-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        _reset_auth(self.endpoint, "0")
        try:
            yield key["AccessKeyId"], key["SecretAccessKey"]
        finally:
            _reset_auth(self.endpoint, "inf")


@pytest.fixture
def s3(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    """A fresh bucket on the session's S3 server, and the environment pointed at the server: fake
    credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` "testing"), ``AWS_DEFAULT_REGION``,
    ``AWS_ENDPOINT_URL``, no instance metadata and no profile or session token of the machine's."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    # no ~/.aws files of the machine's: their profiles, regions or endpoints would change what boto3 does
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)

    import boto3  # lazy: conftest loads this module in every session; boto3 only for the tests that use S3

    client = boto3.client("s3", endpoint_url=s3_server, region_name=REGION)
    bucket = f"runjob-test-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return S3Bucket(endpoint=s3_server, bucket=bucket, client=client)
