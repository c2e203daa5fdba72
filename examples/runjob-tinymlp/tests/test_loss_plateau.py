"""The plugin's callback, loss_plateau: what it counts and when it asks to stop (driven through
the loop's events with runjob.testing's fake run, in milliseconds), its options checked by
`runjob validate`, a run it stops ending FINISHED with exit 0, and its count carried across a
resume by the checkpoint."""

import pytest
from digits_jobs import tiny_mlp_digits

JOB = tiny_mlp_digits(
    "plateau",
    tables="""
    [callbacks.loss_plateau]
    patience = 2
    min_delta = 100.0   # no loss is 100 lower than the first: every later log step is on the plateau
""",
    train="    log_every = 5\n",
)


@pytest.fixture
def plateau(runjob_with_plugin):
    """A loss_plateau callback factory, from the plugin as installed."""
    from runjob_tinymlp import LossPlateau, LossPlateauOptions

    return lambda **options: LossPlateau(LossPlateauOptions(**options))


def test_the_count_resets_at_each_new_lowest_and_the_patience_ends_training(plateau):
    from runjob.testing import drive

    # logged every 2 steps, the mean of each two: 4.5, 3.5, 3.48 and 3.6 (not 0.05 below 3.5), 3.0,
    # 3.2, 2.97 (not 0.05 below 3.0) and 3.3: the third log step in a row without a new lowest
    losses = [5, 4, 4, 3, 3.5, 3.46, 3.6, 3.6, 3, 3, 3.2, 3.2, 2.97, 2.97, 3.3, 3.3, 1, 1, 1, 1]
    run = drive(plateau(patience=3, min_delta=0.05), steps=20, log_every=2, losses=losses)
    assert run.history("train/plateau_steps") == [(2, 0), (4, 0), (6, 1), (8, 2), (10, 0), (12, 1), (14, 2), (16, 3)]
    assert run.stop_requests == [(16, "loss_plateau: no new lowest train/loss (3) for 3 log steps")]
    assert run.step == 16, "training ends at the log step that asked"
    assert run.history("train/loss")[-1] == (16, 3.3), "the count is recorded with runjob's own metrics"


def test_the_count_goes_on_from_a_checkpoint(plateau):
    from runjob.testing import drive

    first = plateau(patience=5)
    drive(first, steps=4, log_every=1, losses=[2, 1, 1, 1])
    assert first.state_dict() == {"lowest": 1.0, "plateau": 2}
    resumed = plateau(patience=5)
    resumed.load_state_dict(first.state_dict())
    run = drive(resumed, steps=4, log_every=1, losses=1.0)
    assert run.history("train/plateau_steps") == [(1, 3), (2, 4), (3, 5)] and run.stop_reason


def test_validate_checks_the_callbacks_options(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    result = runjob_with_plugin.cli("validate", "job.toml", "--set", "callbacks.loss_plateau.patience=0")
    assert result.returncode == 2
    assert result.stderr_lines == [
        "runjob: --set callbacks.loss_plateau.patience=0: callbacks.loss_plateau.patience: "
        "Input should be greater than or equal to 1 (got 0)"
    ]


def test_a_plateau_stops_the_run_finished_with_its_models(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    run = runjob_with_plugin.run("job.toml", output_dir="out")
    assert run.exit_code == 0 and run.status == "FINISHED"
    stopped = run.tags["runjob.stopped"]
    assert stopped.startswith("loss_plateau: no new lowest train/loss (") and stopped.endswith("for 2 log steps")
    assert run.tags["runjob.stopped.step"] == "15", "log steps 5 (the lowest), 10 (1), 15 (2): stop"
    assert run.mlflow.history("train/plateau_steps") == [(5, 0.0), (10, 1.0), (15, 2.0)]
    assert run.mlflow.models() == {"plateau"} and "models.json" in run.mlflow.artifacts()


def test_the_count_survives_a_resume(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB.replace("patience = 2", "patience = 3"))
    first = runjob_with_plugin.cli("job.toml", "--output-dir", "out", "--set", "train.max_steps=10")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = runjob_with_plugin.cli("job.toml", "--output-dir", "out", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = runjob_with_plugin.only_run("plateau")
    assert run.tags["runjob.stopped.step"] == "20"
    counted = runjob_with_plugin.record("out").local_history("train/plateau_steps")
    assert counted == [(5, 0.0), (10, 1.0), (15, 2.0), (20, 3.0)], "the count went on from the checkpoint"
