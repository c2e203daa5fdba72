"""Where a model's weights start and which of them train: ``model.init_from``, ``model.freeze``,
and the optimizer's parameter groups (``[optimizer] groups``, ``no_decay_norm_and_bias``).

Everything here works on the plain model, before Accelerate wraps it, by the names of
``named_parameters()`` and ``state_dict()``. A name, pattern or file that does not fit the model is
one line naming the job file, the key and what would fit (a :class:`JobError`, exit code 2).
"""

from __future__ import annotations

import difflib
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runjob.errors import JobError, Problem, RunjobError, describe
from runjob.host.run_folder import MODELS_FILE, WEIGHTS_FILE, RunFolder
from runjob.job.schema import RUNS_URI
from runjob.record.local import RunRecord
from runjob.record.store import download_artifact
from runjob.tags import INIT_FROM_RUN_TAG, INIT_FROM_TAG

if TYPE_CHECKING:
    import torch

    from runjob.job.validation import ResolvedJob

SHOWN = 4
"""How many names a message lists before '...'."""


def _listed(names: list[str], shown: int = SHOWN) -> str:
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def job_problem(job: ResolvedJob, key: str, message: str) -> JobError:
    """A mistake in ``key`` of the job that only the built model shows, as validation reports one:
    ``file:line: key: message``."""
    origin = job.source.origin(key)
    return JobError([Problem(origin.file, key, message, origin.line)])


# ---------------------------------------------------------------------------------------------
# Loading weights by name


@dataclass
class Transfer:
    """What :func:`load_matching` did: tensors copied, tensors kept at the model's own
    initialisation because their shape differs (name, shape here, shape in the source), and the
    names only one side has."""

    loaded: list[str] = field(default_factory=list)
    reinitialised: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def mismatch(self) -> str:
        """The missing and unexpected names, in one line (empty when both match)."""
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing from the weights ({_listed(self.missing)})")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} not in the model ({_listed(self.unexpected)})")
        return "; ".join(parts)

    def summary(self, total: int) -> str:
        """``N of M tensors``, and which were re-initialised because their shape differs."""
        text = f"{len(self.loaded)} of {total} tensors"
        if self.reinitialised:
            shapes = ", ".join(
                f"{name} {list(here)} here, {list(there)} there" for name, here, there in self.reinitialised
            )
            text += f"; re-initialised, their shape differs (the model's fresh init kept): {shapes}"
        return text


def load_matching(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> Transfer:
    """Copy the tensors of ``state`` into ``model`` by name. A tensor whose shape differs (a new
    classification head) is left as the model initialised it. Tensors the model ties together (a
    language model's input and output embedding, stored once in a safetensors file) count as loaded
    when any of their names is. The model is changed only when no name is missing or unexpected."""
    own = model.state_dict(keep_vars=True)
    aliases: dict[int, list[str]] = {}
    for name, tensor in own.items():
        aliases.setdefault(id(tensor), []).append(name)
    transfer = Transfer()
    accepted: dict[str, torch.Tensor] = {}
    covered: set[str] = set()
    transfer.unexpected = [name for name in state if name not in own]
    for name in own:  # the model's order, not the file's
        if name not in state:
            continue
        tensor = state[name]
        here, there = tuple(own[name].shape), tuple(tensor.shape)
        if here != there:
            transfer.reinitialised.append((name, here, there))
        else:
            accepted[name] = tensor
            transfer.loaded.append(name)
        covered.update(aliases[id(own[name])])
    transfer.missing = [name for name in own if name not in covered]
    if not transfer.missing and not transfer.unexpected:
        model.load_state_dict(accepted, strict=False)
    return transfer


# ---------------------------------------------------------------------------------------------
# model.init_from


@dataclass(frozen=True)
class Source:
    """Where ``init_from`` weights come from: the local file, and the MLflow run that made them."""

    file: Path
    run_id: str | None
    shown: str


def _record_run_id(folder: Path) -> str | None:
    """The MLflow run id of the output folder holding ``folder`` (the folder itself or, for
    ``best/``, its parent), when its record names one."""
    for candidate in (folder, folder.parent):
        try:
            record = RunRecord.read(candidate)
        except RunjobError:
            return None
        if record is not None:
            return record.run_id
    return None


def fetch_source(value: str, tracking_uri: str | None, scratch: Path) -> Source:
    """The weights file ``init_from = value`` names: a path checked by validation, or an MLflow
    run's artifact downloaded into ``scratch``."""
    if not value.startswith(RUNS_URI):
        path = Path(value)
        file = RunFolder(path).weights if path.is_dir() else path
        return Source(file, _record_run_id(file.parent), str(file))
    run_id, _, artifact = value.removeprefix(RUNS_URI).partition("/")
    artifact = artifact or WEIGHTS_FILE
    if not artifact.endswith(".safetensors"):
        artifact = f"{artifact}/{WEIGHTS_FILE}"

    where = f"cannot download {artifact} of MLflow run {run_id} from {tracking_uri}"
    try:
        local = download_artifact(tracking_uri, run_id, artifact, scratch)
    except RunjobError as error:  # an unreachable server
        raise RunjobError(f"{where}: {error}") from None
    if local is None:
        local = _weights_named_by_record(tracking_uri, run_id, artifact, scratch)
    if local is None:
        raise RunjobError(f"{where}: no such run, or it has no such artifact")
    return Source(Path(local), run_id, f"{artifact} of MLflow run {run_id}")


def _weights_named_by_record(tracking_uri: str | None, run_id: str, artifact: str, scratch: Path) -> Path | None:
    """The weights of the model the run named (``run.add_model``: ``best`` for ``runs:/ID/best``),
    as its record of models, ``models.json``, says where MLflow holds them (the final
    ``model.safetensors`` when they are the same bytes, stored once)."""
    name = artifact.removesuffix(f"/{WEIGHTS_FILE}")
    if name == artifact or not name:
        return None
    record = download_artifact(tracking_uri, run_id, MODELS_FILE, scratch / "record")
    if record is None:
        return None
    try:
        entry = json.loads(Path(record).read_text(encoding="utf-8")).get(name) or {}
    except (OSError, ValueError, AttributeError):
        return None
    named = entry.get("artifact") if isinstance(entry, dict) else None
    return download_artifact(tracking_uri, run_id, named, scratch) if isinstance(named, str) and named else None


def init_from(model: torch.nn.Module, job: ResolvedJob, tracking_uri: str | None) -> tuple[str, dict[str, str]]:
    """Load ``model.init_from`` into ``model`` (strict: every name must match; a tensor of another
    shape keeps the model's fresh init). Returns the line to show and the lineage tags."""
    # lazy: `runjob JOB` says its first line and starts its recording process before safetensors loads (train.entry)
    from safetensors.torch import load_file

    value = job.model_setup.init_from
    key = "model.init_from"
    if value is None:
        raise job_problem(job, key, "not set")
    with tempfile.TemporaryDirectory(prefix="runjob-init-") as scratch:
        try:
            source = fetch_source(value, tracking_uri, Path(scratch))
        except RunjobError as error:
            raise job_problem(job, key, str(error)) from None
        try:
            state = load_file(str(source.file), device="cpu")
        except Exception as error:  # noqa: BLE001 - not a safetensors file, truncated, unreadable
            raise job_problem(job, key, f"cannot read {source.shown}: {describe(error)}") from None
    transfer = load_matching(model, state)
    mismatch = transfer.mismatch()
    if mismatch:
        message = (
            f"the weights in {source.shown} do not fit model {job.model.name!r} (names differ: another model, or "
            f"other options): {mismatch}"
        )
        raise job_problem(job, key, message)
    run = f" (MLflow run {source.run_id})" if source.run_id else ""
    line = f"{key}: {source.shown}{run}: {transfer.summary(len(model.state_dict()))}"
    tags = {INIT_FROM_TAG: value}
    if source.run_id:
        tags[INIT_FROM_RUN_TAG] = source.run_id
    return line, tags


# ---------------------------------------------------------------------------------------------
# model.freeze and parameter groups


def _no_match(job: ResolvedJob, key: str, pattern: str, names: list[str]) -> JobError:
    """``pattern`` matches no parameter name: say so with the names it might have meant."""
    prefixes = sorted({".".join(name.split(".")[:depth]) for name in names for depth in range(1, 3)})
    close = difflib.get_close_matches(pattern, prefixes, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    top = list(dict.fromkeys(name.split(".")[0] for name in names))
    message = (
        f"{pattern!r} matches no parameter of model {job.model.name!r} (matched from the start of the name); {hint}"
        f"its parameters are under: {_listed(top, 12)}"
    )
    return job_problem(job, key, message)


def freeze(model: torch.nn.Module, job: ResolvedJob) -> str | None:
    """Switch off gradients for the parameters ``model.freeze`` matches; the line to show, or None."""
    patterns = job.model_setup.freeze
    if not patterns:
        return None
    named = list(model.named_parameters())
    names = [name for name, _ in named]
    regexes = []
    for pattern in patterns:
        regex = re.compile(pattern)
        if not any(regex.match(name) for name in names):
            raise _no_match(job, "model.freeze", pattern, names)
        regexes.append(regex)
    frozen = [(name, p) for name, p in named if any(regex.match(name) for regex in regexes)]
    if len(frozen) == len(named):
        raise job_problem(job, "model.freeze", f"{patterns} freezes every parameter: nothing would be trained")
    for _, parameter in frozen:
        parameter.requires_grad_(False)
    weights = sum(p.numel() for _, p in frozen)
    total = sum(p.numel() for _, p in named)
    return (
        f"frozen: {len(frozen)} of {len(named)} parameter tensors ({weights:,} of {total:,} weights), "
        f"e.g. {_listed([name for name, _ in frozen], 3)}"
    )


def _norm_types() -> tuple[type, ...]:
    # lazy: `runjob JOB` says its first line and starts its recording process before torch loads (train.entry)
    import torch.nn as nn

    types: list[type] = [nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm]
    if hasattr(nn, "RMSNorm"):
        types.append(nn.RMSNorm)
    return tuple(types)


def no_decay_ids(model: torch.nn.Module) -> set[int]:
    """The parameters ``no_decay_norm_and_bias`` exempts from weight decay: every parameter of a
    normalization layer (batch, instance, layer, group and RMS norm, by module type) and every
    parameter named ``bias``."""
    norms = _norm_types()
    exempt: set[int] = set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if isinstance(module, norms) or name == "bias":
                exempt.add(id(parameter))
    return exempt


def param_groups(model: torch.nn.Module, job: ResolvedJob) -> tuple[list[dict[str, Any]], str | None]:
    """The optimizer's param groups, as torch.optim takes them (``params``, ``param_names`` and the
    group's own ``lr`` / ``weight_decay``): the default group first (the optimizer's own options),
    then ``[optimizer] groups`` in order, each split in two when ``no_decay_norm_and_bias`` exempts
    some of its parameters. Frozen parameters are left out. Returns the line to show when groups
    were asked for."""
    setup = job.optimizer_setup
    named = list(model.named_parameters())
    names = [name for name, _ in named]
    regexes = [re.compile(group.params) for group in setup.groups]
    # the trainable parameters of each group: [default, group 0, ...]
    members: list[list[tuple[str, torch.nn.Parameter]]] = [[] for _ in range(len(regexes) + 1)]
    for name, parameter in named:
        if parameter.requires_grad:
            chosen = next((i for i, regex in enumerate(regexes) if regex.match(name)), -1)
            members[chosen + 1].append((name, parameter))
    for index, (group, regex) in enumerate(zip(setup.groups, regexes, strict=True)):
        key = f"optimizer.groups.{index}.params"
        if not any(regex.match(name) for name in names):
            raise _no_match(job, key, group.params, names)
        if not members[index + 1]:
            message = (
                f"{group.params!r} matches only parameters that are frozen (model.freeze) or taken by an earlier "
                "group (the first matching group wins): the group would be empty"
            )
            raise job_problem(job, key, message)
    exempt = no_decay_ids(model) if setup.no_decay_norm_and_bias else set()
    groups: list[dict[str, Any]] = []
    described = []
    for index, params in enumerate(members):
        overrides = {}
        label = "default"
        if index:
            group = setup.groups[index - 1]
            overrides = {k: v for k, v in (("lr", group.lr), ("weight_decay", group.weight_decay)) if v is not None}
            label = repr(group.params)
        decay = [(n, p) for n, p in params if id(p) not in exempt]
        kept = [(n, p) for n, p in params if id(p) in exempt]
        for part, extra in ((decay, {}), (kept, {"weight_decay": 0.0})):
            if part:
                groups.append(
                    {"params": [p for _, p in part], "param_names": [n for n, _ in part], **overrides, **extra}
                )
        if params:
            settings = ", ".join(f"{k} {v:g}" for k, v in overrides.items())
            exempted = f", {len(kept)} of them without weight decay" if kept else ""
            described.append(f"{label} {len(params)} tensors{f' ({settings})' if settings else ''}{exempted}")
    line = f"optimizer groups: {'; '.join(described)}" if setup.groups or setup.no_decay_norm_and_bias else None
    return groups, line
