"""Opening MLflow for the sink: where a new experiment's artifacts go, the store opened (its
INFO lines kept off the terminal, a server database probed once, a new SQLite store created
whole, its connections bounded, one that must hold a run refused without it), and the
experiment found or created.

The policies it owns: a tracking server keeps its own artifacts (never a path of this machine);
an experiment another orchestrator created first is the one used; a deleted experiment is
refused with the way to restore it; every experiment carries the tag MLflow 3's UI reads to
open it on its runs table. Importing it does not import mlflow.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ledger.errors import MlflowSinkError, OtherMlflowStore
from ledger.libpq import bounded_uri
from ledger.mlflow_uri import (
    artifact_location,
    created_whole,
    display_uri,
    probe_database,
    sqlite_file,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

#: MLflow's loggers that say, at INFO, what its store does as it is opened ("Creating initial
#: MLflow database tables...", alembic's migrations): WARNING and above still reach the terminal.
_STORE_LOGGERS: Final = ("mlflow.store.db.utils", "mlflow.store.db_migrations", "alembic")
#: MLflow's database layer: it logs an error, then raises it (``_quiet_store_logs``)
_RAISED_LOGGER: Final = "mlflow.store.db.utils"

#: MLflow's error codes for a run a store does not have (a run id it never made is
#: ``INVALID_PARAMETER_VALUE`` to some stores): another store, for the round's start and for
#: ``status`` alike (``mlflow_holds``).
NOT_THIS_STORES: Final = frozenset({"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"})

#: The experiment tag MLflow 3's UI reads to choose its view, and the value for runs tables.
EXPERIMENT_KIND_TAG: Final = "mlflow.experimentKind"
EXPERIMENT_KIND: Final = "custom_model_development"


def new_artifact_location(
    tracking_uri: str, artifact_root: str | Path | None, default_artifacts: Path | None
) -> str | None:
    """Where the artifacts of an experiment created on ``tracking_uri`` go: ``artifact_root``
    when given, else ``default_artifacts`` (``mlflow_uri.resolve_tracking_uri``'s); ``None``
    (the server chooses) for a tracking server unless the root is a remote URI (``s3://``)."""
    root = artifact_root if artifact_root is not None else default_artifacts
    local = root is not None and not (isinstance(root, str) and "://" in root)
    if tracking_uri.startswith(("http://", "https://")) and (
        local or str(root).startswith("file:")
    ):
        # a tracking server keeps the artifacts (``mlflow server --serve-artifacts``): a
        # path of this machine would be a dead link for everyone else
        root = None
    return artifact_location(root)


def open_store(tracking_uri: str, holds: str | None = None) -> MlflowClient:
    """The client of the tracking store at ``tracking_uri``, its schema migrated if it is new
    — unless it must hold run ``holds`` (the last the ledger logged to MLflow), which a new
    store cannot: a SQLite file that is not there is then not made, nor MLflow's tables in a
    database server's database that has none.

    Raises:
        OtherMlflowStore: the store does not hold run ``holds`` (nothing was written to it).
        sqlalchemy.exc.SQLAlchemyError, ImportError, OSError, MlflowException: as the store
            or its driver failed (the sink translates them).
    """
    _quiet_store_logs()
    has_store = probe_database(tracking_uri)
    file = sqlite_file(tracking_uri)
    if holds is not None and (not has_store or (file is not None and not file.exists())):
        raise OtherMlflowStore(
            f"MLflow at {display_uri(tracking_uri)} is no store yet "
            f"({no_store_there(tracking_uri)})",
            tracking_uri=display_uri(tracking_uri),
            run_id=holds,
            missing=True,
        )
    created_whole(tracking_uri)
    # Imported here: importing mlflow costs about a second, and code that only needs
    # MlflowSinkError (the CLI, for one) should not pay it.
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    # a PostgreSQL store's connections bounded as the ledger's are (``ledger.libpq``)
    client = MlflowClient(tracking_uri=bounded_uri(tracking_uri))
    if holds is not None:
        try:
            client.get_run(holds)  # a run deleted in the UI is still the store's
        except MlflowException as e:
            if e.error_code not in NOT_THIS_STORES:
                raise
            raise OtherMlflowStore(
                f"MLflow at {display_uri(tracking_uri)} has no run {holds}",
                tracking_uri=display_uri(tracking_uri),
                run_id=holds,
                missing=False,
            ) from None
    return client


def no_store_there(tracking_uri: str) -> str:
    """What there is where no MLflow store is yet: no file, or a database without its tables."""
    if sqlite_file(tracking_uri) is not None:
        return "no such file"
    return "a database without MLflow's tables"


def _quiet_store_logs() -> None:
    """The terminal keeps to orchestrate's own lines: MLflow's INFO lines about its store
    (created, migrated) are not shown; its warnings and errors are, but for those of its
    database layer (``_RAISED_LOGGER``), which logs each database error it then raises, with
    its traceback and its SQL: the sink translates the error it raises into one line (a store
    locked for a minute put four tracebacks in a night's log, each read as a crash). Set after
    mlflow is imported, which configures its loggers as it is."""
    import mlflow  # noqa: F401  (its loggers configured first, then quieted)

    for name in _STORE_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
    raised = logging.getLogger(_RAISED_LOGGER)
    if _errors_it_raises not in raised.filters:
        raised.addFilter(_errors_it_raises)


def _errors_it_raises(record: logging.LogRecord) -> bool:
    """``_RAISED_LOGGER``'s records but its errors: each is an error it then raises, which the
    sink says in one line; its warnings still show."""
    return record.levelno < logging.ERROR


def find_or_create_experiment(
    client: MlflowClient, name: str, artifact_location: str | None, tracking_uri: str
) -> str:
    """The id of the active experiment ``name``, created (at ``artifact_location``) if none.

    Raises:
        MlflowSinkError: the experiment exists but is deleted.
        MlflowException: MLflow failed.
    """
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            created: str = client.create_experiment(
                name,
                artifact_location=artifact_location,
                # MLflow 3's UI opens a "machine learning" experiment on its runs table
                # (a GenAI one on traces, which a round has none of)
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
            )
            return created
        except MlflowException as e:
            # Another orchestrator sharing this store created it first.
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise MlflowSinkError(
            f"MLflow experiment {name!r} is deleted: restore it "
            f"(`mlflow experiments restore --experiment-id {experiment.experiment_id}`) "
            "or choose another experiment name",
            tracking_uri=display_uri(tracking_uri),
            operation="open the experiment",
        )
    experiment_id: str = experiment.experiment_id
    if EXPERIMENT_KIND_TAG not in experiment.tags:  # one an older orchestrate created
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment_id
