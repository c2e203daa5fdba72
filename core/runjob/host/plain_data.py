"""What a run keeps of a plugin's objects is plain data: JSON values and files, never a pickle.

A run's predictor (``OUTPUT_DIR/predictor/``) holds the dataset's :class:`runjob.Inputs` and the
task's state as the values :meth:`runjob.Inputs.to_data` and :meth:`runjob.Task.to_data` give,
written as JSON, and is rebuilt from them by the installed plugins that registered the classes
(``runjob_register_inputs``). Reading a run therefore never runs code the run holds. This module
checks those values and gives :class:`runjob.Inputs` its default, read back from the arguments its
``__init__`` takes (as scikit-learn's ``get_params`` does).

Imports no torch, accelerate or mlflow (``runjob.host``: plugins use it).
"""

from __future__ import annotations

import inspect
import json
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, ValidationError, create_model

from runjob.host.json_types import JSONObject

if TYPE_CHECKING:
    from runjob.host.components import Inputs

PLAIN = "JSON values: None, booleans, integers, finite floats, strings, and lists and string-keyed dicts of them"


class NotPlainData(TypeError):
    """A value that is not plain data (:data:`PLAIN`): where in the value it is, and what it is."""


def check_plain(value: object, where: str) -> None:
    """Raise :class:`NotPlainData` naming the first part of ``value`` that JSON cannot hold as it is
    (``where``: the value's name, e.g. ``"CSVInputs.to_data()['mean']"``)."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotPlainData(f"{where} = {value!r}: not a finite number ({PLAIN})")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain(item, f"{where}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotPlainData(f"{where} has the key {key!r}, a {type(key).__name__}: keys must be strings")
            check_plain(item, f"{where}[{key!r}]")
        return
    raise NotPlainData(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, not plain data ({PLAIN})")


def as_json(value: JSONObject) -> JSONObject:
    """``value`` as JSON gives it back (tuples become lists): what a rebuilt object receives."""
    back: JSONObject = json.loads(json.dumps(value, allow_nan=False))
    return back


def init_arguments(cls: type) -> list[str]:
    """The names of the arguments ``cls.__init__`` takes (besides ``self``); ``TypeError`` when it
    also takes ``*args`` or ``**kwargs``, which cannot be read back by name."""
    names = []
    for name, parameter in inspect.signature(cls).parameters.items():  # the constructor's, without self
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(
                f"{cls.__qualname__}.__init__ takes {'*' if parameter.kind is parameter.VAR_POSITIONAL else '**'}"
                f"{name}, which cannot be read back by name: define to_data and from_data"
            )
        names.append(name)
    return names


def arguments_of(instance: object) -> JSONObject:
    """The default :meth:`runjob.Inputs.to_data`: each argument of the class's ``__init__`` read back
    from the attribute of the same name, which must hold plain data."""
    cls = type(instance)
    data: JSONObject = {}
    for name in init_arguments(cls):
        if not hasattr(instance, name):
            raise TypeError(
                f"{cls.__qualname__}.__init__ takes {name!r} but the object has no attribute {name!r} to read it back "
                "from: keep it under that name, or define to_data and from_data"
            )
        data[name] = getattr(instance, name)
    check_plain(data, f"{cls.__qualname__}'s arguments")
    return data


def checked_arguments(cls: type, data: JSONObject) -> dict[str, object]:
    """``data`` as the arguments of ``cls.__init__``, each checked against its annotation (pydantic,
    lax: a list where a tuple is annotated, an int where a float is); unannotated ones taken as they
    are. ``ValueError`` names an argument that is unknown, missing or of the wrong type."""
    names = init_arguments(cls)
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"{cls.__qualname__}.__init__ takes no {', '.join(map(repr, unknown))}")
    if not names:
        return {}
    signature = inspect.signature(cls, eval_str=True)  # the plugin's own annotations
    fields: dict[str, Any] = {}  # each argument's annotation (any type form) and default
    for name in names:
        parameter = signature.parameters[name]
        annotation = Any if parameter.annotation is parameter.empty else parameter.annotation
        fields[name] = (annotation, ... if parameter.default is parameter.empty else parameter.default)
    model = create_model(f"{cls.__qualname__}Arguments", __config__=ConfigDict(arbitrary_types_allowed=True), **fields)
    try:
        checked = model.model_validate(data)
    except ValidationError as error:
        problem = error.errors()[0]
        key = ".".join(str(part) for part in problem["loc"])
        shown = "" if problem["type"] == "missing" else f" = {json.dumps(problem.get('input'), default=repr)[:80]}"
        raise ValueError(f"{key}{shown}: {problem['msg']}") from None
    return {name: getattr(checked, name) for name in names if name in data or name in checked.model_fields_set}


def round_trip(instance: Inputs, folder: Path) -> Inputs:
    """``instance`` (a :class:`runjob.Inputs`) written as data into ``folder`` and rebuilt from it,
    as a run saves its predictor and ``runjob predict`` reads it back. Raises ``TypeError`` or
    ``ValueError`` saying what does not survive: data that is not plain, a rebuilt object of
    another class, or one whose data or columns differ."""
    cls = type(instance)
    folder.mkdir(parents=True, exist_ok=True)
    data = instance.to_data(folder)
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__qualname__}.to_data() returned a {type(data).__name__}, not a dict")
    check_plain(data, f"{cls.__qualname__}.to_data()")
    data = as_json(data)
    rebuilt = cls.from_data(data, folder)
    if type(rebuilt) is not cls:
        raise TypeError(
            f"{cls.__qualname__}.from_data() returned a {type(rebuilt).__qualname__}, not a {cls.__qualname__}"
        )
    with tempfile.TemporaryDirectory(prefix="runjob-round-trip-") as again:
        second = as_json(rebuilt.to_data(Path(again)))
    if second != data:
        changed = sorted(key for key in {*data, *second} if data.get(key) != second.get(key))
        raise ValueError(
            f"{cls.__qualname__} rebuilt by from_data(to_data()) gives other data for {', '.join(map(repr, changed))}: "
            "from_data must rebuild the object to_data describes"
        )
    if dict(rebuilt.columns) != dict(instance.columns):
        raise ValueError(
            f"{cls.__qualname__} rebuilt by from_data(to_data()) has the columns {dict(rebuilt.columns)}, not "
            f"{dict(instance.columns)}"
        )
    return rebuilt
