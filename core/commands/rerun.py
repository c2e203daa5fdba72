"""``runjob rerun RUN_ID``: train a recorded run's ``job.toml`` again, tagged as its rerun."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from runjob.commands.arguments import overrides_from
from runjob.errors import RunjobError
from runjob.host.run_folder import RunFolder
from runjob.job.keys import flat
from runjob.job.redaction import HIDDEN
from runjob.record.store import download_job, get_run, open_store, reading
from runjob.record.uri import resolve_tracking_uri

RERUN_TAG = "runjob.rerun_of"


def _is_hidden(value: Any) -> bool:
    if isinstance(value, str):
        return value == HIDDEN or f":{HIDDEN}@" in value  # a hidden key, or a URL's hidden password
    if isinstance(value, list):
        return any(_is_hidden(item) for item in value)
    return False


def hidden_keys(tables: dict[str, Any]) -> list[str]:
    """The dotted keys of ``tables`` whose values were hidden (``***``) when the job was recorded."""
    return [key for key, value in flat(tables).items() if _is_hidden(value)]


def _check_secrets_given(job: dict[str, Any], overrides: list[str], run_id: str) -> None:
    """Refuse a job with hidden secrets unless ``--set`` gives each of them (or a table above it)."""
    from runjob.job.jobfile import split_dotted

    given = [".".join(split_dotted(o.partition("=")[0])) for o in overrides]
    missing = [k for k in hidden_keys(job) if not any(k == g or k.startswith(g + ".") for g in given)]
    if missing:
        raise RunjobError(
            f"run {run_id}'s job.toml has secrets hidden as {HIDDEN}: {', '.join(missing)}; give them with --set, e.g. "
            f"--set {missing[0]}=VALUE"
        )


def _tracking_uri_for(args: argparse.Namespace, job: dict[str, Any]) -> str | None:
    """Where the new run records when its job names no tracking URI: the store the old run was read
    from, so both runs are in the same place. A job that names one records there (said on stderr)."""
    recorded_uri = job.get("tracking", {}).get("uri")
    overridden = any(o.partition("=")[0].strip() == "tracking.uri" for o in args.overrides)
    if args.tracking_uri and recorded_uri and recorded_uri != args.tracking_uri and not overridden:
        print(
            f"runjob: the job records to tracking.uri = {recorded_uri}, so the new run goes there "
            "(--set tracking.uri=URI to change)",
            file=sys.stderr,
        )
    return args.tracking_uri


def cmd_rerun(args: argparse.Namespace) -> int:
    """``runjob rerun RUN_ID``: train run RUN_ID's recorded job again, as ``runjob run`` would, with
    any ``--set`` changes; the new run is tagged ``runjob.rerun_of = RUN_ID``."""
    from runjob.host.plugin_host import load_plugins
    from runjob.job.jobfile import load_job
    from runjob.job.validation import load_resolved
    from runjob.record.outputs import choose_output_dir
    from runjob.train.entry import run

    uri = resolve_tracking_uri(args.tracking_uri)
    client = open_store(uri)
    overrides = overrides_from(args)
    host = load_plugins()
    with tempfile.TemporaryDirectory(prefix="runjob-rerun-") as folder:
        with reading(uri):
            get_run(client, uri, args.run_id)
            downloaded = download_job(uri, args.run_id, Path(folder))
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
    print(f"runjob: rerunning {args.run_id} from {job_file}", file=sys.stderr)
    outcome = run(
        job_file,
        overrides,
        output_dir=output_dir,
        tags={RERUN_TAG: args.run_id},
        tracking_uri=_tracking_uri_for(args, recorded),
        host=host,
        job=resolved,
    )
    return outcome.exit_code
