"""The plugin's callback, loss_plateau: its options checked by `runjob validate`, a run it stops
ending FINISHED with exit 0, and its count carried across a resume by the checkpoint."""

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
    assert run.mlflow.models() == {"plateau"} and "best/best.json" in run.mlflow.artifacts("best")


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
