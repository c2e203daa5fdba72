"""The plugin, seen from runjob: it is listed, its options are checked, and tiny_mlp trains."""

from digits_jobs import tiny_mlp_digits

JOB = tiny_mlp_digits("tiny", image_size=16)


def test_runjob_lists_the_plugin_and_its_model(runjob_with_plugin):
    result = runjob_with_plugin.cli("plugins")
    assert result.returncode == 0, result.stderr
    assert "tinymlp  (runjob-tinymlp 0.1.0, runjob_tinymlp)" in result.stdout
    assert "models: tiny_mlp" in result.stdout
    assert "FAILED" not in result.stdout


def test_bad_options_are_reported_against_the_job_file(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    result = runjob_with_plugin.cli("validate", "job.toml", "--set", "model.hidden_size=0", "--set", "model.dropout=1")
    assert result.returncode == 2
    assert (
        "runjob: --set model.hidden_size=0: model.hidden_size: Input should be greater than or equal to 1 (got 0)"
        in result.stderr
    )
    assert "model.dropout: Input should be less than 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_tiny_mlp_learns_the_digits(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    run = runjob_with_plugin.run("job.toml", output_dir="out")
    assert run.exit_code == 0 and run.status == "FINISHED"
    assert run.tags["runjob.plugin.tinymlp"] == "runjob-tinymlp 0.1.0"
    assert run.params["model.hidden_size"] == "32"
    assert run.metrics["val/accuracy"] > 0.8  # well above chance (0.1)
    assert {"job.toml", "metrics.jsonl", "model.safetensors"} <= run.files
    assert len(run.local_history("val/accuracy")) == 2  # one evaluation an epoch


def test_wrong_input_size_is_a_clear_error(runjob_with_plugin):
    runjob_with_plugin.write_job("job.toml", JOB)
    result = runjob_with_plugin.cli("job.toml", "--set", "model.in_features=100")
    assert result.returncode == 2
    assert result.stderr_lines[-1] == (
        "runjob: model 'tiny_mlp' cannot take the inputs of dataset 'digits' (a batch of shape (64, 3, 16, 16)): "
        "addmm: mat1 and mat2 shapes cannot be multiplied (64x768 and 100x32)"
    )
    assert "Traceback" not in result.stderr
