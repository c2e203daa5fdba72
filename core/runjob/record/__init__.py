"""The run's record: the local record in the output folder first (``mlflow_run.json``,
``metrics*.jsonl``), then MLflow; provenance, system metrics, the logged model, ``sync``."""
