"""Chunk downloads of ``s3://`` streams: transient store errors retried with backoff, each retry said
and counted.

LitData downloads a split's chunks in each loader worker, ahead of the one it reads. Its own S3 path
(obstore's client, or boto3's transfer manager) retries inside the client, unseen: a run on a
throttling store would slow down and nobody could say why. runjob registers its own downloader for
``s3://`` (LitData's documented extension point, :func:`litdata.streaming.downloader.register_downloader`):
one GET a try, with boto3 and no retries of its own, so that every retry is runjob's: after a
throttling answer (429, SlowDown), a 5xx answer or a dropped or timed-out connection it waits
(0.5 s, doubled each time, with jitter) and tries again, up to :data:`RETRIES` times, saying so on
stderr and counting it in :data:`COUNT`, shared by the process and its loader workers; the training
loop logs the count of all processes as the metric ``data/retries``. A download still failing after
that stops the run: never a skipped sample. An error that would happen again (a missing object,
refused credentials) is not retried.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from contextlib import suppress
from urllib.parse import urlsplit

from filelock import FileLock, Timeout
from litdata.streaming.downloader import Downloader, S3Downloader, register_downloader

from runjob.errors import DataError
from runjob.host.output import screen
from runjob.host.streams import StreamOptions
from runjob.train import stores

RETRIES = 5
"""Tries after the first for one chunk."""
FIRST_WAIT_S = 0.5
LONGEST_WAIT_S = 8.0
INDEX_FILE = "index.json"
COUNT = multiprocessing.get_context("fork").Value("q", 0)
"""Retries in this process and its loader workers (forked: they share it)."""


def retries() -> int:
    """The retries counted in this process and its loader workers so far."""
    return int(COUNT.value)


def wait_s(attempt: int) -> float:
    """The pause before try ``attempt + 1``: doubling from :data:`FIRST_WAIT_S`, jittered by up to a
    quarter (loader workers throttled at once do not all come back at once)."""
    base = min(LONGEST_WAIT_S, FIRST_WAIT_S * float(2 ** (attempt - 1)))
    return base * (1 + random.random() / 4)  # noqa: S311 - jitter, not secrecy


def fetch(stream: StreamOptions, url: str, target: str) -> int:
    """Download ``url`` (``s3://bucket/key``) to the file ``target`` (written whole, then renamed);
    returns the retries it took. DataError when it fails for good."""
    parts = urlsplit(url)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    partial = f"{target}.partial-{os.getpid()}"
    attempt = 0
    while True:
        try:
            stores.download_object(stream, bucket, key, partial)
            os.replace(partial, target)
            return attempt
        except DataError as error:
            with suppress(FileNotFoundError):
                os.remove(partial)
            why = stores.transient(error.__cause__) if error.__cause__ is not None else None
            if why is None:
                raise
            attempt += 1
            if attempt > RETRIES:
                raise DataError(
                    f"{url}: the store still answered {why} after {RETRIES} retries; the run stopped rather than "
                    "skip the chunk's samples: resume it (--resume) once the store answers"
                ) from None
            pause = wait_s(attempt)
            with COUNT.get_lock():
                COUNT.value += 1
            screen.each(f"runjob: {url}: {why}; retry {attempt} of {RETRIES} in {pause:.1f} s", err=True)
            time.sleep(pause)


class CountedS3Downloader(S3Downloader):  # type: ignore[misc]  # LitData has no type information
    """LitData's S3 downloader whose chunk downloads go through :func:`fetch`: retries said and
    counted. Two workers asking for one chunk: one downloads it, the other finds it (a lock file
    beside it, as LitData's own downloaders do). Its asynchronous methods are the base class's:
    LitData then runs the prefetch's downloads in threads through :meth:`download_file`, instead of
    obstore's client, whose retries nobody sees."""

    adownload_file = Downloader.adownload_file
    adownload_fileobj = Downloader.adownload_fileobj

    def __init__(
        self,
        remote_dir: str,
        cache_dir: str,
        chunks: list[dict[str, object]],
        storage_options: dict[str, object] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(remote_dir, cache_dir, chunks, storage_options, **kwargs)
        endpoint = self._storage_options.get("endpoint_url")
        self.stream = StreamOptions(location=remote_dir, endpoint_url=str(endpoint) if endpoint else None)

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        if os.path.exists(local_filepath):
            return
        wait = 1 if remote_filepath.endswith(INDEX_FILE) else 0
        with suppress(Timeout, FileNotFoundError), FileLock(local_filepath + ".lock", timeout=wait):
            if os.path.exists(local_filepath):
                return
            os.makedirs(os.path.dirname(local_filepath) or ".", exist_ok=True)
            fetch(self.stream, remote_filepath, local_filepath)
            self._notify_published(local_filepath)


def use_counted_downloads() -> None:
    """Make LitData download ``s3://`` chunks with :class:`CountedS3Downloader` (before the loader
    workers fork)."""
    register_downloader("s3://", CountedS3Downloader, overwrite=True)
