"""A store that throttles and fails: moto's S3 server behind a proxy on 127.0.0.1 that answers chosen
chunk downloads with ``503 SlowDown``. Transient errors are retried with backoff, counted and said;
no sample is skipped; a store that keeps failing stops the read in one line naming the chunk."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("litdata")

from test_streaming import digits, epoch_rows, expected_hashes, loader, shards, streamed_split  # noqa: E402, F401

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Throttle:
    """How the proxy answers: the next ``refusals`` GETs of chunk files get 503 SlowDown."""

    refusals: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refuse(self, method: str, path: str) -> bool:
        if method != "GET" or not path.split("?")[0].endswith(".bin"):
            return False
        with self.lock:
            if self.refusals <= 0:
                return False
            self.refusals -= 1
            self.refused += 1
            return True


def _handler(upstream: str, throttle: Throttle) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if throttle.refuse(self.command, self.path):
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOW_DOWN)))
                self.end_headers()
                self.wfile.write(SLOW_DOWN)
                return
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            try:
                connection.request(self.command, self.path, body=body or None, headers=dict(self.headers))
                answer = connection.getresponse()
                data = answer.read()
            finally:
                connection.close()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

    return Forward


@pytest.fixture
def throttling(s3) -> Iterator[tuple[str, Throttle]]:
    """A proxy to the test's S3 server: its endpoint and its throttle."""
    throttle = Throttle()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(s3.endpoint, throttle))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", throttle
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def digits_on_s3(digits: Path, shards: Path, s3) -> tuple[Path, str]:  # noqa: F811 - the fixtures imported above
    """The digits' shards (converted once, to a folder) copied to the test's bucket."""
    for path in sorted(p for p in shards.rglob("*") if p.is_file()):
        s3.client.upload_file(str(path), s3.bucket, f"digits/{path.relative_to(shards).as_posix()}")
    return digits, s3.url("digits")


@pytest.mark.slow
def test_throttled_downloads_are_retried_counted_and_said_and_no_sample_is_skipped(
    digits_on_s3, throttling, tmp_path, monkeypatch, capfd
):
    from runjob.train import downloads

    monkeypatch.setattr(downloads, "FIRST_WAIT_S", 0.05)  # the loader workers fork after this: they see it
    images, location = digits_on_s3
    endpoint, throttle = throttling
    throttle.refusals = 3
    before = downloads.retries()
    stream = loader(streamed_split(location, endpoint_url=endpoint, cache_dir=str(tmp_path / "cache")))
    rows = epoch_rows(stream, 0)
    assert Counter(h for batch in rows for h in batch) == expected_hashes(images)  # every sample, once
    assert throttle.refused == 3
    assert stream.retries() - before == 3  # the loader workers' retries, counted in the training process
    said = capfd.readouterr().err
    assert said.count("HTTP 503 SlowDown; retry 1 of 5") >= 1, said
    assert said.count("; retry ") == 3


@pytest.mark.slow
def test_a_store_that_keeps_failing_stops_the_read_in_one_line_naming_the_chunk(
    digits_on_s3, throttling, tmp_path, monkeypatch
):
    from runjob.errors import DataError
    from runjob.train import downloads

    monkeypatch.setattr(downloads, "FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(downloads, "RETRIES", 2)
    _, location = digits_on_s3
    endpoint, throttle = throttling
    throttle.refusals = 10_000
    stream = loader(streamed_split(location, endpoint_url=endpoint, cache_dir=str(tmp_path / "cache")), workers=0)
    with pytest.raises(DataError) as raised:
        epoch_rows(stream, 0)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{location}/train/chunk-")
    assert ".bin: the store still answered HTTP 503 SlowDown after 2 retries" in message and "--resume" in message


@pytest.mark.slow
def test_an_error_that_would_happen_again_is_not_retried(digits_on_s3, tmp_path, s3, monkeypatch):
    """A chunk deleted from the store: NoSuchKey at once, no retry."""
    from runjob.errors import DataError
    from runjob.train import downloads

    _, location = digits_on_s3
    chunk = next(key for key in s3.keys("digits/train/") if key.endswith(".bin"))
    s3.client.delete_object(Bucket=s3.bucket, Key=chunk)
    before = downloads.retries()
    stream = loader(streamed_split(location, cache_dir=str(tmp_path / "cache")), workers=0)
    with pytest.raises(DataError) as raised:
        epoch_rows(stream, 0)
    assert "\n" not in str(raised.value) and chunk.rsplit("/", 1)[-1] in str(raised.value)
    assert downloads.retries() == before
