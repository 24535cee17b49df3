"""What an MLflow failure becomes: one ``MlflowSinkError`` that names the operation and the store
(its first line redacted and clipped), and whether it says MLflow did not answer.

The sink's policy for a failure lives here: every MLflow, database and filesystem error comes
out as ``MlflowSinkError``; one that says MLflow (its tracking server or its database) did not
answer is marked ``unreachable``, and the sink's next call is then a short try of whether it is
back (``mlflow_uri.AWAY``). Importing it does not import mlflow.
"""

from __future__ import annotations

from typing import Final

from knobs.spec import clipped
from ledger.base import did_not_answer
from ledger.errors import MlflowSinkError
from ledger.mlflow_uri import display_uri
from ledger.redact import Redactor

#: What MLflow's HTTP client says when the tracking server did not answer (MLflow words the
#: requests/urllib3 failure into its own exception) or a gateway in front of it had no server.
_AWAY: Final = (
    "max retries exceeded",
    "connection refused",
    "connection reset",
    "connection aborted",
    "failed to establish a new connection",
    "timed out",
    "error code 502",
    "error code 503",
    "error code 504",
)


def is_mlflow_exception(error: Exception) -> bool:
    """Whether ``error`` is MLflow's own (``MlflowException``)."""
    from mlflow.exceptions import MlflowException

    return isinstance(error, MlflowException)


def _did_not_answer(error: BaseException) -> bool:
    """Whether ``error`` says MLflow (its server or its database) did not answer."""
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(error, SQLAlchemyError):
        return did_not_answer(error)
    if isinstance(error.__cause__, SQLAlchemyError):
        # MLflow's SQL store words its database's failure as its own: the driver's says
        return did_not_answer(error.__cause__)
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    away = any(w in str(error).lower() for w in _AWAY)
    return isinstance(error, Exception) and is_mlflow_exception(error) and away


def sink_error(uri: str, operation: str, error: BaseException) -> MlflowSinkError:
    """``error``, met as MLflow at ``uri`` was asked to ``operation``, as the sink raises it."""
    shown = display_uri(uri)
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    reason = clipped(Redactor.from_environment().text(first_line), 500)
    hint = ""
    if isinstance(error, ImportError) and "psycopg2" in str(error):
        hint = " (psycopg 3 is installed: write the URI as postgresql+psycopg://…)"
    return MlflowSinkError(
        f"MLflow could not {operation} at {shown}: {type(error).__name__}: {reason}{hint}",
        tracking_uri=shown,
        operation=operation,
        unreachable=_did_not_answer(error),
    )
