"""What ``orchestrate status`` reads of the ledger, in one session (``Seen``): the champion and
what the profile changed of it, the rounds and the unfinished one, the lease, the nodes'
clocks and failures, the priors' evidence; ``payload`` makes it JSON, ``text`` says it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.llm_fallback import Fallbacks
    from ledger import (
        BootRecord,
        ChampionRecord,
        EventRecord,
        ExperimentRecord,
        LeaseRecord,
        Ledger,
        ProposalRecord,
        RoundRecord,
    )
    from orchestrator.champion_level import CellsChanged, LevelInForce
    from orchestrator.priors import Measured
    from orchestrator.profile import Profile
    from orchestrator.round_boots import RoundTally
    from orchestrator.step_cost import StepCost


@dataclass
class Seen:
    """What ``status`` read of the ledger, in one session."""

    name: str
    #: the profile's name (what a line tells a person to fix)
    profile: str
    champion: ChampionRecord | None
    #: no champion: the last baseline, where the champion as configured did not boot
    #: (``baseline.crashed_baseline``)
    unbootable: ExperimentRecord | None
    #: the line saying the profile's champion: differs from the ledger's and is not used
    #: (``profile_champion.ignored``), or None
    ignored: str | None
    #: what fitting the champion to the profile changed that nothing recorded yet
    changes: list[str]
    #: the champion's values the profile's domain no longer has
    outside: dict[str, str]
    #: the cells redefined since their last reading
    redefined: dict[str, str]
    #: why the champion is measured again: its launchers render differently now (or None)
    restated: str | None
    #: the champion's level in force where it is not what its row records (measured again)
    level: LevelInForce | None
    #: the cells the profile removed or added since the champion was measured
    cells: CellsChanged | None
    running: RoundRecord | None
    lease: LeaseRecord | None
    #: a live holder (a round running now): a resume or `cluster down` would be refused
    live: bool
    #: the lease's state, read once (``lease.state``: held, suspended, gone, expired)
    lease_state: str | None
    #: boots no teardown closed
    left_open: list[BootRecord]
    rounds: list[RoundRecord]
    experiments: list[ExperimentRecord]
    effects: list[Measured]
    set_aside: dict[int, dict[str, Any]]
    draft: str | None
    step: StepCost | None
    used: dict[int, float]
    held: list[int]
    #: rounds done whose close MLflow lacks (``round_close``)
    unclosed: list[int]
    pending: list[ProposalRecord]
    #: proposals of the unfinished round a person approved that no experiment took up yet
    #: (approved while the round was stopped: the resume boots them first)
    approved: list[ProposalRecord]
    stopped: EventRecord | None
    not_started: EventRecord | None  # a round command stopped before any round (a node away)
    counted: int
    off: dict[int, int]
    failed: dict[int | None, Counter[str]]
    undecided: list[dict[str, Any]]
    fallbacks: Fallbacks  # the last round's LLM proposals and its fallbacks (``llm_fallback``)
    #: the last round's boots paid, measurements weighed and boots a busy host disturbed, as
    #: its report counts them (``round_boots``); ``None``: no round yet
    tally: RoundTally | None

    def proposal_of(self, experiment: int) -> int | None:
        """The proposal experiment ``experiment`` came from (``None``: a baseline's, or none)."""
        return next((e.proposal_id for e in self.experiments if e.id == experiment), None)


def read(prof: Profile, ledger: Ledger) -> Seen:
    """Everything ``status`` says, read from ``ledger``."""
    from agents.draft_model import draft_knob
    from agents.llm_fallback import Fallbacks
    from knobs.vocabulary import ProposalStatus, State
    from orchestrator import knob_renames, round_close
    from orchestrator.away import before_a_round
    from orchestrator.baseline import crashed_baseline
    from orchestrator.cell_renames import resolved
    from orchestrator.champion import ChampionEvidence
    from orchestrator.champion_level import level_in_force, shown
    from orchestrator.evolution import knob_changes, outside_domain
    from orchestrator.faults import failed_by_node
    from orchestrator.gpu_hours import gpu_hours
    from orchestrator.lease import state as lease_state
    from orchestrator.measurements import changed_cells, clocks_off_counts
    from orchestrator.priors import measured
    from orchestrator.profile_champion import ignored, stale_said
    from orchestrator.round_boots import RoundBoots
    from orchestrator.step_cost import learned
    from orchestrator.stops import last_stop
    from orchestrator.undecided import under_way

    prof, _ = resolved(prof, ledger)  # a cell renamed: its readings its own (``cell_renames``)
    name = prof.cluster.name
    # the profile gained or lost a knob since: the champion as this profile sees it, and
    # what fitting it changed that no round or ``cluster up`` has recorded yet; its objective
    # over the profile's cells of now, and the cells it removed or added since
    knob_renames.check(prof, ledger)  # a knob renamed unsaid: refused, as a round is
    changes = knob_changes(prof.space, ledger, name, record=False)
    evidence = ChampionEvidence(prof, ledger)
    champion, cells = shown(evidence)
    running = ledger.unfinished_round(name)
    lease = ledger.lease(name)
    state = None if lease is None else lease_state(lease)
    rounds = ledger.rounds(name)
    experiments = knob_renames.experiments(prof.space, ledger, cluster=name)
    mine = {r.id for r in rounds}
    counted, off = clocks_off_counts(ledger, name, prof.cells, prof.gates.min_matmul_rate)
    return Seen(
        name=name,
        profile=prof.name,
        champion=champion,
        unbootable=crashed_baseline(ledger, name),
        # champion: edited once the ledger has a champion: not used (said while it holds)
        ignored=ignored(prof, ledger, evidence.fitted()),
        changes=changes,
        # a value the profile's domain no longer has: the champion keeps it, and it is said
        outside={} if champion is None else outside_domain(prof.space, champion.config),
        # a cell redefined since it was measured: the next round measures it again
        redefined=changed_cells(ledger, name, prof.cells),
        # a knob's flag dropped or gained since it was measured: the next round measures it
        restated=evidence.restated(evidence.revised()),
        level=level_in_force(evidence),
        cells=cells,
        running=running,
        lease=lease,
        live=state == "held",
        lease_state=state,
        # a run killed (kill -9, a power cut) left them, and their engines may still hold the
        # nodes' GPUs, unless a round holds the cluster right now
        left_open=ledger.open_boots(name),
        rounds=rounds,
        experiments=experiments,
        # each knob's measured changes, for its prior
        effects=measured(ledger, experiments, prof.cells),
        set_aside=evidence.set_aside(),  # its keep's boots, if they left
        draft=None if (spec := draft_knob(prof.space)) is None else spec.name,
        # the step cost a K change's verdict subtracts from its counters (``step_cost``)
        step=learned(ledger, prof.space, experiments),
        used={r.id: gpu_hours(ledger, r, prof) for r in rounds},
        held=ledger.holding(name),  # experiments whose boots' texts MLflow still lacks
        unclosed=round_close.owed(ledger, name),  # rounds whose close MLflow still lacks
        # proposals of this cluster's rounds a person has not decided (``--approve queue``)
        pending=[p for p in ledger.proposals(status=ProposalStatus.PENDING) if p.round_id in mine],
        approved=[]
        if running is None
        else [
            p
            for p in ledger.proposals(round_id=running.id, status=ProposalStatus.APPROVED)
            if p.id not in {e.proposal_id for e in experiments}
        ],
        stopped=None if running is None else last_stop(ledger, name, running.id),
        not_started=before_a_round(ledger, name) if running is None else None,
        # each node's clocks over the cluster's measurements (``policy.flaky_nodes``)
        counted=counted,
        off=off,
        failed=failed_by_node(ledger, name),
        # what the unfinished round has under way: the change a resume takes up first
        # (a baseline of a champion: edited since: what the resume closes it for)
        undecided=[
            {**under_way(e, ledger.boots(e.id)), "closed_on_resume": stale_said(prof, ledger, e)}
            for e in experiments
            if running is not None and e.round_id == running.id and e.state != State.DECIDED
        ],
        fallbacks=Fallbacks.of(
            ((p.source, p.notes) for p in ledger.proposals(round_id=rounds[-1].id)),
            round_id=rounds[-1].id,
        )
        if rounds
        else Fallbacks(),
        tally=RoundBoots.read(ledger, rounds[-1], prof.gates.min_matmul_rate).tally()
        if rounds
        else None,
    )
