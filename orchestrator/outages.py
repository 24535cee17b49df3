"""A ledger or an MLflow that does not answer, waited out rather than losing the night.

A ledger that does not answer mid-round (a PostgreSQL restart at night) is waited out
(``through_ledger_outages``): the round is built afresh and resumes from its last committed
step, as the same command would after a kill. So are a ledger server and an MLflow that do not
answer when the round's command opens them (``waiting_for_ledger``, ``waiting_for_mlflow``): a
night a timer starts while PostgreSQL or the tracking server restarts is not lost — provided
this machine reached them before; one never reached is taken for a wrong URL and refused at
once. (Mid-round, MLflow away is ``orchestrator.mirror``'s.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from ledger import Ledger, LedgerError, MlflowSinkError
from orchestrator import policy
from orchestrator.mlflow_store import logged_before

T = TypeVar("T")


def through_ledger_outages(
    run: Callable[[], T],
    *,
    note: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    waits: Sequence[float] = policy.LEDGER_WAITS,
) -> T:
    """``run()``, and again after a wait each time the ledger did not answer
    (``LedgerError.unreachable``): ``run`` builds the round afresh and runs it, so it resumes
    from the last step the ledger committed, as the same command would after a kill.

    Raises:
        LedgerError: the ledger refused what it was asked, or still did not answer after the
            last wait (the round stays open for the same command to resume).
    """
    return _waited(
        run,
        LedgerError,
        lambda message, wait: (
            f"the ledger did not answer ({message}); nothing it recorded is "
            f"lost: the round waits {wait:g}s and resumes from it"
        ),
        note,
        sleep,
        waits,
    )


def waiting_for_ledger(
    open_: Callable[[], T],
    *,
    url: str,
    reached_before: bool,
    note: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    waits: Sequence[float] = policy.LEDGER_WAITS,
) -> T:
    """``open_()`` (the ledger at ``url``, opened as a round's command starts), and again after
    a wait each time a ledger server did not answer (``LedgerError.unreachable``), on the
    schedule of a ledger away mid-round — if this machine has ``reached_before`` that server
    (``contacts.ledger_reached``): a night a timer starts while PostgreSQL restarts is not
    lost. One never reached from here is taken for a URL that names nothing (a wrong host,
    port or address) and refused at once, as is a SQLite ledger that cannot be opened (a local
    file: a wrong path is far likelier than a disk that comes back).

    Raises:
        LedgerError: the ledger refused (a newer schema, a bad URL, a user, password or
            database its server does not know), is a SQLite file that could not be opened,
            is a server never reached from here that did not answer (at once), or still did
            not answer after the last wait.
    """
    if url.startswith("sqlite"):
        return open_()
    if not reached_before:
        try:
            return open_()
        except LedgerError as e:
            if not e.unreachable:
                raise
            raise LedgerError(
                f"{e.message}; this machine has never reached this ledger, so it is not waited "
                "for as an outage: check the ledger URL (ORCHESTRATE_LEDGER, else the "
                "profile's ledger_url) and that its server is up, then run the command again",
                url=e.url,
                unreachable=True,
            ) from None
    return _waited(
        open_,
        LedgerError,
        lambda message, wait: (
            f"the ledger did not answer ({message}); waiting {wait:g}s before trying again "
            "(Ctrl-C stops; the same command starts the round later)"
        ),
        note,
        sleep,
        waits,
    )


def waiting_for_mlflow(
    open_: Callable[[], T],
    *,
    reached_before: bool,
    note: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    waits: Sequence[float] = policy.LEDGER_WAITS,
) -> T:
    """``open_()`` (MLflow, opened as a command starts), and again after a wait each time
    MLflow did not answer (``MlflowSinkError.unreachable``), on the ledger's schedule — if the
    ledger has ``reached_before`` (``mlflow_reached``): an MLflow that answered this ledger's
    rounds and does not answer now is away for a while. One that never answered it is taken
    for a tracking URI that names nothing (a wrong port, host or scheme) and refused at once,
    while the person who typed it is still there to read why.

    Raises:
        MlflowSinkError: MLflow is configured wrongly or refused (at once), never answered
            this ledger (at once), or still did not answer after the last wait.
    """
    if not reached_before:
        try:
            return open_()
        except MlflowSinkError as e:
            if not e.unreachable:
                raise
            raise MlflowSinkError(
                f"{e.message}; this ledger's rounds have never reached an MLflow, so it is "
                "not waited for as an outage: check the tracking URI (MLFLOW_TRACKING_URI, "
                "else the profile's mlflow_uri) and that its server is up, then run the "
                "command again",
                tracking_uri=e.tracking_uri,
                operation=e.operation,
                unreachable=True,
            ) from None
    return _waited(
        open_,
        MlflowSinkError,
        lambda message, wait: (
            f"MLflow did not answer ({message}); waiting {wait:g}s before trying again"
        ),
        note,
        sleep,
        waits,
    )


def mlflow_reached(ledger: Ledger, cluster: str) -> bool:
    """Whether MLflow ever answered a round of ``cluster`` in this ledger (a round gets its
    MLflow run as it starts): the evidence ``waiting_for_mlflow`` weighs a silent MLflow by
    (``mlflow_store.logged_before``, which also names the run a store must hold)."""
    return logged_before(ledger, cluster) is not None


def _waited(
    run: Callable[[], T],
    away: type[LedgerError | MlflowSinkError],
    said: Callable[[str, float], str],
    note: Callable[[str], None],
    sleep: Callable[[float], None],
    waits: Sequence[float],
) -> T:
    """``run()``, again after each of ``waits`` while it raises ``away`` that did not answer
    (``unreachable``), each wait ``said`` in one line; the last try's error raised."""
    for wait in waits:
        try:
            return run()
        except away as e:
            if not e.unreachable:
                raise
            note(said(e.message, wait))
            sleep(wait)
    return run()
