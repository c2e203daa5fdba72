"""How a run ended, as :func:`runjob.run` returns it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: the exit code ``runjob run`` would give, its output folder and MLflow run
    id (``None`` when it recorded offline, or when workers ran it and recorded nothing)."""

    exit_code: int
    output_dir: Path | None
    run_id: str | None = None
