"""A sweep's parent run links to its best trial's run where MLflow's UI makes a link of it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import RESNET18_DIGITS

from runjob.sweep.parent import NOTE_TAG, best_trial_note


def test_the_parent_describes_its_best_trial_with_a_link_to_its_run():
    note = best_trial_note(3, "0a1b2c", ["optimizer.lr=0.01", "train.batch_size=64"], "val/accuracy", 0.951234)
    assert note == "Best trial: [trial 3](#/runs/0a1b2c), val/accuracy 0.9512: `optimizer.lr=0.01 train.batch_size=64`"
    assert NOTE_TAG == "mlflow.note.content", "the run's description, shown as Markdown"
    assert best_trial_note(0, "", [], None, None) == "Best trial: trial 0", "no run recorded: no link"


def test_the_installed_mlflow_ui_has_the_route_the_link_takes():
    """The UI routes after '#' (a hash router) and opens a run by its id alone at /runs/RUN_ID."""
    package = Path(next(iter(importlib.util.find_spec("mlflow").submodule_search_locations)))
    bundle = "".join(p.read_text(encoding="utf-8") for p in (package / "server/js/build/static/js").glob("main.*.js"))
    assert '"/runs/:runUuid"' in bundle and "createHashRouter" in bundle


@pytest.mark.timeout(180)
def test_a_finished_sweeps_parent_run_holds_the_link_as_its_description(tmp_path, monkeypatch):
    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved
    from runjob.sweep.parent import ParentRun, sweep_params
    from runjob.sweep.study import SweepStudy, budget_of
    from runjob.tags import RUN_ID_ATTR as RUN_ID
    from runjob.testing import MlflowRun, write_job

    write_job(
        tmp_path / "job.toml",
        RESNET18_DIGITS.format(name="sw") + '\n    [sweep]\n    [sweep.parameters]\n    "optimizer.lr" = [0.1, 0.01]\n',
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    job = load_resolved(tmp_path / "job.toml", [], load_plugins())
    study = SweepStudy.create(job.sweep, tmp_path / "sweep", "s")
    params = sweep_params(job.sweep, budget_of(job.sweep), "s", study.storage)
    parent = ParentRun.start(job, params, {"runjob.sweep": "true"}, tmp_path / "sweep")
    study.join()
    for value, run_id in ((0.5, "run-of-trial-0"), (0.9, "run-of-trial-1")):
        claim = study.claim()
        claim.lock.release()
        study.mark(claim.number, {RUN_ID: run_id})
        study.tell(claim.number, value, "complete")
    parent.finish(study, "FINISHED", None)
    run = MlflowRun.get(f"sqlite:///{tmp_path / 'mlflow.db'}", parent.run_id)
    assert run.tags[NOTE_TAG] == "Best trial: [trial 1](#/runs/run-of-trial-1), val/accuracy 0.9: `optimizer.lr=0.01`"
