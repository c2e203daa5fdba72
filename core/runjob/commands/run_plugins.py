"""The local plugins a run was trained with (``-p``), as its ``runjob.plugins.local`` tag records
them: ``runjob rerun`` loads them again, and ``evaluate``, ``predict`` and ``export`` ask for them,
since the run's job names their components. Nothing is imported from a run's record: runs are data."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.errors import RunjobError
from runjob.host.plugin_host import PLUGIN_FLAG
from runjob.record.local import RunRecord
from runjob.record.store import get_run, open_store, reading
from runjob.tags import LOCAL_PLUGINS_TAG

if TYPE_CHECKING:
    from runjob.host.plugin_host import PluginHost
    from runjob.train.trained import TrainedRun


def recorded_plugins(text: str | None, run: str) -> list[dict[str, str]]:
    """The local plugins a run recorded in its ``runjob.plugins.local`` tag (``text``), each as
    :meth:`runjob.host.plugin_host.LocalPlugin.record` wrote it."""
    if not text:
        return []
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, list) or not all(isinstance(item, dict) and "name" in item for item in found):
        raise RunjobError(f"run {run}'s tag runjob.plugins.local is not a list of plugins: {text[:200]}")
    return found


def plugin_argument(item: dict[str, str]) -> str:
    """The ``-p`` value that loads a recorded plugin here: its file, its module (with the folder it
    is importable from, unless that is the working directory); "" for an object of the run's process."""
    if item.get("kind") == "file" and item.get("path"):
        return item["path"]
    if item.get("kind") == "module" and item.get("module"):
        here = item.get("directory") in (None, "", str(Path.cwd().resolve()))
        return item["module"] if here else f"{item['module']}@{item['directory']}"
    return ""


def require_run_plugins(run: TrainedRun, host: PluginHost, command: str) -> None:
    """Refuse, in one line, to use a run trained with local plugins that this command was not
    given (by name): the line names them and the ``-p`` to add."""
    loaded = {info.name for info in host.plugins if info.local is not None}
    missing = [item for item in recorded_plugins(_local_tag(run), run.label) if item["name"] not in loaded]
    if not missing:
        return
    used = ", ".join(
        f"{item['name']} ({item.get('path') or item.get('given', 'an object of its process')})" for item in missing
    )
    flags = [plugin_argument(item) for item in missing]
    add = " ".join(f"{PLUGIN_FLAG} {shlex.quote(flag)}" for flag in flags if flag)
    objects = "" if all(flags) else "; put an object of the run's process in a file and give its path with -p"
    raise RunjobError(
        f"run {run.label} was trained with local plugins {used}, which this command was not given: "
        f"add {add or '-p PATH'} to `runjob {command}`{objects}"
    )


def _local_tag(run: TrainedRun) -> str | None:
    """The run's ``runjob.plugins.local`` tag: from its local record where its folder is here, else MLflow's."""
    if run.output_dir is not None:
        record = RunRecord.read(run.output_dir)
        if record is not None:
            return record.tags.get(LOCAL_PLUGINS_TAG)
    if run.run_id is None or run.tracking_uri is None:
        return None

    with reading(run.tracking_uri):
        found = get_run(open_store(run.tracking_uri), run.tracking_uri, run.run_id)
    tags: dict[str, str] = found.data.tags
    return tags.get(LOCAL_PLUGINS_TAG)
