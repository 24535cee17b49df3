"""Whether an MLflow store holds a run, glanced at for a command that must not wait on MLflow
(``orchestrate status``): read-only, nothing created, within ``GLANCE_S`` whatever the store.

Each kind the sink opens (``mlflow_uri``) is looked at its own way: a SQLite file read by
``sqlite3`` (no file: no store there yet); a tracking server (``http(s)://``) asked for the
run once, as the round's start asks it (``mlflow_open.open_store``: MLflow's request with its
credentials and TLS settings), no retries, its own timeout rather than the user's
``MLFLOW_HTTP_REQUEST_TIMEOUT``; a database server (PostgreSQL, MySQL, …) connected to once
with the ledger's connect bounds (``ledger.libpq``) and its ``runs`` table read (none: no
MLflow store there yet). Whatever does not end within ``GLANCE_S`` (a server stopped, an
address that never answers, a name that does not resolve) is said as away, not as another
store: whether it holds the run is then not known. Importing it imports neither mlflow nor
SQLAlchemy.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from ledger.mlflow_open import NOT_THIS_STORES
from ledger.mlflow_uri import AWAY, DB_SCHEMES, sqlite_file

#: The longest a glance waits for the store, in seconds: a request, a connection, a query;
#: as long as one request to a tracking server that did not answer may wait (``AWAY``): a
#: server slower than that is taken for one away by a round too.
GLANCE_S: Final = float(AWAY["MLFLOW_HTTP_REQUEST_TIMEOUT"])


@dataclass(frozen=True)
class Glance:
    """What a glance found: ``holds`` the run (``None``: not known, ``away`` says why where
    the store did not answer; a store that answered in a way that says nothing, a SQLite file
    locked or not MLflow's, has neither); ``missing``: no store there at all yet."""

    holds: bool | None
    missing: bool = False
    away: str | None = None


def glance(uri: str, run_id: str, within_s: float = GLANCE_S) -> Glance:
    """Whether the store at ``uri`` (absolute, as ``resolve_tracking_uri`` gives it) holds
    run ``run_id``, in at most about ``within_s`` seconds; never raises for the store."""
    file = sqlite_file(uri)
    if file is not None:
        if not file.exists():
            return Glance(holds=False, missing=True)
        try:
            with closing(sqlite3.connect(f"{file.as_uri()}?mode=ro", uri=True)) as db:
                found = db.execute("SELECT 1 FROM runs WHERE run_uuid = ?", (run_id,))
                return Glance(holds=found.fetchone() is not None)
        except sqlite3.Error:
            return Glance(holds=None)  # not MLflow's, or locked: the round's command says
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        return _within(lambda: _server(uri, run_id, within_s), within_s)
    if scheme.split("+", 1)[0] in DB_SCHEMES:
        return _within(lambda: _database(uri, run_id), within_s)
    return Glance(holds=None)


def _within(look: Callable[[], Glance], within_s: float) -> Glance:
    """``look()``, in a thread of its own, given ``within_s`` (and a second's grace): what it
    found, or away. The thread is a daemon: one that never returns ends with the command."""
    found: list[Glance] = []

    def run() -> None:
        try:
            found.append(look())
        except Exception as e:  # a glance never fails the command
            found.append(Glance(holds=None, away=_why(e, within_s)))

    thread = threading.Thread(target=run, name="mlflow-glance", daemon=True)
    thread.start()
    thread.join(within_s + 1.0)
    if not found:
        return Glance(holds=None, away=f"no answer within {within_s:g}s")  # DNS, a stuck read
    return found[0]


def _server(uri: str, run_id: str, within_s: float) -> Glance:
    """A tracking server asked for the run once (MLflow's REST call, its credentials)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        answer = http_request(  # type: ignore[no-untyped-call]
            get_default_host_creds(uri),  # type: ignore[no-untyped-call]
            "/api/2.0/mlflow/runs/get",
            "GET",
            max_retries=0,
            timeout=within_s,
            raise_on_status=False,
            params={"run_id": run_id},
        )
    except Exception as e:  # refused, timed out, a name that does not resolve
        return Glance(holds=None, away=_why(e, within_s))
    if answer.status_code == 200:
        return Glance(holds=True)
    try:
        code = answer.json().get("error_code")
    except ValueError:
        code = None
    if code in NOT_THIS_STORES:
        return Glance(holds=False)
    if answer.status_code >= 500:  # a proxy whose server is down, a server that fails
        return Glance(holds=None, away=f"it answered HTTP {answer.status_code}")
    return Glance(holds=None)  # refused us (credentials?): the round's command says why


def _database(uri: str, run_id: str) -> Glance:
    """A database server connected to once, its ``runs`` table read."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    from ledger.libpq import connect_args

    url = sqlalchemy.make_url(uri)
    engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=connect_args(url))
    try:
        try:
            conn = engine.connect()
        except sqlalchemy.exc.SQLAlchemyError as e:
            return Glance(holds=None, away=_why(e, GLANCE_S))
        with conn:
            if not sqlalchemy.inspect(conn).has_table("runs"):
                return Glance(holds=False, missing=True)
            found = conn.execute(
                sqlalchemy.text("SELECT 1 FROM runs WHERE run_uuid = :run"), {"run": run_id}
            )
            return Glance(holds=found.first() is not None)
    except sqlalchemy.exc.SQLAlchemyError:
        return Glance(holds=None)  # it answered, and said nothing of the run
    finally:
        engine.dispose()


#: What a failed request or connection says, by the words its error has, in a person's words.
_WHY: Final = (
    (("refused",), "connection refused"),
    (("timed out", "timeout"), "no answer within {s}s"),
    (
        ("name or service not known", "failed to resolve", "nodename nor servname"),
        "its host name does not resolve",
    ),
)


def _why(e: BaseException, within_s: float) -> str:
    """Why the store did not answer, in a few words (else its error's first line, cut)."""
    text = str(e).strip()
    for words, said in _WHY:
        if any(w in text.lower() for w in words):
            return said.format(s=f"{within_s:g}")
    first = (text.splitlines() or [type(e).__name__])[0]
    return first if len(first) <= 160 else first[:157] + "…"
