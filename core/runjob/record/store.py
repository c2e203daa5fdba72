"""Reading runs back from an MLflow store: opening it (a missing sqlite file is an error, not an
empty store), one-line errors for anything that fails, a run by id, every experiment, a run's
``job.toml`` artifact."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.errors import RunjobError, TrackingError, describe
from runjob.host.run_folder import JOB_FILE, WEIGHTS_FILE
from runjob.record.uri import check_reachable, sqlite_path

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Experiment, Run


def open_store(uri: str) -> MlflowClient:
    """An ``MlflowClient`` for ``uri``; a sqlite file that does not exist is an error (MLflow would
    silently create an empty one, and every query would then find nothing)."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow import MlflowClient

    check_reachable(uri, "--tracking-uri or $MLFLOW_TRACKING_URI")
    path = sqlite_path(uri)
    if path:
        if path != ":memory:" and not Path(path).exists():
            raise TrackingError(
                f"no MLflow database at {uri} ({Path(path).absolute()} does not exist); run where you trained, or give "
                "--tracking-uri"
            )
    return MlflowClient(tracking_uri=uri)


@contextlib.contextmanager
def reading(uri: str) -> Iterator[None]:
    """Turn any failure to read from MLflow into a one-line error naming the store."""
    try:
        yield
    except RunjobError:
        raise
    except Exception as error:  # noqa: BLE001 - unreachable server, bad store: the same to the user
        raise TrackingError(f"cannot read from MLflow at {uri}: {describe(error)}") from None


def get_run(client: MlflowClient, uri: str, run_id: str) -> Run:
    """The run ``run_id``; an unknown id is a one-line error."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as error:
        if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise RunjobError(f"no run {run_id} at {uri}") from None
        raise


def all_experiments(client: MlflowClient) -> list[Experiment]:
    experiments: list[Experiment] = []
    token: str | None = None
    while True:
        page = client.search_experiments(page_token=token)
        experiments.extend(page)
        token = page.token
        if not token:
            return experiments


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block (worker processes inherit them), then restore."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def download_artifact(uri: str | None, run_id: str, name: str, folder: Path) -> Path | None:
    """Download artifact ``name`` (a file or folder) of run ``run_id`` into ``folder``, without
    MLflow's progress bar; ``None`` when the run or the artifact does not exist. Any other failure
    to read from MLflow is a one-line TrackingError naming the store."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    folder.mkdir(parents=True, exist_ok=True)
    try:
        with environment({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}):
            try:
                return Path(
                    download_artifacts(run_id=run_id, artifact_path=name, tracking_uri=uri, dst_path=str(folder))
                )
            except (MlflowException, FileNotFoundError) as missing:
                if name != FINAL_WEIGHTS or not _missing(missing):
                    raise
                return _logged_model_weights(uri, run_id, folder)
    except (MlflowException, OSError) as error:
        if _missing(error):
            return None
        raise TrackingError(f"cannot read from MLflow at {uri}: {describe(error)}") from None


FINAL_WEIGHTS = WEIGHTS_FILE


def _missing(error: BaseException) -> bool:
    return getattr(error, "error_code", None) == "RESOURCE_DOES_NOT_EXIST" or isinstance(error, FileNotFoundError)


LOGGED_MODEL_WEIGHTS = "data/run"
"""Where runjob's MLflow model keeps the final weights (``runjob.record.trained_model``)."""


def _logged_model_weights(uri: str | None, run_id: str, folder: Path) -> Path | None:
    """The final weights of a run whose logged model holds them (``tracking.log_model =
    "weights"``: stored there once, not also as the run's own ``model.safetensors``)."""
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    found = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    # named after the job (its param job.name); "model" in runs recorded before that
    names = [name for name in (run.data.params.get("job.name"), "model") if name]
    named = sorted((m for m in found if m.name in names), key=lambda m: names.index(m.name))
    if not named:
        return None
    # data/run/ in runjob's model; artifacts/ in one logged before the model held data only
    for place in (LOGGED_MODEL_WEIGHTS, "artifacts"):
        location = f"{named[0].artifact_location.rstrip('/')}/{place}/{FINAL_WEIGHTS}"
        try:
            return Path(download_artifacts(artifact_uri=location, tracking_uri=uri, dst_path=str(folder)))
        except (MlflowException, OSError) as error:
            if not _missing(error):
                raise
    return None


def download_job(uri: str, run_id: str, folder: Path) -> Path:
    """Download run ``run_id``'s ``job.toml`` artifact into ``folder``; its absence is an error."""
    path = download_artifact(uri, run_id, JOB_FILE, folder)
    if path is None:
        raise RunjobError(
            f"run {run_id} has no job.toml artifact: it was not made by runjob, or its job.toml is missing"
        )
    return path
