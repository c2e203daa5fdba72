"""Keeping secrets out of MLflow: values of keys that name a secret, and passwords in URLs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runjob.job.jobfile import Tables

HIDDEN = "***"
_SECRET_KEY = re.compile(r"(token|password|passwd|secret|api[_-]?key|access[_-]?key|credential|auth)", re.IGNORECASE)
_URL_PASSWORD = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]+)@", re.IGNORECASE
)


def redact_text(text: str) -> str:
    """``https://me:pw@host`` -> ``https://me:***@host``; anything else unchanged."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{HIDDEN}@", text)


def redact(key: str, value: object) -> object:
    """The value to record for ``key``: hidden when the key names a secret, URL passwords masked."""
    if _SECRET_KEY.search(key.rsplit(".", 1)[-1]):
        return HIDDEN
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact(f"{key}.{k}", v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(key, v) for v in value]
    return value


def redact_tables(tables: Tables) -> Tables:
    """A copy of job tables with every secret hidden."""
    return {key: redact(key, value) for key, value in tables.items()}


def redact_override(override: str) -> str:
    """``tracking.tags.api_token=abc`` -> ``tracking.tags.api_token=***``."""
    key, sep, value = override.partition("=")
    hidden = redact(key.strip(), value)
    return f"{key}{sep}{hidden}" if sep else redact_text(override)
