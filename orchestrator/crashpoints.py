"""Crash points: a fault-injection hook for the kill -9 suite (``tests/test_kill_points.py``).

The round persists its state step by step; a kill between two steps must leave a ledger, an
MLflow store and a results.tsv that a resume brings back into agreement. Waiting for the right
instant and sending SIGKILL from outside hits most boundaries only by luck, so each boundary
calls ``crashpoint(name)``, and the process SIGKILLs itself there when
``ORCHESTRATE_CRASHPOINT`` names that point, as SQLite's and FoundationDB's crash tests do.

``ORCHESTRATE_CRASHPOINT=name`` kills at the first time the point is reached, ``name@N`` at
the N-th (``cell.recorded@2``: after the second cell). Unset, a crash point is one dictionary
lookup; a value that names no point in ``CRASHPOINTS`` is refused at the first crash point
rather than never firing. Before it dies the process writes one line to stderr
(``crashpoint NAME@N: SIGKILL``), which is how a test knows the kill came from the point.

``ORCHESTRATE_CRASHPOINT_SIGNAL=SIGSTOP`` suspends the process there instead (its line says
``SIGSTOP``), as Ctrl-Z or a laptop put to sleep would, and it goes on where it stopped once
sent SIGCONT: how the suspend suite (``tests/test_suspended_round.py``) finds the instants a
process must not be woken at unfenced.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Final

from orchestrator.errors import UsageError

ENV: Final = "ORCHESTRATE_CRASHPOINT"
#: the signal a crash point sends its process: SIGKILL (the default) or SIGSTOP
SIGNAL_ENV: Final = "ORCHESTRATE_CRASHPOINT_SIGNAL"
_SIGNALS: Final = {"SIGKILL": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP}

#: Every state boundary a round persists, in the order a round that re-measures its champion
#: and keeps a candidate reaches them.
CRASHPOINTS: Final = (
    "mlflow.round.created",  # the round's parent run exists, its id not yet in the ledger
    "round.started",  # the round and its parent MLflow run, committed
    "drift.recorded",  # the champion's re-measurement judged: drift row committed
    "champion.rebased",  # … and the champion's level re-based on it
    "proposal.recorded",  # pending in the ledger
    "proposal.approved",  # the veto gate's decision committed
    "experiment.recorded",  # the experiment row
    "mlflow.run.created",  # its MLflow run exists, its id not yet in the ledger
    "boot.started",  # the boot row (booting)
    "node.started",  # a node's engine started (@1 the first worker … the head last)
    "health.passed",  # the head answered /health
    "smoke.passed",  # the smoke generation passed: the boot is up in the ledger
    "cell.recorded",  # a cell's result committed (@N: the N-th)
    "measured",  # torn down: boot down, experiment measured
    "verdict.committed",  # the verdict (and a keep's promotion) in one transaction
    "champion.promoted",  # … a keep: the candidate is the champion
    "mlflow.verdict",  # the verdict's metrics, artifacts and tags written, run ended
    "round.finished",  # the parent run ended, the round not yet closed in the ledger
    "report.written",  # the round's local report, not yet its MLflow run's numbers and texts
)

_counts: dict[str, int] = {}


def crashpoint(name: str) -> None:
    """SIGKILL this process here when ``$ORCHESTRATE_CRASHPOINT`` names this point (and this
    is the N-th time it is reached, for ``name@N``); otherwise nothing. With
    ``$ORCHESTRATE_CRASHPOINT_SIGNAL=SIGSTOP`` the process is suspended there instead, and
    returns from here once continued.

    Raises:
        ValueError: ``name`` is not in ``CRASHPOINTS`` (a bug).
        UsageError: ``$ORCHESTRATE_CRASHPOINT`` names no crash point, or a bad count, or
            ``$ORCHESTRATE_CRASHPOINT_SIGNAL`` another signal.
    """
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    if name not in CRASHPOINTS:
        raise ValueError(f"{name!r} is not a crash point")
    point, _, nth = wanted.partition("@")
    if point not in CRASHPOINTS or (nth and not nth.isdigit()) or nth == "0":
        raise UsageError(f"{ENV}={wanted!r}: expected one of {', '.join(CRASHPOINTS)}[@N]")
    how = os.environ.get(SIGNAL_ENV) or "SIGKILL"
    if how not in _SIGNALS:
        raise UsageError(f"{SIGNAL_ENV}={how!r}: expected one of {', '.join(_SIGNALS)}")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == int(nth or 1):
        sys.stderr.write(f"crashpoint {name}@{_counts[name]}: {how}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), _SIGNALS[how])


def deploy_progress(show: Callable[[str], None]) -> Callable[[str], None]:
    """The Deployer's progress callback: ``show`` each line, and reach ``node.started`` and
    ``health.passed`` at the lines that follow those steps. (``cluster`` imports nothing of
    the orchestrator's, so its boundaries are read from the lines it reports: a node's next
    line, "starting …" or "waiting for /health", says that the node before it started.)"""
    starting = False

    def progress(line: str) -> None:
        nonlocal starting
        if line.startswith(("starting ", "waiting for /health")):
            if starting:
                crashpoint("node.started")
            starting = line.startswith("starting ")
        elif line == "smoke generation":
            crashpoint("health.passed")
        elif line == "uploading launchers":
            starting = False
        show(line)

    return progress
