"""Whether the MLflow store a round's command opens is the one this ledger's rounds logged to.

MLflow makes a new, empty store wherever a tracking URI points: a store moved or cleaned away,
or a relative ``sqlite:///mlflow.db`` taken from another folder (a cron job's is $HOME), and a
night's record went into a new file while the project's stayed as it was, the history split
across two stores and nothing said. The ledger names the MLflow run of each round it logged:
a store without the last of them is another store (or a new one), refused at the command's
start in one line that names both, nothing written to either or to the ledger — unless the
person says a new store is meant (``round --new-mlflow-store``); its rounds then log to that
one, and the next command finds the ledger's last run there.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ledger import Ledger, MlflowSinkError, OtherMlflowStore, RoundRecord
from ledger.mlflow_uri import display_uri, resolve_tracking_uri, sqlite_file

T = TypeVar("T")

#: The flag of ``orchestrate round`` that takes a store without the ledger's runs.
NEW_STORE_FLAG = "--new-mlflow-store"


@dataclass(frozen=True)
class Logged:
    """What a cluster's rounds logged to MLflow, by the ledger: how many rounds have a run,
    and the last of them (its round and run id)."""

    rounds: int
    last_round: int
    run_id: str


def logged_before(ledger: Ledger, cluster: str) -> Logged | None:
    """The runs ``cluster``'s rounds logged to MLflow (``None``: none ever did, a first round
    or an MLflow that never answered this ledger)."""
    return logged_in(ledger.rounds(cluster))


def logged_in(rounds: Sequence[RoundRecord]) -> Logged | None:
    """``logged_before`` of a cluster's ``rounds``, read already."""
    logged = [r for r in rounds if r.mlflow_run_id]
    if not logged:
        return None
    last = max(logged, key=lambda r: r.id)
    return Logged(rounds=len(logged), last_round=last.id, run_id=str(last.mlflow_run_id))


def the_same_store(
    open_: Callable[[str | None], T],
    *,
    logged: Logged | None,
    new_store: bool,
    configured: str,
    experiment: str,
) -> T:
    """``open_(run_id)``, the store opened only if it holds ``run_id``, the run the ledger
    ``logged`` last (``None``: any store, where nothing was logged or ``new_store`` says a new
    one is meant). ``configured``: the tracking URI as given (a relative SQLite path is said
    with the file it was taken for); ``experiment``: the cluster's MLflow experiment.

    Raises:
        OtherMlflowStore: the store does not hold the run, in one line: the store, the
            ledger's runs, and what to do.
    """
    try:
        return open_(None if new_store or logged is None else logged.run_id)
    except OtherMlflowStore as e:
        if logged is None:
            raise
        rounds = f"{logged.rounds} round{'s' if logged.rounds != 1 else ''}"
        lacks = (
            f"there is no store there yet (no such file), while this ledger logged {rounds} "
            f"of this cluster to MLflow (experiment {experiment}; the last, round "
            f"{logged.last_round}, as run {logged.run_id})"
            if e.missing
            else f"it has no run {logged.run_id}, the last of the {rounds} of this cluster "
            f"this ledger logged to MLflow (round {logged.last_round}, experiment {experiment})"
        )
        raise OtherMlflowStore(
            f"MLflow at {e.tracking_uri}{_relative(configured, e.tracking_uri)} is not the "
            f"store this ledger's rounds logged to: {lacks}. Nothing was written to it: "
            "point MLFLOW_TRACKING_URI (else the profile's mlflow_uri) at the "
            "store that has them (an absolute sqlite:////path for a command run from another "
            "folder) and run the command again; or, to log this cluster's rounds to this store "
            f"from now on, run it with {NEW_STORE_FLAG} (the rounds before stay where they are)",
            tracking_uri=e.tracking_uri,
            run_id=e.run_id,
            missing=e.missing,
        ) from None


def _relative(configured: str, opened: str) -> str:
    """`` (the relative sqlite:///mlflow.db, taken from /home/u, where this command runs)``
    where the URI given was a relative SQLite path; else nothing."""
    given = display_uri(configured.strip())
    if not given.lower().startswith("sqlite") or given == opened:
        return ""
    return f" (the relative {given}, taken from {Path.cwd()}, where this command runs)"


def seen_from_here(configured: str, rounds: Sequence[RoundRecord]) -> str | None:
    """What ``status`` says of a SQLite MLflow store, as the round's command would find it
    from this folder, that lacks the ledger's last run: read without MLflow, never written
    (``None``: it has the run, nothing was logged, or the store is a server's, which
    ``status`` does not contact)."""
    logged = logged_in(rounds)
    if logged is None:
        return None
    try:
        uri = resolve_tracking_uri(configured)[0]
    except MlflowSinkError:
        return None
    file = sqlite_file(uri)
    if file is None:
        return None
    if file.exists():
        try:
            with closing(sqlite3.connect(f"{file.as_uri()}?mode=ro", uri=True)) as db:
                found = db.execute("SELECT 1 FROM runs WHERE run_uuid = ?", (logged.run_id,))
                if found.fetchone() is not None:
                    return None
        except sqlite3.Error:
            return None  # not MLflow's, or locked: the round's command says
    return (
        f"MLflow at {uri}{_relative(configured, uri)} is not the store this ledger's rounds "
        f"logged to: it has no run {logged.run_id} (round {logged.last_round}, the last of "
        f"{logged.rounds} logged); the next round refuses it: point MLFLOW_TRACKING_URI at "
        f"the store that has them, or run it with {NEW_STORE_FLAG}"
    )
