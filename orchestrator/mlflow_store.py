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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ledger import Ledger, MlflowSinkError, OtherMlflowStore, RoundRecord
from ledger.mlflow_holds import glance
from ledger.mlflow_open import no_store_there
from ledger.mlflow_uri import display_uri, resolve_tracking_uri

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
        raise OtherMlflowStore(
            f"{_not_the_store(configured, e.tracking_uri, logged, experiment, e.missing)}. "
            "Nothing was written to it: point MLFLOW_TRACKING_URI (else the profile's "
            "mlflow_uri) at the "
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


def _not_the_store(
    configured: str, uri: str, logged: Logged, experiment: str, missing: bool
) -> str:
    """The round's start and ``status`` alike: the store at ``uri`` (``configured``: as
    given) is not the one the ledger ``logged`` to, and what it lacks."""
    rounds = f"{logged.rounds} round{'s' if logged.rounds != 1 else ''}"
    lacks = (
        f"there is no store there yet ({no_store_there(uri)}), while this ledger logged "
        f"{rounds} of this cluster to MLflow (experiment {experiment}; the last, round "
        f"{logged.last_round}, as run {logged.run_id})"
        if missing
        else f"it has no run {logged.run_id}, the last of the {rounds} of this cluster "
        f"this ledger logged to MLflow (round {logged.last_round}, experiment {experiment})"
    )
    return (
        f"MLflow at {uri}{_relative(configured, uri)} is not the store this ledger's rounds "
        f"logged to: {lacks}"
    )


@dataclass(frozen=True)
class SeenFromHere:
    """What ``status`` says of the MLflow store a round from here would open: ``other``, it
    is not the ledger's (``--json``'s ``other_mlflow_store``); ``away``, it did not answer,
    so whether it is cannot be told (``mlflow_away``). Neither: it is, or nothing to check."""

    other: str | None = None
    away: str | None = None


def seen_from_here(configured: str, rounds: Sequence[RoundRecord], experiment: str) -> SeenFromHere:
    """Whether the MLflow store a round's command would open from this folder (``configured``,
    as given) holds the last run the ledger logged of a cluster (its ``rounds``; its MLflow
    ``experiment``), glanced at as ``ledger.mlflow_holds`` does for each kind of store:
    read-only, nothing created, within ``GLANCE_S``; a store that does not answer is away,
    not another store."""
    logged = logged_in(rounds)
    if logged is None:
        return SeenFromHere()
    try:
        uri = resolve_tracking_uri(configured)[0]
    except MlflowSinkError:
        return SeenFromHere()  # the round's command says
    seen = glance(uri, logged.run_id)
    shown = display_uri(uri)
    if seen.holds is False:
        return SeenFromHere(
            other=f"{_not_the_store(configured, shown, logged, experiment, seen.missing)}; the "
            "next round refuses it: point MLFLOW_TRACKING_URI at the store that has them, or "
            f"run it with {NEW_STORE_FLAG}"
        )
    if seen.away is not None:
        return SeenFromHere(
            away=f"MLflow at {shown} is away ({seen.away}): whether it holds this ledger's "
            f"runs (the last, round {logged.last_round}'s run {logged.run_id}) is not known; "
            "a round waits for it, as it answered this ledger before"
        )
    return SeenFromHere()
