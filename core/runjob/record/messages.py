"""What the training process and the recording process say to each other, as typed records.

The training side (:mod:`runjob.record.recorder`) sends :data:`Message`\\ s down the pipe; the
recording side (:mod:`runjob.record.mirror`) answers with :data:`Reply`\\ s. In a thread the objects
travel as they are; between processes each is one JSON line, ``{"kind": ..., <its fields>}``
(:func:`encode`, :func:`decode`), written and checked by pydantic against the dataclass of its kind.
A line that does not decode is a bug on one side, and says which kind and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError

if TYPE_CHECKING:
    from runjob.record.local import MetricLine

Recording = Literal["process", "thread"]
"""Where MLflow's half of the record runs: ``process`` (``python -m runjob.record.mirror``, what a
training run uses) or ``thread`` (a thread of the caller, where MLflow is imported already)."""


# --- training side -> recording side --------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The first message of a main process: where and what to record. ``run_id`` None: a new run
    (created with ``tags`` and ``params``); else a resumed one, reopened."""

    kind: ClassVar[str] = "start"
    output_dir: str
    tracking_uri: str | None
    offline: bool
    run_id: str | None
    experiment: str
    run_name: str
    start_time: int | None
    tags: dict[str, str]
    params: dict[str, str]
    log_params: bool
    log_model: str
    model_name: str
    disabled: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Join:
    """The first message of another machine's first process: record its system metrics into the
    main process's run ``run_id``."""

    kind: ClassVar[str] = "join"
    output_dir: str
    tracking_uri: str | None
    run_id: str


@dataclass(frozen=True)
class Point:
    """One metric point, as a line of ``metrics.jsonl`` holds it."""

    key: str
    value: float
    step: int
    timestamp: int

    @classmethod
    def of(cls, data: MetricLine) -> Point:
        """A point from a ``metrics.jsonl`` line's object."""
        return cls(str(data["key"]), float(data["value"]), int(data["step"]), int(data["timestamp"]))


@dataclass(frozen=True)
class Metrics:
    kind: ClassVar[str] = "metrics"
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Tags:
    kind: ClassVar[str] = "tags"
    tags: dict[str, str]


@dataclass(frozen=True)
class Artifact:
    """A file or folder of the output folder (``path``, relative to it) to upload into ``artifact_path``."""

    kind: ClassVar[str] = "artifact"
    path: str
    artifact_path: str | None


@dataclass(frozen=True)
class Input:
    """Dataset lineage: name, digest, source_type, source, profile, context (as ``mlflow_run.json``'s ``inputs``)."""

    kind: ClassVar[str] = "input"
    dataset: dict[str, Any]


@dataclass(frozen=True)
class Model:
    """Build the run's MLflow model from the saved weights; ``example``: a saved example input's file
    ("" for none); ``prediction``: the run's predictor's description."""

    kind: ClassVar[str] = "model"
    example: str
    disabled: dict[str, str]
    prediction: dict[str, Any] | None


@dataclass(frozen=True)
class End:
    kind: ClassVar[str] = "end"
    status: str
    end_time: int


@dataclass(frozen=True)
class Close:
    """Nothing more comes: send what is queued, answer :class:`Ended`, exit."""

    kind: ClassVar[str] = "close"


Message = Start | Join | Metrics | Tags | Artifact | Input | Model | End | Close


# --- recording side -> training side --------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The MLflow run is open (or, offline, where it would be)."""

    kind: ClassVar[str] = "started"
    run_id: str | None
    tracking_uri: str
    experiment_id: str | None
    default_uri: str


@dataclass(frozen=True)
class Refused:
    """MLflow would not open the run; ``error`` says why in one line."""

    kind: ClassVar[str] = "refused"
    error: str


@dataclass(frozen=True)
class ModelWritten:
    """The answer to :class:`Model`: the folder written and notes to print, or the ``error``."""

    kind: ClassVar[str] = "model_written"
    folder: str | None = None
    notes: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Ended:
    """The last reply: whether everything reached MLflow, what failed first, and whether a resumed
    run's catch-up was sent."""

    kind: ClassVar[str] = "ended"
    sent: bool
    failure: str | None = None
    failed_at: str | None = None
    caught_up: bool = False
    retried: int = 0
    """How many MLflow writes needed more than one try."""
    stopped: bool = False
    """The store stayed unreachable, so the rest of the record was not sent (else: only the writes
    ``failed_at`` names were skipped)."""


Reply = Started | Refused | ModelWritten | Ended

REPLIES = (Started, Refused, ModelWritten, Ended)

KINDS: dict[str, type[Message | Reply]] = {
    cls.kind: cls
    for cls in (Start, Join, Metrics, Tags, Artifact, Input, Model, End, Close, Started, Refused, ModelWritten, Ended)
}


_CONFIG = ConfigDict(ser_json_inf_nan="constants")  # a NaN or infinite metric stays one, not null
for _cls in (Point, *KINDS.values()):
    _cls.__pydantic_config__ = _CONFIG  # type: ignore[union-attr]  # pydantic reads it from a dataclass


_ADAPTERS: dict[type[Message | Reply], TypeAdapter[Message | Reply]] = {}


def _adapter(cls: type[Message | Reply]) -> TypeAdapter[Message | Reply]:
    """The pydantic adapter of a message class, made once, when first needed."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def encode(message: Message | Reply) -> str:
    """``message`` as one JSON line (without its newline): ``{"kind": ..., <its fields>}``."""
    body = _adapter(type(message)).dump_json(message).decode()
    head = '{"kind":' + json.dumps(message.kind)
    return head + ("}" if body == "{}" else "," + body[1:])


def decode(line: str) -> Message | Reply:
    """The message a line of :func:`encode` holds, each field checked against its type; a
    ValueError naming the kind and fields otherwise."""
    data = json.loads(line)
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        raise ValueError(f"not a recording message (no known kind): {line[:120]!r}")
    cls = KINDS[data.pop("kind")]
    expected = {f.name for f in fields(cls)}
    if set(data) != expected:
        raise ValueError(f"{cls.kind} message: fields {sorted(data)}, expected {sorted(expected)}")
    try:
        message: Message | Reply = _adapter(cls).validate_python(data)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise ValueError(f"{cls.kind} message: {where} = {problem.get('input')!r:.80}: {problem['msg']}") from None
    return message
