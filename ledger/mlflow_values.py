"""What the MLflow sink hands MLflow, made acceptable to it: keys MLflow accepts on every
platform (``sanitize_key``, ``clean_keys``), params and tags redacted and cut to MLflow's limits
(``param_entries``, ``tag_entries``, ``truncate``), values as text (``stringify``), artifact
paths that stay inside their run (``artifact_path``) and batches of MLflow's size (``chunks``).
Importing it does not import mlflow.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Final, TypeVar

from ledger.redact import Redactor

if TYPE_CHECKING:
    from mlflow.entities import Param

_T = TypeVar("_T")

TRUNCATION_MARK: Final = "...[truncated]"

# MLflow's own limits (mlflow.utils.validation), restated so that importing this module does
# not import mlflow; tests/test_mlflow_sink.py checks they still match the installed mlflow.
MAX_PARAM_VALUE: Final = 6000
MAX_TAG_VALUE: Final = 8000
MAX_KEY: Final = 250
#: MLflow's limit on a run's name (characters).
MAX_RUN_NAME: Final = 250


def sanitize_key(key: str) -> str:
    """A name MLflow accepts on every platform: ASCII letters, digits, ``_ - . /`` and space,
    no empty, ``.`` or ``..`` path segment, at most 250 characters."""
    cleaned = re.sub(r"[^A-Za-z0-9_\-. /]", "_", key)
    parts = [part for part in cleaned.split("/") if part not in ("", ".", "..")]
    joined = "/".join(parts)[:MAX_KEY].rstrip("/")
    return joined or "_"


def clean_keys(mapping: Mapping[str, _T], what: str) -> dict[str, _T]:
    """Sanitised key → value.

    Raises:
        ValueError: two keys sanitise to the same key.
    """
    cleaned: dict[str, _T] = {}
    origin: dict[str, str] = {}
    for key, value in mapping.items():
        clean = sanitize_key(key)
        if clean in origin:
            raise ValueError(
                f"{what} names {origin[clean]!r} and {key!r} both become {clean!r} in MLflow"
            )
        origin[clean] = key
        cleaned[clean] = value
    return cleaned


def truncate(value: str, limit: int) -> str:
    if len(value) <= limit:
        return value
    return value[: limit - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def param_entries(params: Mapping[str, str], redactor: Redactor) -> list[Param]:
    from mlflow.entities import Param

    return [
        Param(key, truncate(redactor.value(key, str(value)), MAX_PARAM_VALUE))
        for key, value in clean_keys(params, "param").items()
    ]


def tag_entries(tags: Mapping[str, str], redactor: Redactor) -> list[tuple[str, str]]:
    return [
        (key, truncate(redactor.value(key, str(value)), MAX_TAG_VALUE))
        for key, value in clean_keys(tags, "tag").items()
    ]


def stringify(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, enum.Enum):
        return stringify(value.value)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def artifact_path(key: str, *, allow_root: bool) -> PurePosixPath:
    """A run-relative artifact path that stays inside the run.

    Raises:
        ValueError: absolute, empty (unless ``allow_root``), a backslash, or a ``..`` segment.
    """
    # "logs/" is the directory "logs"; "/" and "" are the run's root
    path = PurePosixPath(key.rstrip("/") if allow_root else key)
    if (
        "\\" in key
        or path.is_absolute()
        or ".." in path.parts
        or (not allow_root and not path.parts)
    ):
        raise ValueError(f"artifact path {key!r} must be relative and stay inside the run")
    return path


def chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
