"""Where MLflow is: the tracking URI (a database or a server; never the deprecated file store),
the artifact root that goes with it, one probe of a database server, how long a tracking
server's requests may wait (``bounded``), and the URI as shown (its password masked)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from ledger.errors import MlflowSinkError
from ledger.libpq import connect_args
from ledger.redact import REDACTED

DEFAULT_TRACKING_URI: Final = "sqlite:///mlflow.db"
DEFAULT_ARTIFACT_DIR: Final = "mlartifacts"
#: Schemes that MLflow serves from a SQL database through SQLAlchemy.
DB_SCHEMES: Final = frozenset({"sqlite", "postgresql", "mysql", "mssql"})


def resolve_tracking_uri(explicit: str | None) -> tuple[str, Path | None]:
    """The URI to use, and the default artifact root that goes with it (None: the server's).

    Raises:
        MlflowSinkError: a plain path or a ``file:`` URI (MLflow's deprecated file store).
    """
    raw = explicit if explicit is not None else os.environ.get("MLFLOW_TRACKING_URI", "")
    uri = raw.strip() or DEFAULT_TRACKING_URI
    scheme = urlsplit(uri).scheme.lower()
    # one letter: a Windows drive ("C:\\mlruns"), which is a path too
    if len(scheme) <= 1 or scheme == "file":
        raise MlflowSinkError(
            f"MLflow tracking URI {uri!r} is a file store, which MLflow has deprecated: use "
            "sqlite:///mlflow.db (or another database URI) or an http(s):// tracking server",
            tracking_uri=display_uri(uri),
            operation="configure",
        )
    dialect = scheme.split("+", 1)[0]
    if dialect == "sqlite":
        return absolute_sqlite(uri)
    if dialect in DB_SCHEMES:
        return uri, Path.cwd() / DEFAULT_ARTIFACT_DIR
    return uri, None


def absolute_sqlite(uri: str) -> tuple[str, Path | None]:
    """Pin a relative sqlite path to the current directory, so a later chdir changes nothing."""
    prefix, sep, rest = uri.partition(":///")
    if not sep:
        return uri, Path.cwd() / DEFAULT_ARTIFACT_DIR  # "sqlite://": in memory
    path, query_sep, query = rest.partition("?")
    if path in ("", ":memory:"):
        return uri, Path.cwd() / DEFAULT_ARTIFACT_DIR
    absolute = Path(path) if path.startswith("/") else Path.cwd() / path
    return f"{prefix}:///{absolute}{query_sep}{query}", absolute.parent / DEFAULT_ARTIFACT_DIR


def artifact_location(root: str | Path | None) -> str | None:
    if root is None:
        return None
    if isinstance(root, str) and "://" in root:
        return root  # already a URI (s3://, gs://, file:///…)
    return Path(root).resolve().as_uri()


def probe_database(uri: str) -> bool:
    """Connect once to a server database before MLflow does: whether it holds an MLflow store
    already (its ``runs`` table; ``True`` for a URI that is no database server's).

    MLflow retries a failing database connection ten times with backoff (about 100 s) before
    it gives up; one direct attempt turns "server down" into an error at once.

    Raises:
        sqlalchemy.exc.SQLAlchemyError, ImportError: the server refuses, or no driver.
    """
    dialect = urlsplit(uri).scheme.lower().split("+", 1)[0]
    if dialect not in DB_SCHEMES or dialect == "sqlite":
        return True
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    url = sqlalchemy.make_url(uri)
    engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=connect_args(url))
    try:
        with engine.connect() as conn:
            return sqlalchemy.inspect(conn).has_table("runs")
    finally:
        engine.dispose()


#: The MLflow HTTP settings ``bounded`` sets.
HTTP_SETTINGS: Final = (
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
)

#: MLflow's HTTP settings for the first contact with a tracking server (``bounded``): two
#: retries 2 s apart, 10 s for each request. MLflow's own (7 retries, a backoff doubling from
#: 2 s, 120 s a request) held a tracking server that is not there for 4 minutes (a refused
#: port) to over 16 (an address that never answers) before a command said a word.
FIRST_CONTACT: Final[Mapping[str, str]] = MappingProxyType(
    {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    }
)

#: ... for each later call of a sink while MLflow answers (a round's writes, a fill-in): two
#: retries (at once, then 4 s later), 30 s for each request. With MLflow's own, a call to a
#: tracking server gone silent mid-round (SIGSTOPped, wedged) held the round about 20
#: minutes; now about a minute and a half. A server slower than that is taken for one away:
#: the round goes on with the ledger as its record and fills MLflow in when it answers
#: (``orchestrator.mirror``).
ANSWERING: Final[Mapping[str, str]] = MappingProxyType(
    {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    }
)

#: ... for each call after one that MLflow did not answer, until one is answered (a round's
#: tries of whether MLflow is back, and its close while MLflow is away): one request, 10 s.
#: Before, each such try waited out MLflow's own retries again, about 20 minutes.
AWAY: Final[Mapping[str, str]] = MappingProxyType(
    {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    }
)


#: The settings for the calls of this context (thread): ``bounded``'s, read by MLflow
#: through ``_Scoped``.
_SCOPED: ContextVar[Mapping[str, str]] = ContextVar(
    "mlflow_http_settings", default=MappingProxyType({})
)
_SCOPING = threading.Lock()


@contextmanager
def bounded(uri: str, settings: Mapping[str, str]) -> Iterator[None]:
    """MLflow's HTTP requests to a tracking server (``http(s)://``) bounded by ``settings``
    (``FIRST_CONTACT``, ``ANSWERING``, ``AWAY``) while the block runs, in this thread only,
    each setting the environment does not set: the user's own ``MLFLOW_HTTP_REQUEST_*`` win.
    The environment is never written: another thread (its own settings, or MLflow's), a
    child process, and whatever runs after the block see it as it was. Blocks nest (the
    inner one's settings, then the outer's again). Another URI is left as it is (a database
    is probed once as it is opened, ``probe_database``, and a PostgreSQL one has libpq's
    bounds, ``ledger.libpq``)."""
    if urlsplit(uri).scheme.lower() not in ("http", "https"):
        yield
        return
    _scope_mlflow_settings()
    token = _SCOPED.set(MappingProxyType(dict(settings)))
    try:
        yield
    finally:
        _SCOPED.reset(token)


def _scope_mlflow_settings() -> None:
    """MLflow 3 reads ``MLFLOW_HTTP_REQUEST_*`` from the environment at each request (its
    REST store passes ``http_request`` no timeout or retries, and no client takes them), so
    these settings' readers (``mlflow.environment_variables``: the objects its REST calls and
    artifact uploads read) are given this context's ``bounded`` settings where the
    environment sets none. Done once; tests/test_mlflow_http_scope.py checks MLflow still
    reads them this way."""
    from mlflow import environment_variables

    with _SCOPING:
        for name in HTTP_SETTINGS:
            variable = getattr(environment_variables, name)
            if not isinstance(variable.__dict__.get("get_raw"), _Scoped):
                variable.get_raw = _Scoped(name)


class _Scoped:
    """A setting's reader: the environment's value, else this context's ``bounded`` one."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> str | None:
        value = os.environ.get(self.name)
        return value if value is not None else _SCOPED.get().get(self.name)


def display_uri(uri: str) -> str:
    """The URI with any password replaced by ``***`` (it goes into error messages)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:{REDACTED}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def created_whole(uri: str) -> None:
    """A SQLite tracking store that does not exist yet, created whole: MLflow's schema
    migrations run on a file of its own beside it, which takes the store's name only once
    they are done. Created in place, a first command interrupted mid-migration (Ctrl-C a
    second in) left a store no later command could open ("table … already exists"). A
    store that exists, or another database, is left to MLflow.
    """
    final = sqlite_file(uri)
    if final is None or final.exists():
        return
    prefix = uri.partition(":///")[0]
    if not final.parent.is_dir():
        return  # MLflow makes the folder, as it always did
    for left in final.parent.glob(f".{final.name}.creating-*"):
        if not _running(left.name.rpartition("-")[2]):  # a creation killed midway
            left.unlink(missing_ok=True)
    making = final.with_name(f".{final.name}.creating-{os.getpid()}")
    making.unlink(missing_ok=True)
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    # MLflow's own default for the store's default experiment, as MlflowClient would make it
    store = SqlAlchemyStore(  # type: ignore[no-untyped-call]
        f"{prefix}:///{making}", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    )
    store.engine.dispose()
    try:
        os.link(making, final)  # never over a store another command made meanwhile
    except FileExistsError:
        pass
    finally:
        making.unlink(missing_ok=True)


def sqlite_file(uri: str) -> Path | None:
    """The file of a SQLite URI with an absolute path (``absolute_sqlite``'s); ``None`` for
    another database, a server, or a store in memory."""
    _, sep, rest = uri.partition(":///")
    path = rest.partition("?")[0]
    if not sep or urlsplit(uri).scheme.lower().split("+", 1)[0] != "sqlite":
        return None
    if path in ("", ":memory:") or not path.startswith("/"):
        return None
    return Path(path)


def _running(pid: str) -> bool:
    """Whether process ``pid`` (text) runs on this machine."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
