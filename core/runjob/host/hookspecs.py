"""The hooks a runjob plugin can implement. This module is the plugin author's reference.

A plugin is a module (or any object) with functions marked ``@runjob.hookimpl`` whose names match
the specifications below. It is found through the ``runjob`` entry-point group, the same way the
built-in plugins are (see ``pyproject.toml``), so anything a built-in can do, a third-party plugin
can do too. Argument names must match the specification; a plugin may take any subset of them.

Two families of hooks exist:

* **Registration hooks** (``runjob_register_*``) are called once when plugins are loaded, before
  any job is read. Each receives a ``register`` callback; call it once per component the plugin
  provides. They must not import heavy libraries (torch and what builds on it): do that inside factories,
  so ``runjob --help`` and ``runjob validate`` stay fast.
* **Training event hooks** (``runjob_run_start`` ... ``runjob_run_end``) are called during a run,
  on every process (``runjob_after_log`` on the main one), so a plugin can observe or extend
  training. Use ``run.is_main_process`` to act once per job. They are called in the training loop:
  keep them cheap. Each is the global side of one :class:`runjob.Event` and goes through the same
  dispatcher as the callbacks, after them (:mod:`runjob.host.events` has the map): an exception
  stops the run with one line naming the plugin, the hook and the step (exit code 2, the MLflow run
  FAILED, the traceback in ``OUTPUT_DIR/runjob.log``); in ``runjob_run_end`` it is said in one line
  and the run's status stands.

The ``register`` callback is described by :class:`runjob.Register` (annotate a registration hook's
parameter with it and a type checker checks every call): ``register(name, factory, *, options=None,
description="", **facts)``. Each kind's factory signature is given in its hook's documentation.

The specifications are annotated, and every training event takes ``(run, step, epoch, ...)`` in
that order (a hook may still name them in any order: arguments are passed by name). ``loss`` is
annotated ``torch.Tensor``, imported for type checkers only: loading plugins never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import pluggy

if TYPE_CHECKING:  # annotations only: loading plugins never imports torch (import-linter ignores these)
    import torch

    from runjob.host.components import Factory, Options
    from runjob.host.run_context import Run

hookspec = pluggy.HookspecMarker("runjob")
hookimpl = pluggy.HookimplMarker("runjob")


class Register(Protocol):
    """The callback every ``runjob_register_*`` hook receives; call it once per component.

    ``name`` is what job files write in ``name = "..."`` (a non-empty string without ``:``, which
    jobs write between plugin and name). ``factory`` builds the component from the validated options;
    its signature depends on the kind (see each hook). ``options`` is a subclass of
    :class:`runjob.Options` (for tasks :class:`runjob.TaskOptions`, for callbacks
    :class:`runjob.CallbackOptions`) declaring every other key the component's table accepts: types,
    defaults, ranges; ``None`` means it takes none. ``description`` is the one line ``runjob plugins
    --long`` shows. ``facts`` are what a component states about itself for ``runjob validate``
    (``needs_gpu=True``, ``max_processes=N`` for strategies); a kind refuses facts it does not know.
    A bad name, factory or options class raises ``TypeError``, reported as the plugin's failure::

        @runjob.hookimpl
        def runjob_register_models(register: runjob.Register) -> None:
            register("mlp", build_mlp, options=MLPOptions, description="a two-layer perceptron")
    """

    def __call__(
        self,
        name: str,
        factory: Factory,
        *,
        options: type[Options] | None = None,
        description: str = "",
        **facts: object,
    ) -> None: ...


@hookspec
def runjob_register_models(register: Register) -> None:
    """Register model components (``[model] name = ...``).

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per model. ``factory(options) -> torch.nn.Module``, or ``factory(options, data)`` where
    ``data`` is the dataset's :class:`runjob.DataFacts` (classes, channels, image size, vocabulary
    size, context, pad id), so a job writes them once: an option such as ``num_classes: int | None =
    None`` can mean "the dataset's". The facts are saved with the run (``data_facts.json``), so
    ``evaluate``, ``predict``, ``export`` and the MLflow model rebuild the model without the data.
    The factory is called once per run (runjob counts FLOPs on a copy of the built model). It returns
    a model whose forward takes what the job's task passes it (by default the inputs of a batch; a
    dict of inputs goes in as the keyword arguments the forward names) and returns what the task
    expects (a tensor, a dict, or an object with ``.logits``, as Hugging Face models return; the
    task checks them at the first batch). An exception from the factory is reported at the job's
    ``[model]`` line in one line (exit code 2): raise ``ValueError`` saying what would be right.
    A model may define ``training_flops(batch) -> float``, the FLOPs of one forward and backward
    pass over ``batch`` as its task passes it, for ``train/tflops`` and ``train/mfu`` where
    PyTorch's counter cannot count it.
    The host adds the keys ``init_from`` (weights to start from, loaded by the names of the
    model's ``state_dict()``), ``adapters`` (``[model.adapters.NAME]``, see
    :func:`runjob_register_adapters`) and ``freeze`` (patterns over ``named_parameters()`` names)
    to every model table; the options model must not declare them. A model built the same way from
    the same options has the same names, so a run's ``model.safetensors`` loads into it.
    """


@hookspec
def runjob_register_adapters(register: Register) -> None:
    """Register adapters (``[model.adapters.NAME]`` tables, e.g. the built-in ``lora``): a change
    to a built model, such as low-rank adapters, made after ``init_from`` has loaded its weights and
    before ``freeze``.

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per adapter. ``factory(options) -> runjob.Adapter``: an object whose ``apply(model)``
    returns the adapted model (which parameters train is its choice: it may freeze the rest),
    ``merge(model)`` the plain model with the adapter folded in (``runjob export``), and
    ``save(model, folder)`` writes the adapter's own files at the end of a run
    (``OUTPUT_DIR/adapters/NAME/``). The run's ``model.safetensors`` holds the adapted model's
    weights, so ``evaluate``, ``predict`` and the MLflow model rebuild it: factory, adapters, weights.
    """


@hookspec
def runjob_register_exporters(register: Register) -> None:
    """Register export formats for ``runjob export RUN --format NAME`` (built in: ``onnx``, ``pt2``).

    Called once, at plugin load; call ``register(name, export, description=...)`` once per format.
    ``export(request: runjob.ExportRequest) -> str`` writes ``request.output`` (a file or a folder)
    from ``request.model`` (the trained model in eval mode on the CPU, adapters merged) and the run's
    ``request.inputs`` (its :class:`runjob.Inputs`, e.g. holding a tokenizer) and
    ``request.artifacts`` (the dataset's files, ``DatasetSplits.artifacts``), and returns one line
    saying what was written. Raise ``ValueError`` saying why the model cannot be exported that way:
    ``runjob export`` reports it in one line, exit code 2, and writes nothing.
    """


@hookspec
def runjob_register_converters(register: Register) -> None:
    """Register sources for ``runjob data convert SOURCE LOCATION --from NAME`` (built in:
    ``images``, ``table``, ``text``): how a data set on local disk becomes shards that a streamed
    dataset (options derived from :class:`runjob.StreamOptions`) reads from an object store.

    Called once, at plugin load; call ``register(name, convert, options=..., description=...)``
    once per source. ``convert(source: pathlib.Path | str, options) -> runjob.ShardSource`` reads
    SOURCE (a path, or the text given when it is a pattern) and returns its items per split and the
    module-level function that turns an item into a stored record; ``options`` holds the command's
    ``--option KEY=VALUE`` pairs, validated by the options class. runjob writes the shards (in
    parallel, with a progress bar, in a seeded random order), checks the upload and writes
    ``runjob.json`` last, with the source's ``facts`` and digests; a location without it is read by
    no run. Raise ``runjob.DataError`` (or ``ValueError``) naming what is wrong with SOURCE: the
    command reports it in one line, exit code 2, and writes nothing.
    """


@hookspec
def runjob_register_inputs(register: Register) -> None:
    """Register the :class:`runjob.Inputs` classes a plugin's datasets give (``DatasetSplits.inputs``),
    so a finished run's predictor can be rebuilt from data.

    Called once, at plugin load; call ``register(name, InputsClass, description=...)`` once per
    class (a subclass of :class:`runjob.Inputs`; the name is the plugin's own, unique among its
    inputs). At the end of a run the dataset's inputs are written as plain data
    (:meth:`runjob.Inputs.to_data`, into ``OUTPUT_DIR/predictor/``) under this name; ``runjob
    predict``, ``export`` and the run's MLflow model find the class by it among the installed
    plugins and rebuild the object (:meth:`runjob.Inputs.from_data`). A run never makes runjob
    unpickle or import anything. Inputs of a class no plugin registers are not saved: the end of
    the run says so in one line, and ``runjob predict`` then reads inputs by building the dataset
    again::

        @runjob.hookimpl
        def runjob_register_inputs(register: runjob.Register) -> None:
            register("my_rows", MyRows, description="rows of x1, x2, standardized")
    """


@hookspec
def runjob_register_datasets(register: Register) -> None:
    """Register dataset components (``[dataset] name = ...``).

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per dataset. ``factory(options) -> runjob.DatasetSplits`` returns the training and
    validation ``torch.utils.data.Dataset`` objects (items are what the job's task reads, e.g.
    ``(input, target)`` pairs, dicts or token windows), optionally a test split, and the number of
    classes where the targets are classes.
    A split that fits in memory may instead be a
    ``runjob.ImageTensors`` (one image tensor, labels, normalization, crop and flip): the host then
    keeps it on the training device and builds each batch there as whole tensors. The host adds
    the DataLoader keys (``num_workers``, ``pin_memory``, ``persistent_workers``,
    ``prefetch_factor``) to every dataset table; the options model must not declare them. Validate
    paths in the options model (e.g. with ``runjob.ExistingDir``) so a missing folder is reported
    before anything is read. For ``runjob predict`` and the run's MLflow model, set
    ``DatasetSplits.inputs`` to a :class:`runjob.Inputs`: how a user's raw inputs (a CSV row, an
    image file's bytes, a prompt) become model inputs, with the preprocessing fitted on the training
    data; it is pickled into the MLflow model. (``DatasetSplits.read_inputs`` and ``decode`` alone
    still serve ``runjob predict``; the MLflow model then takes the model's tensors as they are.)
    ``DatasetSplits.collate`` batches every split (dynamic padding; mask the padding),
    ``artifacts`` names files the data was prepared with (a tokenizer), kept with the run, and
    ``vocab_size``, ``context``, ``pad_id``, ``channels`` and ``image_size`` are facts the model
    factory receives (:class:`runjob.DataFacts`).
    """


@hookspec
def runjob_register_optimizers(register: Register) -> None:
    """Register optimizer components (``[optimizer] name = ...``).

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per optimizer. ``factory(params, options) -> torch.optim.Optimizer``, where ``params`` is
    a list of param-group dicts, as torch.optim takes them: each has ``"params"`` (tensors),
    ``"param_names"`` (their names in the plain model's ``named_parameters()``, as torch 2.6+ keeps
    them in the optimizer's state) and, where the job's ``[optimizer] groups`` or
    ``no_decay_norm_and_bias`` say so, ``"lr"`` and ``"weight_decay"``; every other setting comes
    from the factory's own options. Frozen parameters (``model.freeze``) are left out. Pass
    ``params`` to the torch optimizer as it is (``torch.optim.AdamW(params, lr=options.lr, ...)``);
    an optimizer that needs plain tensors can read ``group["params"]`` for each group. The options
    model must not declare ``groups`` or ``no_decay_norm_and_bias``: the host adds them to every
    optimizer table.
    """


@hookspec
def runjob_register_schedulers(register: Register) -> None:
    """Register learning-rate scheduler components (``[scheduler] name = ...``).

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per schedule. ``factory(optimizer, options, total_steps) ->
    torch.optim.lr_scheduler.LRScheduler | None``. ``total_steps`` is the number of optimizer
    steps the run will take; the host calls ``scheduler.step()`` once after every optimizer step
    that was not skipped. Return ``None`` for a constant learning rate.
    """


@hookspec
def runjob_register_strategies(register: Register) -> None:
    """Register distribution strategies (``[strategy] name = ...``).

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per strategy. ``factory(options) -> runjob.StrategyPlan``: the Accelerate
    objects (kwargs handlers, an FSDP or DeepSpeed plugin) the host passes to ``Accelerator``, and
    the distributed type the strategy expects, which the host checks against what Accelerate
    actually set up.

    A strategy also states, as keywords of ``register``, what ``runjob validate`` should know
    before anything is built: ``needs_gpu=True`` when it runs only on CUDA GPUs (validate then
    warns on a machine without one), ``max_processes=N`` when it runs at most N processes (validate
    warns, and a run with more stops). Built-in and third-party strategies get the same warnings.
    """


@hookspec
def runjob_register_tasks(register: Register) -> None:
    """Register task components (``[task] name = ...``): what is learned from a batch.

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per task. ``options`` must subclass :class:`runjob.TaskOptions` and override its
    ``metrics()`` to declare what evaluation reports (names without the ``val/`` prefix, each
    ``"max"`` or ``"min"``), so ``runjob validate`` checks ``train.best_metric`` and the
    ``[sweep]`` metric before anything runs. ``factory(options, data) -> runjob.Task``, where
    ``data`` is the dataset's :class:`runjob.DatasetSplits` (its ``num_classes``, ``classes``) in
    training, and the run's :class:`runjob.DataFacts` (the same fields, saved as ``data_facts.json``)
    when ``runjob predict``, ``export`` or the MLflow model rebuild a finished run's task without its
    data: read only fields both have. What else a task learns from the data for prediction it keeps
    with :meth:`runjob.Task.to_data` / :meth:`runjob.Task.restore`.

    A :class:`runjob.Task` says what a batch means; the host does the rest (moving batches to the
    device with Accelerate, backward, accumulation, clipping, the non-finite guard, the optimizer and
    scheduler steps, gathering across processes). It implements:

    * ``loss(outputs, batch)``: the training loss, a 0-dim tensor; ``outputs`` is
      ``forward(model, batch)``, by default ``call_model(model, inputs(batch))`` with ``inputs`` the
      first item of a tuple batch (override ``inputs``/``targets`` for dicts and other batches);
      ``call_model`` passes a dict of inputs as the keyword arguments the model's ``forward`` names
      (``model(**inputs)``, as Hugging Face models take ``input_ids`` and ``attention_mask``) and
      anything else as one argument; :func:`runjob.logits_of` reads outputs that are
      tensors, dicts or objects with ``.logits``;
    * ``evaluate(outputs, batch)``: per-sample values ``{name: tensor of shape (batch, ...)}``; the
      host gathers them across processes with ``gather_for_metrics`` (each validation sample
      counted once) and sums them on the device;
    * ``summarize(totals, count)``: the metrics from those sums (floats, or lists of floats for
      per-sample vectors) and the number of samples, read back once per evaluation;
    * optionally ``check(outputs, batch)``, run on the first training batch: raise
      ``ValueError("outputs of shape ... but ...")`` when the model does not fit the task; and
      ``count(batch)`` with the class attribute ``unit`` (``"samples"``, ``"tokens"``) for the
      ``train/<unit>_per_s`` throughput (logged by the ``throughput`` callback).

    A whole task, e.g. mean absolute error regression::

        class MAEOptions(runjob.TaskOptions):
            def metrics(self):
                return {"mae": "min"}

        class MAE(runjob.Task):
            def loss(self, outputs, batch):
                return (outputs - self.targets(batch)).abs().mean()

            def evaluate(self, outputs, batch):
                return {"error": (outputs - self.targets(batch)).abs().flatten(1).mean(1)}

            def summarize(self, totals, count):
                return {"mae": totals["error"] / count}

        @runjob.hookimpl
        def runjob_register_tasks(register: Register) -> None:
            register("mae", lambda options, data: MAE(), options=MAEOptions)
    """


@hookspec
def runjob_register_callbacks(register: Register) -> None:
    """Register callbacks (``[callbacks.NAME]`` tables: a job switches on any number of them).

    Called once, at plugin load; call ``register(name, factory, options=..., description=...)``
    once per callback. ``options`` subclasses :class:`runjob.CallbackOptions`, which may declare the
    metrics the callback logs (``metrics()``) and those it reads (``watches()``), both checked by
    ``runjob validate``. ``factory(options) -> runjob.Callback``: an object with any of the events
    ``on_run_start(run)``, ``on_step(run, step, epoch, loss)``, ``on_log(run, step, epoch, metrics)``,
    ``on_evaluation_start(run, step, epoch)``, ``on_evaluation(run, step, epoch, metrics)``,
    ``on_train_end(run, step, epoch)``, ``on_run_end(run, status, error)``, and
    ``state_dict()`` / ``load_state_dict(state)`` for what goes into every checkpoint. Through
    ``run`` it may ``run.log(metrics)`` into the run's record and ``run.request_stop(reason)``.

    Unlike the event hooks below, which a plugin implements for every run on the machine (a
    company-wide logger), a callback runs only in the jobs that name it, with its options from the
    job file. A whole callback::

        class EveryOptions(runjob.CallbackOptions):
            steps: int = 100

            def metrics(self):
                return {"train/loss_spread": "min"}

        class Every(runjob.Callback):
            def __init__(self, options):
                self.steps, self.losses = options.steps, []

            def on_step(self, run, step, epoch, loss):
                self.losses.append(loss)
                if step % self.steps == 0:
                    spread = torch.stack(self.losses).std().item()
                    run.log({"train/loss_spread": spread})
                    self.losses = []

        @runjob.hookimpl
        def runjob_register_callbacks(register: Register) -> None:
            register("every", Every, options=EveryOptions)
    """


@hookspec
def runjob_run_start(run: Run) -> None:
    """Called once per process when training is about to begin.

    ``run`` is the :class:`runjob.Run`: the resolved job, the Accelerator, the prepared
    model, optimizer, scheduler and data loaders, the output directory and the MLflow run id
    (``None`` outside the main process). The model, optimizer and loaders are ready; no step has
    been taken.
    """


@hookspec
def runjob_after_step(run: Run, step: int, epoch: int, loss: torch.Tensor) -> None:
    """Called on every process after each optimizer step.

    ``run`` is the :class:`runjob.Run`; ``step`` is the global optimizer step just finished
    (1-based), ``epoch`` the 0-based epoch, ``loss`` the step's training loss on this process as a
    detached 0-dim tensor (the last micro-batch's when accumulating). Calling ``loss.item()`` waits
    for the device: do it only every few steps, as the host does for ``train.log_every``.
    """


@hookspec
def runjob_after_log(run: Run, step: int, metrics: dict[str, float]) -> None:
    """Called on the main process each time training metrics are logged (every ``train.log_every``
    optimizer steps).

    ``run`` is the :class:`runjob.Run`, ``step`` the global optimizer step; ``metrics`` maps
    metric names (``train/loss``, ``lr``, and what the callbacks logged in ``on_log``: with the
    callbacks on by default ``train/<unit>_per_s`` with the task's unit, e.g.
    ``train/samples_per_s``, ``train/tflops`` and peak memory) to floats, exactly as sent to MLflow
    and ``metrics.jsonl`` at ``step``.
    """


@hookspec
def runjob_after_evaluation(run: Run, step: int, epoch: int, metrics: dict[str, float]) -> None:
    """Called on every process after each evaluation over the whole validation set (at the end of
    every epoch, and every ``train.eval_every`` optimizer steps when that is set).

    ``run`` is the :class:`runjob.Run`; ``step`` is the global optimizer step, ``epoch``
    the 0-based epoch being trained, and ``metrics`` maps the task's declared metrics, prefixed
    ``val/``, to floats, identical on every process. (The specification
    used to read ``(run, epoch, step, metrics)``; hooks get their arguments by name, so an
    implementation written either way receives the same values.)
    """


@hookspec
def runjob_run_end(run: Run, status: str, error: BaseException | None) -> None:
    """Called once per process when the run ends, whether it finished or failed.

    ``run`` is the :class:`runjob.Run`; ``status`` is ``"FINISHED"``, ``"FAILED"`` or
    ``"KILLED"`` (interrupted); ``error`` is the exception that ended it, or ``None``. Called before
    the MLflow run is closed. An exception raised here is reported but does not change the run's
    status.
    """
