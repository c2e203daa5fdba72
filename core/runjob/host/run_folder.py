"""The one owner of a run's output folder: every file and folder a run writes there, by name.

Code that reads or writes the folder asks :class:`RunFolder` for a path (``RunFolder(output_dir).weights``)
or takes a bare name from the constants here (an MLflow artifact path, a message); nothing else
spells these names. The folder of one run::

    OUTPUT_DIR/
    ├── job.toml                     JOB_FILE: the resolved job (marks the folder as a run's)
    ├── model.safetensors            WEIGHTS_FILE: the final weights, once training has ended
    ├── models.json                  MODELS_FILE: the models callbacks named (run.add_model)
    ├── best/                        BEST_DIR: the ``best_weights`` callback's
    │   ├── model.safetensors        the weights at the best evaluation so far
    │   └── best.json                BEST_FILE: its metric, value and step (for a resumed run)
    ├── record/                      RECORD_DIR: what the MLflow run records of the job
    │   ├── job.toml                 the job with secrets hidden
    │   └── job_sources.json         JOB_SOURCES_FILE: where each value came from
    ├── mlflow_run.json              RUN_RECORD_FILE: the local record of the MLflow run
    ├── metrics.jsonl                METRICS_FILE: the metric points (the main process's)
    ├── metrics.node1.jsonl          node_metrics_name(1): another machine's system metrics
    ├── mlflow_model/                MLFLOW_MODEL_DIR: the MLflow model (tracking.log_model)
    ├── predictor/                   PREDICTOR_DIR: what prediction needs besides the model, as data
    │   ├── predictor.json           PREDICTOR_FILE: the inputs' class and state, the task's, the classes
    │   └── inputs/                  PREDICTOR_INPUTS_DIR: the inputs' files (a tokenizer.json)
    ├── prediction.pkl               PICKLED_PREDICTOR_FILE: a pickled predictor (runjob's development
    │                                versions before predictor/): never read, refused in one line
    ├── data_facts.json              DATA_FACTS_FILE: the dataset's facts the model was built with
    ├── data/                        DATA_DIR: the dataset's files (DatasetSplits.artifacts)
    ├── adapters/NAME/               ADAPTERS_DIR: each adapter's own files (LoRA weights)
    ├── runjob.log                   LOG_FILE: what the run printed
    ├── rerun_source.toml            RERUN_SOURCE_FILE: the job ``runjob rerun`` downloaded
    ├── model.onnx | model.pt2       exported_model_name(format): ``runjob export``'s output
    ├── profile/                     PROFILE_DIR: the ``profiler`` callback's
    │   ├── trace.json               TRACE_FILE: its Chrome trace
    │   └── top_operators.txt        TOP_OPERATORS_FILE: its tables of operators
    ├── checkpoints/                 CHECKPOINTS_DIR
    │   ├── .tmp-step-00000200/      a checkpoint being written (renamed once complete)
    │   └── step-00000100/           checkpoint_name(100): one complete checkpoint
    │       ├── model.safetensors    Accelerate's save_state (weights, optimizer, RNG, sampler)
    │       ├── ...
    │       ├── scheduler.pt         SCHEDULER_FILE: the scheduler's state
    │       ├── callbacks.pt         CALLBACKS_FILE: every callback's state_dict()
    │       └── runjob_state.json    CHECKPOINT_STATE_FILE: step, epoch, ..., the job
    └── attempts/                    ATTEMPTS_DIR: earlier attempts (``--resume auto``)
        └── 1/                       attempt(1): what one attempt left, moved aside whole

Imports no torch, accelerate or mlflow (``runjob.host``: plugins use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WEIGHTS_FILE = "model.safetensors"
JOB_FILE = "job.toml"
MODELS_FILE = "models.json"
BEST_DIR = "best"
BEST_FILE = "best.json"
BEST_MODEL = BEST_DIR
"""The name ``best_weights`` gives its model (``run.add_model``): its folder's, so that
``init_from = "runs:/ID/best"`` names both the MLflow artifact folder and the model."""
RECORD_DIR = "record"
JOB_SOURCES_FILE = "job_sources.json"
RUN_RECORD_FILE = "mlflow_run.json"
METRICS_FILE = "metrics.jsonl"
METRICS_PATTERN = "metrics*.jsonl"
"""Every machine's metric files: ``metrics.jsonl`` and ``metrics.nodeN.jsonl``."""
MLFLOW_MODEL_DIR = "mlflow_model"
PREDICTOR_DIR = "predictor"
PREDICTOR_FILE = "predictor.json"
PREDICTOR_INPUTS_DIR = "inputs"
PICKLED_PREDICTOR_FILE = "prediction.pkl"
DATA_FACTS_FILE = "data_facts.json"
DATA_DIR = "data"
ADAPTERS_DIR = "adapters"
LOG_FILE = "runjob.log"
RERUN_SOURCE_FILE = "rerun_source.toml"
PROFILE_DIR = "profile"
TRACE_FILE = "trace.json"
TOP_OPERATORS_FILE = "top_operators.txt"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step-"
CHECKPOINT_TEMPORARY_PREFIX = ".tmp-"
CHECKPOINT_STATE_FILE = "runjob_state.json"
SCHEDULER_FILE = "scheduler.pt"
CALLBACKS_FILE = "callbacks.pt"  # every callback's state_dict(), by its name in the job
ATTEMPTS_DIR = "attempts"


def node_metrics_name(machine_rank: int) -> str:
    """The metric file of machine ``machine_rank`` other than the main one: ``metrics.node1.jsonl``."""
    return f"metrics.node{machine_rank}.jsonl"


def exported_model_name(format: str) -> str:  # noqa: A002 - the --format it is named after
    """``runjob export``'s file in the run's folder: ``model.onnx``, ``model.pt2``."""
    return f"model.{format}"


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint after optimizer step ``step``: ``step-00000123``."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def checkpoint_step(name: str) -> int | None:
    """The step a checkpoint folder's name says (``step-00000123``: 123); None for another name."""
    digits = name.removeprefix(CHECKPOINT_PREFIX)
    return int(digits) if name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() else None


@dataclass(frozen=True)
class RunFolder:
    """The paths of the run whose output folder is ``root`` (nothing is read or made here)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of_checkpoint(cls, checkpoint: Path) -> RunFolder:
        """The run folder holding ``checkpoint`` (``OUTPUT_DIR/checkpoints/step-NNNNNNNN``)."""
        return cls(Path(checkpoint).parent.parent)

    @property
    def job_file(self) -> Path:
        """``job.toml``: the resolved job; a folder holding one holds a run."""
        return self.root / JOB_FILE

    @property
    def weights(self) -> Path:
        """``model.safetensors``: the final weights."""
        return self.root / WEIGHTS_FILE

    @property
    def data_facts(self) -> Path:
        """``data_facts.json``: the dataset's facts the model factory was given."""
        return self.root / DATA_FACTS_FILE

    @property
    def data_dir(self) -> Path:
        """``data/``: the dataset's files the run keeps (``DatasetSplits.artifacts``)."""
        return self.root / DATA_DIR

    def adapter_dir(self, name: str) -> Path:
        """``adapters/NAME/``: adapter ``name``'s own files."""
        return self.root / ADAPTERS_DIR / name

    @property
    def models_file(self) -> Path:
        """``models.json``: the models callbacks named (``run.add_model``)."""
        return self.root / MODELS_FILE

    @property
    def best_dir(self) -> Path:
        return self.root / BEST_DIR

    @property
    def best_weights(self) -> Path:
        """``best/model.safetensors``."""
        return self.best_dir / WEIGHTS_FILE

    @property
    def best_file(self) -> Path:
        """``best/best.json``: the best evaluation's metric, value and step."""
        return self.best_dir / BEST_FILE

    @property
    def record_dir(self) -> Path:
        return self.root / RECORD_DIR

    @property
    def recorded_job_file(self) -> Path:
        """``record/job.toml``: the job as MLflow records it (secrets hidden)."""
        return self.record_dir / JOB_FILE

    @property
    def job_sources_file(self) -> Path:
        """``record/job_sources.json``."""
        return self.record_dir / JOB_SOURCES_FILE

    @property
    def run_record_file(self) -> Path:
        """``mlflow_run.json``: the local record of the MLflow run."""
        return self.root / RUN_RECORD_FILE

    @property
    def metrics_file(self) -> Path:
        """``metrics.jsonl``: the main process's metric points."""
        return self.root / METRICS_FILE

    def node_metrics_file(self, machine_rank: int) -> Path:
        """``metrics.nodeN.jsonl``: machine ``machine_rank``'s system metrics."""
        return self.root / node_metrics_name(machine_rank)

    def metrics_files(self) -> list[Path]:
        """Every metric file there is (``metrics*.jsonl``), sorted by name."""
        return sorted(self.root.glob(METRICS_PATTERN))

    @property
    def mlflow_model_dir(self) -> Path:
        return self.root / MLFLOW_MODEL_DIR

    @property
    def predictor_dir(self) -> Path:
        """``predictor/``: the run's predictor as data (``runjob.record.prediction``)."""
        return self.root / PREDICTOR_DIR

    @property
    def pickled_predictor_file(self) -> Path:
        """``prediction.pkl``: a pickled predictor, never read (its presence is refused in one line)."""
        return self.root / PICKLED_PREDICTOR_FILE

    @property
    def log_file(self) -> Path:
        """``runjob.log``."""
        return self.root / LOG_FILE

    @property
    def rerun_source_file(self) -> Path:
        """``rerun_source.toml``: the recorded job ``runjob rerun`` trains again."""
        return self.root / RERUN_SOURCE_FILE

    def exported_model(self, format: str) -> Path:  # noqa: A002 - the --format it is named after
        """``model.onnx`` / ``model.pt2``: ``runjob export``'s default output."""
        return self.root / exported_model_name(format)

    @property
    def profile_dir(self) -> Path:
        return self.root / PROFILE_DIR

    @property
    def profile_trace(self) -> Path:
        """``profile/trace.json``: the ``profiler`` callback's Chrome trace."""
        return self.profile_dir / TRACE_FILE

    @property
    def profile_operators(self) -> Path:
        """``profile/top_operators.txt``: the ``profiler`` callback's tables of operators."""
        return self.profile_dir / TOP_OPERATORS_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    def checkpoint(self, step: int) -> Path:
        """``checkpoints/step-NNNNNNNN``: the checkpoint after optimizer step ``step``."""
        return self.checkpoints_dir / checkpoint_name(step)

    def checkpoint_temporary(self, step: int) -> Path:
        """``checkpoints/.tmp-step-NNNNNNNN``: that checkpoint while it is written."""
        return self.checkpoints_dir / f"{CHECKPOINT_TEMPORARY_PREFIX}{checkpoint_name(step)}"

    @property
    def attempts_dir(self) -> Path:
        return self.root / ATTEMPTS_DIR

    def attempt(self, number: int) -> Path:
        """``attempts/N``: what attempt ``number`` left, set aside."""
        return self.attempts_dir / str(number)
