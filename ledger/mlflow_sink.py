"""The MLflow sink: one parent run per round, one child run per experiment.

The SQL ledger is the source of truth; MLflow is where a person looks. Every call names its
run id explicitly through ``MlflowClient`` (never the fluent ``mlflow.start_run``), so there is
no global active run that could leak between rounds or tests, and a resumed round logs to the
runs it created before.

Secrets never reach MLflow: params, tags and texts are redacted before they are logged (see
``Redactor``). Every MLflow, database and filesystem failure comes out as ``MlflowSinkError``
(``mlflow_failures`` words it). This module owns the runs: what a round's and an experiment's
run are named and tagged, what is logged to them and in what batches, how a resume finds them
again, and when a call is fenced or bounded; opening the store and the experiment is
``mlflow_open``'s, what MLflow is handed made acceptable is ``mlflow_values``'s.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from ledger.errors import MlflowSinkError
from ledger.mlflow_failures import is_mlflow_exception, sink_error
from ledger.mlflow_open import find_or_create_experiment, new_artifact_location, open_store
from ledger.mlflow_uri import (
    ANSWERING,
    AWAY,
    DEFAULT_TRACKING_URI,
    FIRST_CONTACT,
    bounded,
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

__all__ = ["DEFAULT_TRACKING_URI", "MlflowSink", "MlflowSinkError", "RunState"]

TAG_ROUND: Final = "orchestrate.round"
TAG_CLUSTER: Final = "orchestrate.cluster"
TAG_EXPERIMENT: Final = "orchestrate.experiment"
TAG_KIND: Final = "orchestrate.kind"
_PARENT_TAG: Final = "mlflow.parentRunId"

_STATUSES: Final = frozenset({"FINISHED", "FAILED", "KILLED"})
_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})

# MLflow's own batch limits (mlflow.utils.validation), restated so that importing this module
# does not import mlflow; tests/test_mlflow_sink.py checks they still match the installed one.
_MAX_PARAMS_TAGS_PER_BATCH: Final = 100
_MAX_METRICS_PER_BATCH: Final = 1000


def mlflow_experiment(cluster: str) -> str:
    """The MLflow experiment a cluster's rounds go to (one per cluster). A round started by an
    older orchestrate, in the shared experiment ``orchestrate``, goes on in it: its children
    follow its parent run."""
    return f"orchestrate/{cluster}"


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
        holds: str | None = None,
    ) -> None:
        """Open the tracking store (running MLflow's schema migrations if it is new) and find
        or create the experiment; with ``holds`` (the run the ledger logged last), only a
        store that has that run, nothing created or written in one that has not.

        Raises:
            OtherMlflowStore: the store does not hold run ``holds`` (another, or a new one).
            MlflowSinkError: the URI is a file store or a plain path, the store cannot be
                reached or opened, or the experiment exists but is deleted.
        """
        self.tracking_uri, default_artifacts = resolve_tracking_uri(tracking_uri)
        self.experiment_name = experiment_name
        location = new_artifact_location(self.tracking_uri, artifact_root, default_artifacts)
        #: whether the last call found MLflow not answering (its next is a short try)
        self._away = False
        #: asked before every write (``fence``)
        self._fence: Callable[[], None] = _unfenced
        with self._translate("open the tracking store", first=True):
            self._client: MlflowClient = open_store(self.tracking_uri, holds)
            self.experiment_id = find_or_create_experiment(
                self._client, self.experiment_name, location, self.tracking_uri
            )

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
            error = sink_error(self.tracking_uri, operation, e)
            self._away = error.unreachable
            raise error from e
        except Exception as e:
            if is_mlflow_exception(e):
                error = sink_error(self.tracking_uri, operation, e)
                self._away = error.unreachable
                raise error from e
            raise
        self._away = False


def _unfenced() -> None:
    """The fence of a sink no lease holder writes through: every write goes."""
