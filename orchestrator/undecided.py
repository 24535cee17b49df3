"""An experiment a stopped round left undecided, set aside by a person
(``orchestrate experiments veto``).

A round that stops on an experiment (a node away, weights that one value needs and no node can
fetch) leaves it undecided, and the same command resumes it: the round goes on only through
it. When a person judges that the change itself cannot be run on this stack for now, they veto
it as they would veto its proposal: decided ``vetoed`` with their words, its boots kept as they
were, and a known-bad region that every proposer sees (``orchestrate known-bad clear`` lifts
it). The resume then goes on with the next change. Never while a round holds the cluster: the
veto takes the cluster's lease for its one transaction.
"""

from __future__ import annotations

from typing import Any

from knobs.vocabulary import Kind, State, Status
from ledger import BootRecord, ExperimentRecord, Ledger, VerdictRecord
from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.experiment_view import named_experiment
from orchestrator.lease import ClusterLease
from orchestrator.measurements import BootCount
from orchestrator.profile import Profile


class NotUndecided(OrchestrateError):
    """The experiment named is not one a person can veto now: decided already, or the
    baseline (it measures the profile's own champion). One the cluster does not have is
    ``experiment_view.NoSuchExperiment``."""

    exit_code = 3

    def __init__(self, message: str, *, experiment: int) -> None:
        super().__init__(message)
        self.experiment = experiment


def veto_undecided(
    profile: Profile, ledger: Ledger, experiment_id: int, *, reason: str, actor: str
) -> ExperimentRecord:
    """Decide undecided experiment ``experiment_id`` as vetoed by ``actor`` for ``reason``:
    the verdict's reason is the person's words (what every proposer is shown), its statistics
    the boots it had and how they failed, and results.tsv's description says who vetoed it and
    why. The decided experiment.

    Raises:
        UsageError: ``reason`` is empty.
        NoSuchExperiment: the profile's cluster has no such experiment.
        NotUndecided: the experiment is not an undecided change.
        LeaseHeld: a round holds the cluster (it may be booting this very experiment).
    """
    why = " ".join(reason.split())
    if not why:
        raise UsageError("--reason must say why the experiment is vetoed (every proposer sees it)")
    cluster = profile.cluster.name
    with ClusterLease(ledger, cluster):
        e = _undecided(ledger, cluster, experiment_id)
        return close_undecided(
            ledger,
            e,
            rule="veto",
            reason=why,
            by=actor,
            description=f"{e.description}; vetoed by {actor} while undecided: {why}",
        )


def close_undecided(
    ledger: Ledger,
    e: ExperimentRecord,
    *,
    rule: str,
    reason: str,
    by: str,
    description: str,
    stats: dict[str, object] | None = None,
) -> ExperimentRecord:
    """Decide undecided change ``e`` ``vetoed`` without a boot more: the verdict's ``rule`` and
    ``reason``, its statistics who closed it (``by``), the boots it had and how they failed
    (and ``stats``), its boots kept as they were; results.tsv's ``description``. The decided
    experiment (a person's veto, ``veto_undecided``; a change the profile can no longer run,
    ``closures.close``).

    Raises:
        LedgerError: the ledger failed, or ``e`` is decided already.
    """
    boots = BootCount.of(e, ledger.boots(e.id))
    verdict = VerdictRecord(
        status=Status.VETOED,
        rule=rule,
        reason=reason,
        stats={
            "by": by,
            **(stats or {}),
            "undecided": True,
            "boots": boots.boots,
            "failed": dict(boots.failed),
        },
    )
    return ledger.decide(
        e.id,
        verdict=verdict,
        objective=None,
        delta_pct=None,
        accept_len=None,
        description=description,
    )


def _undecided(ledger: Ledger, cluster: str, experiment_id: int) -> ExperimentRecord:
    """Experiment ``experiment_id`` of ``cluster``, a change not decided yet.

    Raises:
        NoSuchExperiment: it is none.
        NotUndecided: it is the baseline, or decided.
    """
    e = named_experiment(
        ledger,
        cluster,
        experiment_id,
        hint="`orchestrate status` names the one a stopped round left undecided",
    )
    if e.kind != Kind.CANDIDATE:
        raise NotUndecided(
            f"experiment #{e.id} is the baseline: it measures the profile's own champion, "
            "which nothing can set aside; resume the round once its nodes boot, or give the "
            "profile another starting config",
            experiment=e.id,
        )
    if e.state == State.DECIDED:
        raise NotUndecided(
            f"experiment #{e.id} ({e.description}) is decided already ({e.status}): only one "
            "a stopped round left undecided can be vetoed; `orchestrate known-bad` lists and "
            "clears what a decision bars",
            experiment=e.id,
        )
    return e


def under_way(e: ExperimentRecord, boots: list[BootRecord]) -> dict[str, Any]:
    """An experiment the unfinished round has not decided: what it changes, its boots, how
    those that failed failed (a stop's, or a kill's; ``orchestrate experiments veto`` takes it),
    and the measurements they made."""
    count = BootCount.of(e, boots)
    return {
        "experiment": e.id,
        "proposal": e.proposal_id,
        "change": e.description,
        "state": str(e.state),
        "boots": count.boots,
        "failed": dict(count.failed),
        # its boots' measurements so far (``BootCount``: a failed boot made none)
        "measurements": count.measurements,
    }
