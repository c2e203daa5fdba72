"""A sweep's values checked before any trial: the base job resolved with each value of each
``[sweep]`` parameter (each bound of a range), and for a grid with every combination, so a value a
trial would refuse is reported at its line in the job file (``runjob validate`` and ``runjob sweep``)."""

from __future__ import annotations

import copy

from runjob.errors import JobError, Problem
from runjob.host.plugin_host import PluginHost
from runjob.job.jobfile import RawJob, apply_override
from runjob.job.schema import SWEEP_TABLE, SweepRange
from runjob.job.validation import ResolvedJob, resolve
from runjob.sweep.study import grid_points
from runjob.sweep.worker import override, shown


def _refused(job: ResolvedJob, host: PluginHost, overrides: list[str]) -> Problem | None:
    """The first problem with the base job plus ``overrides``, or None when it resolves."""
    raw = job.source
    trial = RawJob(raw.path, copy.deepcopy(raw.data), dict(raw.origins), [*raw.overrides, *overrides])
    for text in overrides:
        problem = apply_override(trial, text)
        if problem:
            return problem
    try:
        resolve(trial, host)
    except JobError as error:
        return error.problems[0]
    return None


def check_values(job: ResolvedJob, host: PluginHost) -> None:
    """Resolve the job with each value of each ``[sweep]`` parameter (each bound of a range) set,
    and for a grid with every combination, so a value a trial would refuse is reported now, at its
    line in the job file. Raises :class:`JobError`."""
    sweep = job.sweep
    if sweep is None:
        return
    problems: list[Problem] = []
    for key, spec in sweep.parameters.items():
        dotted = f"{SWEEP_TABLE}.parameters.{key}"
        origin = job.source.origin(dotted)
        seen: set[str] = set()
        for value in (spec.low, spec.high) if isinstance(spec, SweepRange) else spec:
            text = override(key, value)
            refused = _refused(job, host, [text])
            if refused is None or refused.message in seen:
                continue  # one line for a mistake every value repeats (an unknown key)
            seen.add(refused.message)
            detail = refused.message if refused.key in (key, text) else f"{refused.key}: {refused.message}"
            problems.append(Problem(origin.file, dotted, f"{text} is refused: {detail}", origin.line))
    if not problems and sweep.method == "grid":
        problems.extend(_refused_combination(job, host))
    if problems:
        raise JobError(problems)


def _refused_combination(job: ResolvedJob, host: PluginHost) -> list[Problem]:
    """The first grid point whose values are refused together (each is fine alone)."""
    assert job.sweep is not None
    for point in grid_points(job.sweep.parameters):
        refused = _refused(job, host, [override(k, v) for k, v in point.items()])
        if refused is not None:
            where = f"{SWEEP_TABLE}.parameters"
            origin = job.source.origin(where)
            return [
                Problem(
                    origin.file,
                    where,
                    f"the combination {shown(point)} is refused: {refused.key}: {refused.message}",
                    origin.line,
                )
            ]
    return []
