"""The one owner of the names runjob writes on MLflow runs and Optuna studies: every tag, by name.

Code that sets or reads a tag takes its name from the constants here (``tags[OUTPUT_DIR_TAG]``)
or, for a family of tags, from the function that spells one (``baseline_tag("val/accuracy")``);
nothing else spells these names (``tests/test_one_owner.py`` checks). Users see them in ``mlflow
ui`` and query them (``tags."runjob.sweep.trial" = '3'``): renaming one breaks their searches.
The names, by subject::

    a training run: what it is       runjob.version, .job_file, .output_dir, .overrides, .metrics,
                                     .host, .torch_version, ..., .plugin.NAME, .library.NAME, .git.dirty
    a training run: what runs it     runjob.distributed_type, .world_size, .mixed_precision, .device, ...
    how it started and ended         runjob.init_from, .resumed.step_N, .stopped, .resume_command, .error
    what its callbacks measured      runjob.baseline.NAME, .best.metric, .flops_per_UNIT, ...
    a command's run                  runjob.rerun_of, runjob.evaluated_from, ...
    a sweep's parent and trials      runjob.sweep, runjob.sweep.study, .trial, .parent, .keys, ...
    MLflow's own, set by runjob      mlflow.note.content, mlflow.parentRunId, mlflow.source.git.*
    a sweep's Optuna study           runjob.stopped, .workers, .parent_run_id, .sweep_dir (user attrs)
    a sweep's Optuna trial           runjob.output_dir, .worker, .run_id, .message, ... (user attrs)

Imports nothing. Public (``runjob.tags``): plugins, and scripts that query runs, use the names too.
"""

from __future__ import annotations

# --- a training run: what it is (runjob.train.runner sets them when the run starts) ---
VERSION_TAG = "runjob.version"  # the runjob version that recorded the run (also on a command's run)
JOB_FILE_TAG = "runjob.job_file"  # the job file's absolute path
OUTPUT_DIR_TAG = "runjob.output_dir"  # the run's output folder (a sweep's parent: the sweep's folder), absolute
OVERRIDES_TAG = "runjob.overrides"  # the --set flags the run was given, space-separated, secrets hidden
METRICS_TAG = "runjob.metrics"  # JSON: the metrics the task declared and which way each is better
HOST_TAG = "runjob.host"  # the main process's host name
TORCH_VERSION_TAG = "runjob.torch_version"  # torch's version
ACCELERATE_VERSION_TAG = "runjob.accelerate_version"  # Accelerate's version
CUDA_VERSION_TAG = "runjob.cuda_version"  # the CUDA version torch was built with ("none": a CPU build)
GPU_TAG = "runjob.gpu"  # the GPU's name (set only on a CUDA device)
PLUGIN_TAG_PREFIX = "runjob.plugin."  # + a plugin's name: its distribution and version (installed plugins only)
LOCAL_PLUGINS_TAG = "runjob.plugins.local"  # JSON: each local plugin's -p as given, where it was and its sha256
LIBRARY_TAG_PREFIX = "runjob.library."  # + a library a component wraps: its installed version
GIT_DIRTY_TAG = "runjob.git.dirty"  # "true" when the job file's git checkout had changes

# --- a training run: what runs it (runjob.train.accelerator.actual_setup) ---
DISTRIBUTED_TYPE_TAG = "runjob.distributed_type"  # Accelerate's distributed type (NO, MULTI_GPU, FSDP, ...)
WORLD_SIZE_TAG = "runjob.world_size"  # how many processes train
MIXED_PRECISION_TAG = "runjob.mixed_precision"  # Accelerate's mixed precision (no, fp16, bf16)
DEVICE_TAG = "runjob.device"  # the device type (cpu, cuda, mps)
NUM_MACHINES_TAG = "runjob.num_machines"  # how many machines train

# --- how a run started and ended ---
INIT_FROM_TAG = "runjob.init_from"  # model.init_from as given: the weights the model started from
INIT_FROM_RUN_TAG = "runjob.init_from.run_id"  # the MLflow run those weights came from
RESUMED_TAG_PREFIX = "runjob.resumed.step_"  # + the step: the job's changes when the run resumed there
STOPPED_TAG = "runjob.stopped"  # why training stopped before its end (a stop signal, a callback, pruning)
STOPPED_STEP_TAG = "runjob.stopped.step"  # the step it stopped at
RESUME_COMMAND_TAG = "runjob.resume_command"  # the command that goes on from a stopped run's checkpoint
ERROR_TAG = "runjob.error"  # what went wrong in a FAILED run (a sweep's parent too)
WORKER_FAILURE_TAG = "runjob.worker_failure"  # how a worker process failed (FAILED unless rank 0 finished the run)
ABANDONED_TAG = "runjob.abandoned"  # why a run left RUNNING by a killed process was marked KILLED
RETRIED_TAG = "runjob.tracking.retried"  # how many MLflow writes needed another try (set at the end; absent: none)

# --- what a run's callbacks measured ---
BASELINE_TAG_PREFIX = "runjob.baseline."  # + a name: one of the data's reference values (DatasetSplits.baselines)
BEST_METRIC_TAG = "runjob.best.metric"  # best_weights: the metric it keeps the best weights by
BEST_VALUE_TAG = "runjob.best.value"  # best_weights: the best value so far
BEST_STEP_TAG = "runjob.best.step"  # best_weights: the step of the best value
FLOPS_PER_TAG_PREFIX = "runjob.flops_per_"  # + the task's unit (sample, token): throughput's FLOPs for one
FLOPS_COUNTED_TAG = "runjob.flops_counted"  # throughput: how those FLOPs were found (stated, meta, counted)

# --- a command's run ---
RERUN_OF_TAG = "runjob.rerun_of"  # `runjob rerun`: the run whose job this run trained again
EVALUATED_FROM_TAG = "runjob.evaluated_from"  # `runjob evaluate`: the evaluated run's id (or output folder)
EVALUATED_FROM_OUTPUT_DIR_TAG = "runjob.evaluated_from.output_dir"  # `runjob evaluate`: the evaluated run's folder
EVALUATED_SPLIT_TAG = "runjob.evaluated_split"  # `runjob evaluate`: the split it evaluated

# --- a sweep's parent run and its trials' runs ---
SWEEP_TAG = "runjob.sweep"  # "true" on a sweep's parent run: the sweep's settings as params, no job keys
SWEEP_STUDY_TAG = "runjob.sweep.study"  # the Optuna study's name (on the parent and on each trial)
SWEEP_TRIAL_TAG = "runjob.sweep.trial"  # on a trial's run: its Optuna trial number
SWEEP_PARENT_TAG = "runjob.sweep.parent"  # on a trial's run: the parent run's id
SWEEP_KEYS_TAG = "runjob.sweep.keys"  # on a trial's run: the job keys the sweep varies, a JSON list in its order
SWEEP_DEVICES_TAG = "runjob.sweep.devices"  # on a trial's run: the GPUs its worker gave it
SWEEP_PRUNED_TAG = "runjob.sweep.pruned"  # "true" on a trial's run the pruner stopped
SWEEP_UNSYNCED_TAG = "runjob.sweep.unsynced_trials"  # on the parent: trials whose MLflow runs lack part of their record
SWEEP_BEST_TRIAL_TAG = "runjob.sweep.best_trial"  # on the parent: the best trial's number
SWEEP_BEST_RUN_ID_TAG = "runjob.sweep.best_run_id"  # on the parent: the best trial's run id
SWEEP_BEST_PARAMS_TAG = "runjob.sweep.best_params"  # on the parent: the best trial's --set flags

# --- MLflow's own tags, which runjob sets ---
NOTE_TAG = "mlflow.note.content"  # a run's description, which MLflow's UI shows as Markdown
PARENT_RUN_TAG = "mlflow.parentRunId"  # makes a trial's run a child of the sweep's parent in MLflow's UI
GIT_COMMIT_TAG = "mlflow.source.git.commit"  # the job file's git commit
GIT_REPO_URL_TAG = "mlflow.source.git.repoURL"  # its remote "origin", secrets hidden
GIT_BRANCH_TAG = "mlflow.source.git.branch"  # its branch
DATASET_CONTEXT_TAG = "mlflow.data.context"  # a dataset input's tag: which split (train, validation, ...)

# --- a sweep's Optuna study: its user attributes ---
STOPPED_ATTR = "runjob.stopped"  # a trial's mistake every trial would repeat: no worker takes another
WORKERS_ATTR = "runjob.workers"  # how many workers joined: each seeds its sampler with seed + its number
PARENT_ATTR = "runjob.parent_run_id"  # the parent run's id: what a worker joining by storage URL needs
SWEEP_DIR_ATTR = "runjob.sweep_dir"  # the sweep's folder, absolute (for --join and --resume by storage URL)

# --- a sweep's Optuna trial: its user attributes ---
OUTPUT_DIR_ATTR = "runjob.output_dir"  # the trial's folder, absolute
WORKER_ATTR = "runjob.worker"  # "host pid" of the worker running the trial
RUN_ID_ATTR = "runjob.run_id"  # the trial's MLflow run id
MESSAGE_ATTR = "runjob.message"  # how the trial ended, in a line (a failure's reason, "pruned", ...)
UNSYNCED_ATTR = "runjob.unsynced"  # what its MLflow run lacks after the sweep tried to send it, with `runjob sync`
INTERRUPTED_ATTR = "runjob.interrupted"  # the trial stopped on a signal; a worker resumes it


def plugin_tag(name: str) -> str:
    """``runjob.plugin.NAME``: installed plugin ``name``'s distribution and version."""
    return PLUGIN_TAG_PREFIX + name


def library_tag(library: str) -> str:
    """``runjob.library.NAME``: the installed version of ``library``, which a component wraps."""
    return LIBRARY_TAG_PREFIX + library


def resumed_tag(step: int) -> str:
    """``runjob.resumed.step_N``: the job's changes when the run resumed at step ``step``."""
    return f"{RESUMED_TAG_PREFIX}{step}"


def baseline_tag(name: str) -> str:
    """``runjob.baseline.NAME``: the data's reference value ``name``."""
    return BASELINE_TAG_PREFIX + name


def flops_per_tag(unit: str) -> str:
    """``runjob.flops_per_UNIT``: the FLOPs of one ``unit`` (``sample``, ``token``)."""
    return FLOPS_PER_TAG_PREFIX + unit


# a streamed training split (runjob.train.streaming): its location, each process's samples per epoch,
# and the samples repeated (to give every process as many batches) or left out (train.drop_last) per epoch
STREAM_LOCATION_TAG = "runjob.data.streamed"
STREAM_SHARES_TAG = "runjob.data.samples_per_process"
STREAM_PADDED_TAG = "runjob.data.padded_samples_per_epoch"
STREAM_DROPPED_TAG = "runjob.data.dropped_samples_per_epoch"
