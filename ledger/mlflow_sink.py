"""The MLflow sink: one parent run per round, one child run per experiment.

The SQL ledger is the source of truth; MLflow is where a person looks. Every call names its
run id explicitly through ``MlflowClient`` (never the fluent ``mlflow.start_run``), so there is
no global active run that could leak between rounds or tests, and a resumed round logs to the
runs it created before.

Secrets never reach MLflow: params, tags and texts are redacted before they are logged (see
``Redactor``). Every MLflow, database and filesystem failure comes out as ``MlflowSinkError``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeVar

from knobs.spec import clipped
from ledger.base import did_not_answer
from ledger.errors import MlflowSinkError
from ledger.libpq import bounded_uri
from ledger.mlflow_uri import (
    ANSWERING,
    AWAY,
    DEFAULT_TRACKING_URI,
    FIRST_CONTACT,
    artifact_location,
    bounded,
    created_whole,
    display_uri,
    probe_database,
    resolve_tracking_uri,
)
from ledger.mlflow_values import (
    MAX_RUN_NAME,
    artifact_path,
    chunks,
    clean_keys,
    param_entries,
    sanitize_key,
    stringify,
    tag_entries,
    truncate,
)
from ledger.redact import Redactor, redacted_copy

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

_T = TypeVar("_T")

__all__ = ["DEFAULT_TRACKING_URI", "MlflowSink", "MlflowSinkError", "RunState"]

TAG_ROUND: Final = "orchestrate.round"
TAG_CLUSTER: Final = "orchestrate.cluster"
TAG_EXPERIMENT: Final = "orchestrate.experiment"
TAG_KIND: Final = "orchestrate.kind"
_PARENT_TAG: Final = "mlflow.parentRunId"

#: MLflow's loggers that say, at INFO, what its store does as it is opened ("Creating initial
#: MLflow database tables...", alembic's migrations): WARNING and above still reach the terminal.
_STORE_LOGGERS: Final = ("mlflow.store.db.utils", "mlflow.store.db_migrations", "alembic")

_STATUSES: Final = frozenset({"FINISHED", "FAILED", "KILLED"})
_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})

#: The experiment tag MLflow 3's UI reads to choose its view, and the value for runs tables.
EXPERIMENT_KIND_TAG: Final = "mlflow.experimentKind"
EXPERIMENT_KIND: Final = "custom_model_development"
# MLflow's own batch limits (mlflow.utils.validation), restated so that importing this module
# does not import mlflow; tests/test_mlflow_sink.py checks they still match the installed one.
_MAX_PARAMS_TAGS_PER_BATCH: Final = 100
_MAX_METRICS_PER_BATCH: Final = 1000


def mlflow_experiment(cluster: str) -> str:
    """The MLflow experiment a cluster's rounds go to (one per cluster). A round started by an
    older orchestrate, in the shared experiment ``orchestrate``, goes on in it: its children
    follow its parent run."""
    return f"orchestrate/{cluster}"


def _quiet_store_logs() -> None:
    """The terminal keeps to orchestrate's own lines: MLflow's INFO lines about its store
    (created, migrated) are not shown; its warnings and errors are. Set after mlflow is
    imported, which configures its loggers as it is."""
    import mlflow  # noqa: F401  (its loggers configured first, then quieted)

    for name in _STORE_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)


@dataclass(frozen=True)
class RunState:
    """What a run holds now: its status (``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``),
    its tags and the names of its metrics. What a resume reads to complete a run a kill left
    open."""

    status: str
    tags: Mapping[str, str]
    metrics: frozenset[str]


class MlflowSink:
    """Logs rounds and experiments to MLflow under one experiment (default ``orchestrate``).

    ``tracking_uri`` defaults to ``$MLFLOW_TRACKING_URI``, then ``sqlite:///mlflow.db`` in the
    working directory. A relative sqlite path is made absolute once, here. Artifacts of a new
    experiment go to ``artifact_root`` when given, else to ``mlartifacts/`` next to a sqlite
    database (``./mlartifacts`` for the default), else ``./mlartifacts`` for other databases;
    a tracking server (``http(s)://``) chooses its own unless ``artifact_root`` is a remote
    URI (``s3://``): never a path of this machine. An existing experiment keeps the artifact
    location it was created with.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str = "orchestrate",
        artifact_root: str | Path | None = None,
    ) -> None:
        """Open the tracking store (running MLflow's schema migrations if it is new) and find
        or create the experiment.

        Raises:
            MlflowSinkError: the URI is a file store or a plain path, the store cannot be
                reached or opened, or the experiment exists but is deleted.
        """
        self.tracking_uri, default_artifacts = resolve_tracking_uri(tracking_uri)
        self.experiment_name = experiment_name
        root = artifact_root if artifact_root is not None else default_artifacts
        local = root is not None and not (isinstance(root, str) and "://" in root)
        if self.tracking_uri.startswith(("http://", "https://")) and (
            local or str(root).startswith("file:")
        ):
            # a tracking server keeps the artifacts (``mlflow server --serve-artifacts``): a
            # path of this machine would be a dead link for everyone else
            root = None
        self._artifact_location = artifact_location(root)
        #: whether the last call found MLflow not answering (its next is a short try)
        self._away = False
        #: asked before every write (``fence``)
        self._fence: Callable[[], None] = _unfenced
        with self._translate("open the tracking store", first=True):
            _quiet_store_logs()
            probe_database(self.tracking_uri)
            created_whole(self.tracking_uri)
            # Imported here: importing mlflow costs about a second, and code that only needs
            # MlflowSinkError (the CLI, for one) should not pay it.
            from mlflow.tracking import MlflowClient

            # a PostgreSQL store's connections bounded as the ledger's are (``ledger.libpq``)
            self._client: MlflowClient = MlflowClient(tracking_uri=bounded_uri(self.tracking_uri))
            self.experiment_id = self._find_or_create_experiment()

    def fence(self, check: Callable[[], None] | None) -> None:
        """Ask ``check`` before every write to MLflow from now on (``None``: nothing): what it
        raises stops the write before MLflow is called. A process that lost its cluster to
        another orchestrator writes nothing to MLflow either, as the ledger takes nothing more
        of it (``orchestrator.lease.still_leased``)."""
        self._fence = check or _unfenced

    # -- runs ---------------------------------------------------------------------------------

    def start_round(
        self,
        *,
        round_id: int,
        cluster: str,
        params: Mapping[str, str],
        tags: Mapping[str, str] = _EMPTY,
    ) -> str:
        """Create the parent run ``round-<round_id>`` and return its run id.

        Raises:
            ValueError: two param or tag names become the same name once sanitised.
            MlflowSinkError: MLflow refused or failed to create the run or log its params.
        """
        system = {TAG_ROUND: str(round_id), TAG_CLUSTER: cluster, TAG_KIND: "round"}
        with self._translate("start round", write=True):
            return self._create_run(
                experiment_id=self.experiment_id,
                run_name=f"round-{round_id}",
                tags={**tags, **system},
                params=params,
            )

    def start_experiment(
        self,
        *,
        parent_run_id: str,
        number: int,
        kind: str,
        params: Mapping[str, object],
        tags: Mapping[str, str] = _EMPTY,
    ) -> str:
        """Create the child run ``exp-<number>`` under a round's run and return its run id.

        ``params`` are the knobs and the description; values that are not strings are written
        as JSON (``true``, ``0.9``, ``{"method": "dflash"}``).

        Raises:
            ValueError: two param or tag names become the same name once sanitised.
            MlflowSinkError: the parent run does not exist, or MLflow failed.
        """
        with self._translate("start experiment", write=True):
            parent = self._client.get_run(parent_run_id)
            system = {_PARENT_TAG: parent_run_id, TAG_EXPERIMENT: str(number), TAG_KIND: kind}
            round_tag = parent.data.tags.get(TAG_ROUND)
            if round_tag is not None:
                system[TAG_ROUND] = round_tag
            return self._create_run(
                experiment_id=parent.info.experiment_id,
                run_name=f"exp-{number}",
                tags={**tags, **system},
                params={key: stringify(value) for key, value in params.items()},
            )

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: int | None = None
    ) -> None:
        """Log metric values at ``step`` (0 when not given); names are sanitised to MLflow's
        characters (letters, digits, ``_ - . /`` and space; anything else becomes ``_``).

        Raises:
            ValueError: two names become the same name once sanitised.
            MlflowSinkError: MLflow failed (unknown run id included).
        """
        named = clean_keys(metrics, "metric")
        with self._translate("log metrics", write=True):
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            entries = [
                Metric(key=key, value=float(value), timestamp=now, step=step or 0)
                for key, value in named.items()
            ]
            for chunk in chunks(entries, _MAX_METRICS_PER_BATCH):
                self._client.log_batch(run_id, metrics=chunk, synchronous=True)

    def log_texts(self, run_id: str, texts: Mapping[str, str]) -> None:
        """Write each text as an artifact at its path (``launchers/node-0.sh``, ``cells.json``),
        redacted; a text whose path names a secret is replaced by ``***`` whole.

        Raises:
            ValueError: a path is absolute, empty, or climbs out with ``..``.
            MlflowSinkError: MLflow or the artifact store failed.
        """
        paths = {key: artifact_path(key, allow_root=False) for key in texts}
        if not texts:
            return
        redactor = Redactor.from_environment()
        with (
            self._translate("log texts", write=True),
            tempfile.TemporaryDirectory(prefix="mlflow-") as tmp,
        ):
            staging = Path(tmp)
            for key, text in texts.items():
                target = staging.joinpath(*paths[key].parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(redactor.value(key, text), encoding="utf-8")
            # One upload for all of them: one round trip to a remote artifact store.
            self._client.log_artifacts(run_id, str(staging))

    def log_files(self, run_id: str, files: Mapping[str, Path]) -> None:
        """Upload each local file into its artifact directory (``""`` is the run's root).

        A UTF-8 text file is redacted on the way (the local file is left as it is); other
        files are uploaded byte for byte.

        Raises:
            ValueError: a directory is absolute or climbs out with ``..``.
            MlflowSinkError: a file cannot be read, or MLflow or the artifact store failed.
        """
        dirs = {key: artifact_path(key, allow_root=True) for key in files}
        if not files:
            return
        redactor = Redactor.from_environment()
        with (
            self._translate("log files", write=True),
            tempfile.TemporaryDirectory(prefix="mlflow-") as tmp,
        ):
            for index, (key, local) in enumerate(files.items()):
                source = Path(local)
                redacted = redacted_copy(source, Path(tmp) / str(index), redactor)
                artifact_dir = str(dirs[key]) if dirs[key].parts else None
                self._client.log_artifact(run_id, str(redacted or source), artifact_dir)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Set (or overwrite) tags on a run, redacted and truncated to MLflow's limit.

        Raises:
            ValueError: two tag names become the same name once sanitised.
            MlflowSinkError: MLflow failed (unknown run id included).
        """
        entries = tag_entries(tags, Redactor.from_environment())
        with self._translate("set tags", write=True):
            self._log_tags(run_id, entries)

    def rename(self, run_id: str, name: str) -> None:
        """Give a run the name the UI lists it by (redacted, truncated to MLflow's limit).

        Raises:
            MlflowSinkError: MLflow failed (unknown run id included).
        """
        text = truncate(Redactor.from_environment().text(name), MAX_RUN_NAME)
        with self._translate("rename run", write=True):
            self._client.update_run(run_id, name=text)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        """Mark a run terminated with ``status``: FINISHED, FAILED or KILLED.

        Raises:
            ValueError: another status.
            MlflowSinkError: MLflow failed (unknown run id included).
        """
        if status not in _STATUSES:
            raise ValueError(f"status must be one of {sorted(_STATUSES)}, not {status!r}")
        with self._translate("finish run", write=True):
            self._client.set_terminated(run_id, status=status)

    def run_state(self, run_id: str) -> RunState | None:
        """The run's status, tags and metric names; ``None`` if there is no such run (or it
        was deleted).

        Raises:
            MlflowSinkError: MLflow failed.
        """
        from mlflow.exceptions import MlflowException

        with self._translate("read run"):
            try:
                run = self._client.get_run(run_id)
            except MlflowException as e:
                if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    return None
                raise
            if run.info.lifecycle_stage != "active":
                return None
            return RunState(
                status=str(run.info.status),
                tags=dict(run.data.tags),
                metrics=frozenset(run.data.metrics),
            )

    def find_run(self, tags: Mapping[str, str]) -> str | None:
        """The oldest active run of the experiment that carries every one of ``tags``
        (a run created just before a kill, whose id never reached the ledger); ``None``.

        Raises:
            ValueError: a tag name or value holds a quote or a backtick.
            MlflowSinkError: MLflow failed.
        """
        if any("'" in v or "`" in k or "'" in k for k, v in tags.items()):
            raise ValueError(f"tags to search by hold a quote: {dict(tags)!r}")
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        with self._translate("find run"):
            found = self._client.search_runs(
                [self.experiment_id],
                filter_string=query,
                max_results=1,
                order_by=["attributes.start_time ASC"],
            )
            return str(found[0].info.run_id) if found else None

    def metric_steps(self, run_id: str, key: str) -> set[int]:
        """The steps at which the run has logged metric ``key``.

        Raises:
            MlflowSinkError: MLflow failed (unknown run id included).
        """
        with self._translate("read metric history"):
            return {m.step for m in self._client.get_metric_history(run_id, sanitize_key(key))}

    def runs_of_round(self, parent_run_id: str) -> list[str]:
        """The child run ids of a round's run, in experiment-number order.

        Raises:
            MlflowSinkError: the parent run does not exist, or MLflow failed.
        """
        with self._translate("list runs of round"):
            parent = self._client.get_run(parent_run_id)
            # run ids are [0-9a-f]{32}; get_run above has already refused anything else
            query = f"tags.`{_PARENT_TAG}` = '{parent.info.run_id}'"
            found: list[tuple[int, int, str]] = []
            token: str | None = None
            while True:
                page = self._client.search_runs(
                    [parent.info.experiment_id],
                    filter_string=query,
                    max_results=1000,
                    page_token=token,
                )
                for run in page:
                    number = run.data.tags.get(TAG_EXPERIMENT, "")
                    order = int(number) if number.lstrip("-").isdigit() else 2**62
                    found.append((order, run.info.start_time or 0, run.info.run_id))
                token = page.token
                if not token:
                    break
        return [run_id for _, _, run_id in sorted(found)]

    # -- internals ----------------------------------------------------------------------------

    def _create_run(
        self,
        *,
        experiment_id: str,
        run_name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str],
    ) -> str:
        redactor = Redactor.from_environment()
        tagged = tag_entries(tags, redactor)
        given = param_entries(params, redactor)
        # The tags go in with the run: a child is never seen without its parent tag.
        run = self._client.create_run(experiment_id, tags=dict(tagged), run_name=run_name)
        run_id: str = run.info.run_id
        try:
            for chunk in chunks(given, _MAX_PARAMS_TAGS_PER_BATCH):
                self._client.log_batch(run_id, params=chunk, synchronous=True)
        except BaseException:
            # Not left RUNNING for ever in the UI; the original error is what matters.
            with suppress(Exception):
                self._client.set_terminated(run_id, status="FAILED")
            raise
        return run_id

    def _log_tags(self, run_id: str, entries: Sequence[tuple[str, str]]) -> None:
        from mlflow.entities import RunTag

        tags = [RunTag(key, value) for key, value in entries]
        for chunk in chunks(tags, _MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, tags=chunk, synchronous=True)

    def _find_or_create_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            try:
                created: str = self._client.create_experiment(
                    self.experiment_name,
                    artifact_location=self._artifact_location,
                    # MLflow 3's UI opens a "machine learning" experiment on its runs table
                    # (a GenAI one on traces, which a round has none of)
                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
                )
                return created
            except MlflowException as e:
                # Another orchestrator sharing this store created it first.
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = self._client.get_experiment_by_name(self.experiment_name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise MlflowSinkError(
                f"MLflow experiment {self.experiment_name!r} is deleted: restore it "
                f"(`mlflow experiments restore --experiment-id {experiment.experiment_id}`) "
                "or choose another experiment name",
                tracking_uri=display_uri(self.tracking_uri),
                operation="open the experiment",
            )
        experiment_id: str = experiment.experiment_id
        if EXPERIMENT_KIND_TAG not in experiment.tags:  # one an older orchestrate created
            self._client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return experiment_id

    @contextmanager
    def _translate(
        self, operation: str, *, first: bool = False, write: bool = False
    ) -> Iterator[None]:
        """Turn MLflow, SQLAlchemy, driver and filesystem errors into ``MlflowSinkError``;
        MLflow's requests bounded meanwhile (``mlflow_uri.bounded``): as a first contact, as a
        call to an MLflow that answers, or, after a call MLflow did not answer, as a short try
        of whether it is back (a round that goes on without MLflow never waits long on it).
        A ``write`` is fenced first (``fence``)."""
        from sqlalchemy.exc import SQLAlchemyError

        if write:
            self._fence()

        settings = FIRST_CONTACT if first else AWAY if self._away else ANSWERING
        try:
            with bounded(self.tracking_uri, settings):
                yield
        except MlflowSinkError as e:
            self._away = e.unreachable
            raise
        except (SQLAlchemyError, OSError, ImportError) as e:
            error = _sink_error(self.tracking_uri, operation, e)
            self._away = error.unreachable
            raise error from e
        except Exception as e:
            if _is_mlflow_exception(e):
                error = _sink_error(self.tracking_uri, operation, e)
                self._away = error.unreachable
                raise error from e
            raise
        self._away = False


def _unfenced() -> None:
    """The fence of a sink no lease holder writes through: every write goes."""


def _is_mlflow_exception(error: Exception) -> bool:
    from mlflow.exceptions import MlflowException

    return isinstance(error, MlflowException)


#: What MLflow's HTTP client says when the tracking server did not answer (MLflow words the
#: requests/urllib3 failure into its own exception) or a gateway in front of it had no server.
_AWAY = (
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
    return isinstance(error, Exception) and _is_mlflow_exception(error) and away


def _sink_error(uri: str, operation: str, error: BaseException) -> MlflowSinkError:
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
