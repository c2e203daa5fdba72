"""``runjob rerun RUN_ID``: train a recorded run's ``job.toml`` again, with the local plugins it
had (``-p``), tagged as its rerun."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from runjob.commands.arguments import overrides_from
from runjob.commands.run_plugins import recorded_plugins
from runjob.errors import RunjobError
from runjob.host.output import screen
from runjob.host.plugin_host import PLUGIN_FLAG, file_sha256, load_plugins, local_plugins, using_local_plugins
from runjob.host.run_folder import RunFolder
from runjob.job.jobfile import load_job, split_dotted
from runjob.job.keys import flat
from runjob.job.redaction import HIDDEN
from runjob.job.validation import load_resolved
from runjob.record.outputs import choose_output_dir
from runjob.record.store import download_job, get_run, open_store, reading
from runjob.record.uri import resolve_tracking_uri
from runjob.tags import LOCAL_PLUGINS_TAG, RERUN_OF_TAG
from runjob.train.entry import run

if TYPE_CHECKING:
    from runjob.host.plugin_host import LocalPlugin
    from runjob.job.jobfile import Tables


def _is_hidden(value: object) -> bool:
    if isinstance(value, str):
        return value == HIDDEN or f":{HIDDEN}@" in value  # a hidden key, or a URL's hidden password
    if isinstance(value, list):
        return any(_is_hidden(item) for item in value)
    return False


def hidden_keys(tables: Mapping[str, object]) -> list[str]:
    """The dotted keys of ``tables`` whose values were hidden (``***``) when the job was recorded."""
    return [key for key, value in flat(tables).items() if _is_hidden(value)]


def _check_secrets_given(job: Tables, overrides: list[str], run_id: str) -> None:
    """Refuse a job with hidden secrets unless ``--set`` gives each of them (or a table above it)."""
    given = [".".join(split_dotted(o.partition("=")[0])) for o in overrides]
    missing = [k for k in hidden_keys(job) if not any(k == g or k.startswith(g + ".") for g in given)]
    if missing:
        raise RunjobError(
            f"run {run_id}'s job.toml has secrets hidden as {HIDDEN}: {', '.join(missing)}; give them with --set, e.g. "
            f"--set {missing[0]}=VALUE"
        )


def _tracking_uri_for(args: argparse.Namespace, job: Tables) -> str | None:
    """Where the new run records when its job names no tracking URI: the store the old run was read
    from, so both runs are in the same place. A job that names one records there (said on stderr)."""
    recorded_uri = job.get("tracking", {}).get("uri")
    overridden = any(o.partition("=")[0].strip() == "tracking.uri" for o in args.overrides)
    if args.tracking_uri and recorded_uri and recorded_uri != args.tracking_uri and not overridden:
        screen.each(
            f"runjob: the job records to tracking.uri = {recorded_uri}, so the new run goes there "
            "(--set tracking.uri=URI to change)",
            err=True,
        )
    given: str | None = args.tracking_uri
    return given


def cmd_rerun(args: argparse.Namespace) -> int:
    """``runjob rerun RUN_ID``: train run RUN_ID's recorded job again, as ``runjob run`` would, with
    any ``--set`` changes and the local plugins it had (``-p``); the new run is tagged
    ``runjob.rerun_of = RUN_ID``."""
    uri = resolve_tracking_uri(args.tracking_uri)
    client = open_store(uri)
    with tempfile.TemporaryDirectory(prefix="runjob-rerun-") as folder:
        with reading(uri):
            recorded_run = get_run(client, uri, args.run_id)
            downloaded = download_job(uri, args.run_id, Path(folder))
        local = rerun_plugins(args.run_id, recorded_run.data.tags.get(LOCAL_PLUGINS_TAG))
        with using_local_plugins(local):  # before the job is read: it may name their components
            return _rerun(args, downloaded)


def _rerun(args: argparse.Namespace, downloaded: Path) -> int:
    overrides = overrides_from(args)
    host = load_plugins()
    recorded = tomllib.loads(downloaded.read_text(encoding="utf-8"))
    _check_secrets_given(recorded, args.overrides, args.run_id)
    resolved = load_resolved(downloaded, overrides, host)  # a bad --set fails before any folder is made
    # The copy lives in the new run's folder: the run's runjob.job_file tag and its workers point at it.
    output_dir = choose_output_dir(resolved.job.name, args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    job_file = RunFolder(output_dir).rerun_source_file  # the downloaded job.toml, kept in the new run's folder
    shutil.copyfile(downloaded, job_file)
    # the same text, so the same job: only where its values were written (for job_sources) changes
    resolved = replace(resolved, source=load_job(job_file, overrides))
    screen.each(f"runjob: rerunning {args.run_id} from {job_file}", err=True)
    outcome = run(
        job_file,
        overrides,
        output_dir=output_dir,
        tags={RERUN_OF_TAG: args.run_id},
        tracking_uri=_tracking_uri_for(args, recorded),
        host=host,
        job=resolved,
    )
    return outcome.exit_code


def rerun_plugins(run_id: str, text: str | None) -> list[LocalPlugin]:
    """The local plugins of the rerun: those given with ``-p`` (or ``$RUNJOB_PLUGINS``), and each
    one the run recorded that none of them replaces by name, imported again from where the run
    had it (never from the record: a run is data), provided its file is still there as it was."""
    given = local_plugins()
    names = {plugin.name for plugin in given}
    again: list[str] = []
    for item in recorded_plugins(text, run_id):
        name, path = item["name"], item.get("path", "")
        if name in names:
            continue
        other = f"or {PLUGIN_FLAG} PATH for another"
        if item.get("kind") not in ("file", "module") or not path:
            raise RunjobError(
                f"run {run_id} was trained with {item.get('given', name)}, an object of its own process, which a rerun "
                f"cannot load; put it in a file and give it with {PLUGIN_FLAG} PATH"
            )
        if not Path(path).is_file():
            raise RunjobError(
                f"run {run_id}'s local plugin {name} ({path}) is gone; give it with {PLUGIN_FLAG} PATH (a file or a "
                "module importable here)"
            )
        now = file_sha256(path)
        if item.get("sha256") and now != item["sha256"]:
            raise RunjobError(
                f"run {run_id}'s local plugin {name} ({path}) has changed since the run (sha256 {item['sha256'][:12]} "
                f"then, {now[:12]} now); give {PLUGIN_FLAG} {path} to use it as it is now, {other}"
            )
        spec = path if item["kind"] == "file" else f"{item.get('module', name)}@{item.get('directory', '')}"
        plugin = local_plugins([spec], environ={})[0]
        if Path(plugin.path) != Path(path):  # the module name now imports another file
            raise RunjobError(
                f"run {run_id}'s local plugin {name} was {path}, but {item.get('module', name)} now imports from "
                f"{plugin.path}; give the run's with {PLUGIN_FLAG} {path}, {other}"
            )
        again.append(spec)
    return local_plugins(again)
