"""What a round says and settles as it starts or is taken up again, before its first step.

A resume is recorded (``resumes``) and says why the round stopped, what it keeps of how it
started (``display.kept_on_resume``) and which caps are in force now; what a kill left open
in MLflow is filled in from the ledger and the champion's re-measurements left open settled.
Every round then says what the profile changed since the cluster last ran (``revision``),
since the champion was recorded (``evolution``, ``rendering``) and the cells renamed or
redefined since they were measured (``cell_renames``, ``measurements``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger import Ledger, RoundRecord
from orchestrator import resumes, revision
from orchestrator.champion import ChampionEvidence
from orchestrator.display import RoundDisplay, kept_on_resume
from orchestrator.evolution import outside_domain
from orchestrator.gpu_hours import gpu_hours
from orchestrator.measurements import changed_cells
from orchestrator.profile import Profile
from orchestrator.profile_champion import closed_lines, said_once
from orchestrator.remeasure import ChampionRemeasure
from orchestrator.runlog import RunLog
from orchestrator.stops import last_stop, said_stop

if TYPE_CHECKING:
    from orchestrator.round import RoundOptions


class RoundOpening:
    """The lines and the settling a round starts with (``RoundRunner.run``, before its loop)."""

    def __init__(
        self,
        profile: Profile,
        ledger: Ledger,
        champion: ChampionEvidence,
        runlog: RunLog,
        remeasures: ChampionRemeasure,
        display: RoundDisplay,
        renamed: list[str],
    ) -> None:
        self.profile = profile
        self.ledger = ledger
        self.champion = champion
        self.runlog = runlog
        self.remeasures = remeasures
        self.display = display
        self.cluster = profile.cluster.name
        #: the cells renamed since they were measured, one line each (``cell_renames``)
        self._renamed = renamed

    def open(
        self, rnd: RoundRecord, existing: RoundRecord | None, options: RoundOptions
    ) -> RoundRecord:
        """Say and settle what round ``rnd`` starts with (``existing``: the round as the ledger
        had it unfinished, for a resume); the round as it goes on (its caps in force)."""
        change = None
        if existing is not None:
            rnd, change = self._take_up(rnd, existing, options)
        if change is None:  # a new round, or one resumed under the profile it started under
            for line in self._changed_since_last_run():
                self.display.note(line)
        self._said_of_the_champion()
        return rnd

    def _take_up(
        self,
        rnd: RoundRecord,
        existing: RoundRecord,
        options: RoundOptions,
    ) -> tuple[RoundRecord, str | None]:
        """A round taken up again: recorded, with the boots the run before left open
        (``resumes``), said, and what it left open settled; the round with its caps in force,
        and what the profile changed since it started (``_profile_change``)."""
        resumes.record(
            self.ledger,
            self.cluster,
            rnd.id,
            proposer=options.proposer,
            approve=options.approve,
            seed=options.seed,
        )
        change = self._profile_change(existing)
        asked = {
            "budget": str(options.budget),
            "proposer": options.proposer,
            "approval": options.approve,
            "seed": str(options.seed),
        }
        stop = last_stop(self.ledger, self.cluster, rnd.id)
        if stop is not None:
            self.display.note(f"  it {said_stop(stop)}")
        for line in kept_on_resume(existing, asked, change):
            self.display.note(line)
        # a baseline left undecided of a champion: edited since: closed as it is taken up
        for line in closed_lines(self.profile, self.ledger, rnd.id):
            self.display.note(line)
        rnd = self._caps_on_resume(rnd, options)
        # what a kill left open in MLflow, from the ledger; an MLflow that answered the
        # command's start but not now (the same outage as the ledger's, which this resume
        # waited out) is filled in later, as one that went away mid-round
        self.runlog.mirror.write(lambda: self.runlog.reconcile(rnd))
        self.remeasures.settle()
        return rnd, change

    def _said_of_the_champion(self) -> None:
        """The profile gained or lost a knob since the champion was recorded (``evolution``),
        and the profile recorded (``revision``); what else changed under the champion."""
        revised = self.champion.revised()  # before the profile is recorded: what it changed
        # champion: edited while the ledger has a champion: not used, said once
        ignored = said_once(self.profile, self.ledger, self.champion.fitted())
        if ignored is not None:
            self.display.note(ignored)
        for line in self.champion.record_knob_changes():
            self.display.note(line)
        champion = self.champion.fitted()
        if champion is not None:  # a domain narrowed under it: kept, and said (``evolution``)
            for line in outside_domain(self.profile.space, champion.config).values():
                self.display.note(line)
        for line in self._renamed:
            self.display.note(line)
        # a cell redefined since it was measured is measured again (``measurements.counts``)
        for line in changed_cells(self.ledger, self.cluster, self.profile.cells).values():
            self.display.note(line)
        # a knob's flag dropped or gained: measured again under it (``rendering``)
        restated = self.champion.restated(revised)
        if restated is not None:
            self.display.note(restated)
        self.champion.realign()  # a knob put back as it was: its earlier level in force again

    def _profile_change(self, rnd: RoundRecord) -> str | None:
        """What the profile changed since ``rnd`` started (``revision.said``); ``None``:
        nothing (but what an upgrade alone changes)."""
        if rnd.profile_digest == self.profile.digest:
            return None
        then = revision.recorded(self.ledger, self.cluster, rnd.profile_digest)
        now = revision.Revision.of(self.profile)
        return revision.said(then, now, (rnd.profile_name, rnd.profile_digest))

    def _changed_since_last_run(self) -> list[str]:
        """A round under a profile other than the one the cluster last ran under (a round's, or
        ``cluster up``'s): what changed, in one line."""
        last = revision.last(self.ledger, self.cluster)
        if last is None or last.digest == self.profile.digest:
            return []
        now = revision.Revision.of(self.profile)
        said = revision.said(last, now, (last.name, last.digest))
        return (
            [] if said is None else [f"  the profile changed since {self.cluster} last ran {said}"]
        )

    def _caps_on_resume(self, rnd: RoundRecord, options: RoundOptions) -> RoundRecord:
        """A resume keeps the round's caps unless this command gives one, each said in one
        line: the wall-clock cap counts from this command's start, the GPU-hours cap over the
        whole round (every boot since it started)."""
        used = gpu_hours(self.ledger, rnd, self.profile)
        caps = (
            ("--max-hours", rnd.max_hours, options.max_hours, "counted from now"),
            ("--max-gpu-hours", rnd.max_gpu_hours, options.max_gpu_hours, f"{used:.2f} used"),
        )
        for flag, kept, asked, how in caps:
            if asked is None:
                if kept is not None:
                    self.display.note(f"  round {rnd.id} keeps its {flag} {kept:g}, {how}")
                continue
            if asked != kept:
                had = "none" if kept is None else f"{kept:g}"
                self.display.note(f"  round {rnd.id} takes {flag} {asked:g}, {how} (it had {had})")
                if flag == "--max-hours":
                    self.ledger.set_round_max_hours(rnd.id, asked)
                else:
                    self.ledger.set_round_max_gpu_hours(rnd.id, asked)
        return self.ledger.round(rnd.id)
