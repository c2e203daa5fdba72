"""Where a run came from: each job value's source, and the job file's git commit."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runjob.host.components import DatasetSplits
from runjob.host.plugin_host import LOCAL_FACT
from runjob.job.redaction import redact_tables, redact_text
from runjob.record.local import flatten
from runjob.tags import GIT_BRANCH_TAG, GIT_COMMIT_TAG, GIT_DIRTY_TAG, GIT_REPO_URL_TAG

if TYPE_CHECKING:
    from runjob.job.validation import ResolvedJob


def job_sources(job: ResolvedJob) -> dict[str, dict[str, Any]]:
    """For every dotted key of the resolved job: its value (secrets hidden) and where it came from:
    ``{"from": "job file" | "extends" | "--set" | "default", "file": ..., "line": ...}``."""
    main_file = str(job.source.path)
    sources: dict[str, dict[str, Any]] = {}
    for key, value in flatten(redact_tables(job.to_dict())).items():
        origin = job.source.origins.get(key)
        if origin is None:
            sources[key] = {"value": value, "from": "default"}
        elif origin.from_override:
            sources[key] = {"value": value, "from": "--set"}
        else:
            kind = "job file" if origin.file == main_file else "extends"
            sources[key] = {"value": value, "from": kind, "file": str(Path(origin.file).resolve()), "line": origin.line}
    _name_local_plugins(job, sources)
    return sources


def _name_local_plugins(job: ResolvedJob, sources: dict[str, dict[str, Any]]) -> None:
    """Each key of a table whose component a local plugin (``-p``) provided says so: ``"plugin":
    "NAME (local /path/to/file.py)"``, the code that is not in any installed package."""
    tables = {table: getattr(job, table, None) for table in ("model", "dataset", "optimizer", "scheduler", "strategy")}
    tables["task"] = getattr(job, "task", None)
    tables.update({f"callbacks.{name}": chosen for name, chosen in getattr(job, "callbacks", {}).items()})
    tables.update({f"model.adapters.{name}": chosen for name, chosen in getattr(job, "adapters", {}).items()})
    for prefix, chosen in tables.items():
        plugin = chosen.component.facts.get(LOCAL_FACT) if chosen is not None else None
        if not plugin:
            continue
        for key, source in sources.items():
            adapter = prefix == "model" and key.startswith("model.adapters.")  # the adapter's own plugin
            if key.startswith(prefix + ".") and not adapter:
                source["plugin"] = plugin


def git_tags(job_file: Path) -> dict[str, str]:
    """The commit (and whether the tree has uncommitted changes) of the git repository holding
    ``job_file``, as MLflow's standard source tags; empty when it isn't in one."""
    folder = job_file.resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    tags = {GIT_COMMIT_TAG: commit, GIT_DIRTY_TAG: "true" if git("status", "--porcelain") else "false"}
    remote = git("config", "--get", "remote.origin.url")
    if remote:
        tags[GIT_REPO_URL_TAG] = redact_text(remote)
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    if branch and branch != "HEAD":
        tags[GIT_BRANCH_TAG] = branch
    return tags


def dataset_lineage(job: ResolvedJob, splits: DatasetSplits) -> dict[str, str]:
    """The dataset as an MLflow input: name, digest, source and a small profile. A plugin's own
    ``source``/``digest`` win; otherwise the digest fingerprints the dataset's options and sizes."""
    assert isinstance(splits, DatasetSplits)  # a plugin's object reached here as one
    options = job.to_dict()["dataset"]
    sizes = {"train_samples": len(splits.train), "val_samples": len(splits.val), "num_classes": splits.num_classes}
    digest = splits.digest or hashlib.sha256(json.dumps([options, sizes], sort_keys=True).encode()).hexdigest()[:16]
    root = options.get("root") if isinstance(options, dict) else None
    source = splits.source or (
        str(Path(root).resolve()) if isinstance(root, str) and root else f"runjob:{job.dataset.name}"
    )
    schemes = {"http://": "http", "https://": "http", "s3://": "s3", "gs://": "gs"}
    kind = "local" if source.startswith("/") else next((k for p, k in schemes.items() if source.startswith(p)), "code")
    return {
        "name": job.dataset.name,
        "digest": digest,
        "source_type": kind,
        "source": json.dumps({"uri": source}),
        "profile": json.dumps(sizes),
    }
