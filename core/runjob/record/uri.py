"""Where a run is recorded, and whether it can be: the tracking URI (given, ``$MLFLOW_TRACKING_URI``
or MLflow's default), the experiment's name, a tracking server's ``/health``, MLflow's HTTP retries.

Used on both sides, by the training process (which never imports MLflow; only the default URI's
resolution does) and by whatever writes to MLflow (:mod:`runjob.record.mlflow_writer`).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runjob.errors import TrackingError

if TYPE_CHECKING:
    from runjob.job.schema import TrackingTable

REACH_TIMEOUT_S = 5.0  # an unreachable tracking server is reported within this (twice at most)
# MLflow's HTTP retries default to minutes of back-off; a lost server should cost seconds.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def bound_http_retries() -> None:
    """MLflow's HTTP retries for this process, as ``HTTP_DEFAULTS`` (the user's own environment
    variables win)."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def check_reachable(uri: str, setting: str = "tracking.uri") -> None:
    """Fail within seconds, with a clear message, when a tracking server does not answer.
    ``setting`` names where the URI came from, for the message. Also bounds MLflow's retries."""
    bound_http_retries()
    if urllib.parse.urlparse(uri).scheme not in ("http", "https"):
        return
    health = probe_health(uri)
    if health.status is not None and health.status >= 500:
        raise TrackingError(
            f"the MLflow tracking server at {uri} ({setting}) answers {health.url} with HTTP {health.status}"
        )
    if health.status is None:  # no answer at all; an HTTP 4xx still means a server is there
        reason = health.error
        advice = (
            "Start it, fix tracking.uri or $MLFLOW_TRACKING_URI, or set tracking.offline = true to record in the "
            "output folder and upload later with `runjob sync OUTPUT_DIR`"
            if setting == "tracking.uri"
            else "Start it, or give another with --tracking-uri"
        )
        raise TrackingError(f"cannot reach the MLflow tracking server at {uri} ({setting}): {reason}. {advice}")


@dataclass(frozen=True)
class Health:
    """What ``GET <server>/health`` gave: the HTTP status, or the reason there was no answer."""

    url: str
    status: int | None
    error: BaseException | None = None


def probe_health(uri: str, timeout: float = REACH_TIMEOUT_S) -> Health:
    """Ask an MLflow server's ``/health`` once, waiting at most ``timeout`` seconds."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            answer.read(100)
            return Health(url, answer.status)
    except urllib.error.HTTPError as error:
        return Health(url, error.code, error)
    except (OSError, ValueError) as error:
        # "[Errno 111] Connection refused", not "<urlopen error [Errno 111] ...>"
        reason = getattr(error, "reason", None)  # a URLError's: what stopped the request
        return Health(url, None, reason if isinstance(reason, BaseException) else error)


def sqlite_path(uri: str) -> str | None:
    """The database file of a ``sqlite:`` URI (``""`` or ``":memory:"`` for an in-memory one), or
    None when the URI is not sqlite."""
    if not uri.lower().startswith("sqlite:"):
        return None
    return uri[len("sqlite:") :].removeprefix("//").partition("?")[0].removeprefix("/")


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """``explicit``, else ``$MLFLOW_TRACKING_URI``, else MLflow's default (``sqlite:///mlflow.db``)."""
    return tracking_uri_and_source(explicit)[0]


def tracking_uri_and_source(explicit: str | None = None, setting: str = "tracking.uri") -> tuple[str, str]:
    """The tracking URI a run would use and where it came from: ``explicit`` (named ``setting``),
    else ``$MLFLOW_TRACKING_URI``, else MLflow's default."""
    if explicit:
        return explicit, setting
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    import mlflow  # lazy: the training process imports this module and never imports mlflow (record.mirror)

    return mlflow.get_tracking_uri(), "MLflow's default"


def default_experiment(tracking: TrackingTable, job_name: str) -> str:
    """``tracking.experiment``, else ``$MLFLOW_EXPERIMENT_NAME``, else the job's name."""
    return tracking.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or job_name
