"""The one owner of a sweep's folder: every file and folder a sweep writes there, by name.

Code that reads or writes the folder takes its names from the constants here (``folder / SWEEP_FILE``)
or a trial's folder name from :func:`trial_name`; nothing else spells these names. The folder of
one sweep::

    SWEEP_DIR/
    ├── sweep.json                   SWEEP_FILE: which study, where, the parent MLflow run (marks a sweep's folder)
    ├── study.journal                STUDY_FILE: the Optuna study, unless [sweep] storage names another
    ├── .sweep.lock                  LOCK_FILE: held while a worker takes a trial, or the sweep is created
    ├── .owner.lock                  OWNER_LOCK: held by the process that records the parent run
    ├── mlflow_run.json, metrics.jsonl, record/
    │                                the parent run's local record (runjob.host.run_folder's names)
    ├── trials.json                  TRIALS_FILE: every trial's values, state, value and run (also on the parent run)
    ├── optimization_history.png     HISTORY_PLOT: Optuna's view of the trials' values
    ├── param_importances.png        IMPORTANCES_PLOT: Optuna's view of each parameter's importance
    └── trial-007/                   trial_name(7): one trial's run folder (TRIAL_PATTERN finds them all)
        ├── .trial.lock              TRIAL_LOCK: held by the trial's worker and its run while either lives
        ├── console.log              CONSOLE_FILE: the trial's output, when several workers share a terminal
        └── job.toml, ...            a run's folder (runjob.host.run_folder)
"""

from __future__ import annotations

SWEEP_FILE = "sweep.json"
STUDY_FILE = "study.journal"
LOCK_FILE = ".sweep.lock"
OWNER_LOCK = ".owner.lock"
TRIALS_FILE = "trials.json"
HISTORY_PLOT = "optimization_history.png"
IMPORTANCES_PLOT = "param_importances.png"
TRIAL_PREFIX = "trial-"
TRIAL_PATTERN = f"{TRIAL_PREFIX}*"
"""Every trial's folder (a glob pattern)."""
TRIAL_LOCK = ".trial.lock"
CONSOLE_FILE = "console.log"


def trial_name(number: int) -> str:
    """The folder name of the trial with Optuna trial number ``number``: ``trial-007``."""
    return f"{TRIAL_PREFIX}{number:03d}"
