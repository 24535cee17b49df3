"""Known-bad regions as a person sees them: every region the cluster's verdicts bar, and the
way out of one (``orchestrate known-bad list | clear``).

A region is named by the experiment that barred it (a crash, wrong greedy outputs, a veto).
Clearing it records an event in the ledger (who, when, why): the experiment and its verdict
stay as they were, results.tsv does not change, but the region bars nothing from then on and
its config may be proposed again (``history.proposal_context`` skips it).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents import KnownBad
from knobs.spec import as_text
from knobs.vocabulary import EventKind
from ledger import EventRecord, ExperimentRecord, Ledger
from orchestrator import knob_renames
from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.evolution import Lineage
from orchestrator.history import cleared_regions, holds, region_of
from orchestrator.profile import Profile
from orchestrator.timestamps import utc_minute


class NothingBarred(OrchestrateError):
    """The experiment named bars no region now (none of its own, or a person cleared it)."""

    exit_code = 3

    def __init__(self, message: str, *, experiment: int) -> None:
        super().__init__(message)
        self.experiment = experiment


@dataclass(frozen=True)
class BarredRegion:
    """A region a decided experiment bars, and whether a person cleared it since."""

    experiment: ExperimentRecord
    region: KnownBad
    #: the experiment of the champion it was decided against (``None``: not in the history)
    champion: int | None
    cleared: EventRecord | None = None
    #: how the experiment ran otherwise than the region, fitted to the profile of now, says
    #: (a knob it ran that the profile dropped since, one it gained), in words; empty: the same
    as_it_ran: str = ""


def _as_it_ran(profile: Profile, e: ExperimentRecord, lineage: Lineage) -> str:
    """How ``e`` ran otherwise than its config fitted to the profile of now (``Lineage.fit``):
    the knobs the profile dropped since, with the values it ran, and those it gained, which
    it did not run; empty where fitting changed nothing."""
    fitted = lineage.fit(e)
    ran = profile.space.renamed(e.config)
    said = [f"{k}={as_text(ran[k])}" for k in fitted.removed if k in ran]
    said += [f"no {k}" for k in fitted.added]
    return "" if not said else "fitted to the profile of now; it ran " + ", ".join(said)


def barred_regions(profile: Profile, ledger: Ledger) -> list[BarredRegion]:
    """Every region the profile's cluster bars, oldest first, cleared ones included (not a
    guardrail's measured against an earlier champion: a keep lifted it)."""
    cluster = profile.cluster.name
    cleared = cleared_regions(ledger, cluster)
    experiments = knob_renames.experiments(profile.space, ledger, cluster=cluster)
    by_id = {e.id: e for e in experiments}
    # fitted to the profile, each change from the champion it was proposed against
    lineage = Lineage.read(profile.space, ledger, cluster, experiments)
    current = ledger.champion(cluster)
    now = "" if current is None else lineage.fit(by_id[current.experiment_id]).config.key
    out: list[BarredRegion] = []
    for e in experiments:
        region = region_of(profile, ledger, e, lineage)
        # a guardrail's region measured against an earlier champion bars nothing now
        if region is not None and holds(region, lineage.champion_key(e), now):
            parent = lineage.parent(e)
            champion = None if parent is None else parent.id
            out.append(
                BarredRegion(
                    e, region, champion, cleared.get(e.id), _as_it_ran(profile, e, lineage)
                )
            )
    return out


def clear_region(
    profile: Profile, ledger: Ledger, experiment_id: int, *, reason: str, actor: str
) -> tuple[BarredRegion, EventRecord]:
    """Clear the region experiment ``experiment_id`` bars: an event in the ledger, and no
    proposer is kept from it from then on. The region and the event that cleared it.

    Raises:
        UsageError: ``reason`` is empty.
        NothingBarred: the experiment bars nothing on this cluster (or was cleared before).
    """
    why = " ".join(reason.split())
    if not why:
        raise UsageError("--reason must say why the region is cleared (it is recorded)")
    found = next(
        (r for r in barred_regions(profile, ledger) if r.experiment.id == experiment_id), None
    )
    cluster = profile.cluster.name
    if found is None:
        raise NothingBarred(
            f"experiment #{experiment_id} bars nothing on cluster {cluster}; "
            "`orchestrate known-bad list` shows what is barred",
            experiment=experiment_id,
        )
    if found.cleared is not None:
        raise NothingBarred(
            f"experiment #{experiment_id}'s region {found.region.region()} was cleared already, "
            f"by {found.cleared.actor or 'someone'} on {utc_minute(found.cleared.created_at)}",
            experiment=experiment_id,
        )
    event = ledger.add_event(
        cluster,
        EventKind.KNOWN_BAD_CLEARED,
        subject=str(experiment_id),
        detail={"region": found.region.region(), "source": found.region.source},
        reason=why,
        actor=actor,
    )
    return found, event
