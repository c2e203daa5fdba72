"""The run folder's owner names every path a run writes, as users see them."""

from __future__ import annotations

from pathlib import Path

from runjob.host.run_folder import RunFolder, checkpoint_name, checkpoint_step


def test_every_path_of_a_run_folder(tmp_path):
    folder = RunFolder(tmp_path)
    named = {
        "job.toml": folder.job_file,
        "model.safetensors": folder.weights,
        "models.json": folder.models_file,
        "best": folder.best_dir,
        "best/model.safetensors": folder.best_weights,
        "best/best.json": folder.best_file,
        "record": folder.record_dir,
        "record/job.toml": folder.recorded_job_file,
        "record/job_sources.json": folder.job_sources_file,
        "mlflow_run.json": folder.run_record_file,
        "metrics.jsonl": folder.metrics_file,
        "metrics.node2.jsonl": folder.node_metrics_file(2),
        "mlflow_model": folder.mlflow_model_dir,
        "predictor": folder.predictor_dir,
        "prediction.pkl": folder.pickled_predictor_file,
        "runjob.log": folder.log_file,
        "rerun_source.toml": folder.rerun_source_file,
        "model.onnx": folder.exported_model("onnx"),
        "profile": folder.profile_dir,
        "checkpoints": folder.checkpoints_dir,
        "checkpoints/step-00000123": folder.checkpoint(123),
        "checkpoints/.tmp-step-00000123": folder.checkpoint_temporary(123),
        "attempts/2": folder.attempt(2),
    }
    for relative, path in named.items():
        assert path == tmp_path / relative, relative
    assert RunFolder.of_checkpoint(folder.checkpoint(5)) == folder
    assert RunFolder(str(tmp_path)).root == Path(tmp_path)  # type: ignore[arg-type]


def test_metric_files_and_checkpoint_names(tmp_path):
    folder = RunFolder(tmp_path)
    for name in ("metrics.node1.jsonl", "metrics.jsonl", "other.jsonl"):
        (tmp_path / name).write_text("")
    assert [p.name for p in folder.metrics_files()] == ["metrics.jsonl", "metrics.node1.jsonl"]
    assert checkpoint_name(7) == "step-00000007"
    assert checkpoint_step("step-00000007") == 7
    assert checkpoint_step(".tmp-step-00000007") is None
    assert checkpoint_step("step-x") is None
