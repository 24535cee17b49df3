"""Re-measuring the champion: when (``policy.remeasure_due``), the drift sentinel, and the boots
that kept a change set aside.

The champion's level is measured on several boots (topped up after each keep) and again every
so often (the drift sentinel); a re-measurement that flags a drift is followed by one more
boot, and only a drift that boot confirms re-bases the level on the boots from the flag on (an
unconfirmed flag's boots stay in the level). A kept change is booted once as champion at once
after its keep: when that boot of its own reads too far below the boots that kept it
(``policy.keep_boots_inflated``: they were chosen for reading high), they leave its level (an
event in the ledger) and it is measured afresh. What counts as a drift or an inflated keep is
``policy``'s to say; this module boots, records, and reads the level from ``champion``. A boot
whose windows a busy host disturbed (``host_stalls.reusable``) measured the host: it stays in
the level (each verdict weighs it with its stall error) but tests nothing here, neither
flagging nor confirming a drift, nor setting a keep's boots aside, nor as their history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from cluster.errors import NodeError
from knobs.vocabulary import BootRole, BootStatus, EventKind, Kind, Status
from ledger import ExperimentRecord, RoundRecord
from orchestrator import policy
from orchestrator.boot import Booter
from orchestrator.champion import ChampionEvidence
from orchestrator.crashpoints import crashpoint
from orchestrator.display import RoundDisplay
from orchestrator.host_stalls import reusable
from orchestrator.measurements import Measurement
from orchestrator.runlog import RunLog
from orchestrator.verdict import objective, objective_of, slow_ranks


@dataclass(frozen=True)
class _State:
    """The champion as ``policy`` sees it when deciding whether to boot it again."""

    last: datetime  # its last boot's end
    trusted: int  # trusted boots in its level
    own: int | None  # trusted boots of its own as champion (None: a round's baseline)
    afresh: bool  # its keep's boots were set aside


class ChampionRemeasure:
    """Boots the champion again when it is due, and records what its boots say."""

    def __init__(
        self, evidence: ChampionEvidence, booter: Booter, runlog: RunLog, display: RoundDisplay
    ) -> None:
        self.evidence = evidence
        self.profile = evidence.profile
        self.ledger = evidence.ledger
        self.cluster = evidence.cluster
        self.booter = booter
        self.runlog = runlog
        self.display = display

    def due(self) -> bool:
        """Whether the champion is re-measured before the next proposal (``policy``'s rule)."""
        state = self._state()
        if state is None:
            return False
        decided_since = sum(
            1
            for e in self.ledger.experiments(cluster=self.cluster)
            if e.kind == Kind.CANDIDATE
            and e.status not in (None, Status.VETOED)
            and e.decided_at is not None
            and e.decided_at > state.last
        )
        return policy.remeasure_due(
            self.profile.verdict,
            trusted_boots=state.trusted,
            decided_since=decided_since,
            age_s=(datetime.now(UTC) - state.last).total_seconds(),
            own_boots=state.own,
            afresh=state.afresh,
            baseline=state.own is None,
        )

    def keep_untested(self) -> bool:
        """Whether the champion's keep is still to be tested by boots of its own
        (``policy.keep_test_due``): what a round does before it closes."""
        state = self._state()
        return state is not None and policy.keep_test_due(
            self.profile.verdict,
            trusted_boots=state.trusted,
            own_boots=state.own,
            afresh=state.afresh,
        )

    def _state(self) -> _State | None:
        """What ``policy`` decides a re-measurement on; ``None`` when there is no champion or
        it was never booted."""
        champion = self.ledger.champion(self.cluster)
        if champion is None:
            return None
        boots = [
            b for b in self.ledger.boots(champion.experiment_id) if b.status == BootStatus.DOWN
        ]
        if not boots:
            return None
        last = boots[-1].ended_at or boots[-1].started_at
        trusted = [m for m in self.evidence.level() if self.evidence.trusted(m)]
        kept = self.ledger.experiment(champion.experiment_id).kind == Kind.CANDIDATE
        return _State(
            last=last,
            trusted=len(trusted),
            own=len(self._own(trusted)) if kept else None,
            afresh=champion.experiment_id in self.evidence.set_aside(),
        )

    def remeasure(self, rnd: RoundRecord) -> NodeError | None:
        """A fresh boot of the champion; records its drift. A boot that flags a drift
        (``policy.suspected_drift``) is followed by one more, a confirmation (role ``confirm``),
        and the level is re-based only when it confirms the drift (``policy.drift_confirmed``);
        otherwise both boots are the champion's measurements like any other. A boot with a
        node's clocks off is measured again (``policy.CHAMPION_CLOCK_TRIES`` in all); it never
        counts as drift. The failure, if a boot failed."""
        e = self.ledger.experiment(self.evidence.current().experiment_id)
        self.display.phase("re-measuring the champion")
        run_id = self.runlog.experiment_run(rnd, e)
        failure, latest = self._boot(e, run_id, BootRole.REMEASURE)
        if latest is None:
            return failure
        if self._set_aside_keep_boots(e, run_id, latest):
            return self._measure_afresh(e, run_id)
        flag = self._record_remeasure(e.id, run_id, latest)
        if flag is None:
            return None
        if not self.profile.verdict.confirm_drift:  # the loop before #18: re-based on the flag
            self._add_drift(e.id, latest, flag.before, significant=True)
            return None
        self.display.note(
            f"  the champion measured {100 * (flag.after / flag.before - 1):+.1f}% vs its level "
            f"({flag.sigmas:+.1f} standard errors): a suspected drift, booting it once more "
            "to confirm"
        )
        failure, confirmation = self._boot(e, run_id, BootRole.CONFIRM)
        if confirmation is None:
            return failure
        self._record_confirmation(e.id, run_id, flag, confirmation)
        return None

    def _boot(
        self, e: ExperimentRecord, run_id: str | None, role: BootRole
    ) -> tuple[NodeError | None, Measurement | None]:
        """One measurement of the champion with every node's clocks right (taken again when
        they were off, ``policy.CHAMPION_CLOCK_TRIES`` in all): the failure if a boot failed,
        and the measurement (``None`` if it failed or the clocks were off every time)."""
        for attempt in range(1, policy.CHAMPION_CLOCK_TRIES + 1):
            failure = self.booter.measure(e, run_id, role=role, measurement=None)
            if failure is not None:
                self.display.note(f"  the champion's re-measurement failed: {failure.message}")
                return failure, None
            latest = [m for m in self.evidence.measurements(e.id) if m.complete][-1]
            if self.evidence.trusted(latest):
                return None, latest
            slow = ", ".join(map(str, slow_ranks(latest.cells, self.profile.gates.min_matmul_rate)))
            again = attempt < policy.CHAMPION_CLOCK_TRIES
            self.display.note(
                f"  the champion's re-measurement ran with clocks off on node(s) {slow}: "
                "it is neither drift nor the champion's level"
                + ("; measuring again" if again else "")
            )
        return None, None

    def settle(self) -> None:
        """Re-base the champion's level once more if a kill fell between a re-measurement's
        drift and its re-base (a resume): once re-measured, the champion's objective is its
        trusted level's."""
        champion = self.ledger.champion(self.cluster)
        if champion is None or not (
            any(d.experiment_id == champion.experiment_id for d in self.ledger.drifts(self.cluster))
            or champion.experiment_id in self.evidence.cuts()
        ):
            return
        measured = self.evidence.level()
        if not measured:  # its cells were redefined since: its next boot gives it a level
            return
        level = objective_of([objective(m.cells) for m in measured])
        if not math.isclose(level, champion.objective, rel_tol=1e-9):
            self.ledger.set_champion_objective(self.cluster, level)

    def _trusted_level(self) -> tuple[list[Measurement], int | None]:
        """The champion's trusted measurements since its last re-base, oldest first, and the
        position among them of its last flagged boot not confirmed (the re-measurement just
        before a drift confirmation boot: a ``confirm`` boot after a ``remeasure`` one). Not a
        boot a busy host disturbed: the drift sentinel reads the cluster, not the host."""
        ms = [m for m in self.evidence.level() if self.evidence.trusted(m) and not _busy(m)]
        flagged: int | None = None
        remeasured = False
        for i, m in enumerate(ms):
            if m.role == BootRole.CONFIRM and remeasured and i > 0:
                flagged = i - 1
            remeasured = remeasured or m.role == BootRole.REMEASURE
        return ms, flagged

    @staticmethod
    def _own(ms: list[Measurement]) -> list[Measurement]:
        """Of a kept change's measurements, oldest first, those it had as champion: from its
        first re-measurement on (the ones before are the boots that kept it)."""
        first = next((i for i, m in enumerate(ms) if m.role == BootRole.REMEASURE), len(ms))
        return ms[first:]

    def _set_aside_keep_boots(
        self, e: ExperimentRecord, run_id: str | None, latest: Measurement
    ) -> bool:
        """If ``latest`` is a kept change's first trusted boot of its own as champion and reads
        too far below the boots that kept it (``policy.keep_boots_inflated``), set those boots
        aside: an event in the ledger, the level from ``latest`` on (it is then measured again
        until it has ``champion_boots`` boots of its own). Whether it did; this boot is no drift
        test either way when it did."""
        if e.kind != Kind.CANDIDATE or _busy(latest):
            return False
        ms = [m for m in self.evidence.level() if self.evidence.trusted(m)]
        own = self._own(ms)
        keep = [m for m in ms[: len(ms) - len(own)] if not _busy(m)]
        if len(own) != 1 or own[0].index != latest.index or not keep:
            return False
        boot_cv = self.evidence.noise(e.id).boot_cv
        test = policy.keep_boots_inflated(
            self.profile.verdict,
            [objective(m.cells) for m in keep],
            objective(latest.cells),
            boot_cv,
        )
        if test is None:
            return False
        self.ledger.add_event(
            self.cluster,
            EventKind.KEEP_BOOTS_SET_ASIDE,
            subject=str(e.id),
            detail={
                "measurement": latest.index,
                "keep_boots": len(keep),
                "before": test.before,
                "after": test.after,
                "sigmas": test.sigmas,
            },
            reason="the champion's first boot of its own read below the boots that kept it",
        )
        self._add_drift(e.id, latest, test.before, significant=False)
        self.runlog.remeasured(run_id, objective(latest.cells), latest.index)
        self.runlog.keep_boots_set_aside(run_id, latest.index)
        self.display.note(
            f"  the champion's first boot of its own measured "
            f"{100 * (test.after / test.before - 1):+.1f}% vs the {len(keep)} boot(s) that kept "
            f"it ({test.sigmas:+.1f} standard errors): those were chosen for reading high; they "
            "leave its level, which starts again from this boot; measuring it afresh"
        )
        return True

    def _measure_afresh(self, e: ExperimentRecord, run_id: str | None) -> NodeError | None:
        """Boot a champion whose keep's boots were just set aside until its level has
        ``champion_boots`` trusted boots, at once: every verdict until then would share a level
        of one boot. No drift test (the level is new); each boot is recorded like any
        re-measurement. The failure, if a boot failed (a resume tops up the rest: ``due``)."""
        for _ in range(self.profile.verdict.champion_boots - 1):
            failure, m = self._boot(e, run_id, BootRole.REMEASURE)
            if m is None:
                return failure
            before = objective_of([objective(x.cells) for x in self.evidence.level()[:-1]])
            self._add_drift(e.id, m, before, significant=False)
            self.runlog.remeasured(run_id, objective(m.cells), m.index)
        return None

    def _record_remeasure(
        self, experiment_id: int, run_id: str | None, latest: Measurement
    ) -> policy.Shift | None:
        """Record a re-measurement (never a re-base on its own); the suspected drift it flags
        (none where a busy host disturbed it)."""
        ms, flagged = self._trusted_level()
        level = [objective(m.cells) for m in ms]
        busy = _busy(latest)
        earlier = level if busy else level[:-1]
        before = objective_of(earlier) if earlier else objective(latest.cells)
        self._add_drift(experiment_id, latest, before, significant=False)
        self.runlog.remeasured(run_id, objective(latest.cells), latest.index)
        if busy:
            self.display.note(_BUSY_WORDS.format(what="re-measurement"))
            return None
        return policy.suspected_drift(level, self.evidence.noise(experiment_id).boot_cv, flagged)

    def _record_confirmation(
        self, experiment_id: int, run_id: str | None, flag: policy.Shift, confirmation: Measurement
    ) -> None:
        """Record the confirmation boot of a suspected drift; re-base the level on the boots
        from the flag on if it confirms the drift (a significant drift recorded at the first
        of them: ``level`` starts there)."""
        ms, _ = self._trusted_level()
        level = [objective(m.cells) for m in ms]
        busy = _busy(confirmation)
        boot_cv = self.evidence.noise(experiment_id).boot_cv
        rebase = None if busy else policy.drift_confirmed(level, flag, boot_cv)
        self._add_drift(experiment_id, confirmation, flag.before, significant=False)
        self.runlog.remeasured(run_id, objective(confirmation.cells), confirmation.index)
        if busy:
            self.display.note(_BUSY_WORDS.format(what="confirmation"))
        if rebase is None:
            self.display.note(
                "  not confirmed: the champion's level keeps its history, these boots included"
            )
            return
        self._add_drift(experiment_id, ms[rebase.start], rebase.before, significant=True)
        moved = 100 * (rebase.after / rebase.before - 1)
        self.display.note(
            f"  drift confirmed: the champion measures {moved:+.1f}% vs before over "
            f"{len(level) - rebase.start} boots; comparisons re-baselined on them"
        )

    def _add_drift(
        self, experiment_id: int, m: Measurement, before: float, *, significant: bool
    ) -> None:
        """A drift row for measurement ``m`` against the level ``before``; the champion's
        objective set to its level (re-based when ``significant``)."""
        self.ledger.add_drift(
            cluster=self.cluster,
            experiment_id=experiment_id,
            measurement=m.index,
            before=before,
            after=objective(m.cells),
            significant=significant,
        )
        crashpoint("drift.recorded")
        trusted = [objective(m.cells) for m in self.evidence.level()]
        self.ledger.set_champion_objective(self.cluster, objective_of(trusted))
        crashpoint("champion.rebased")


#: What a round says of a champion's boot a busy host disturbed.
_BUSY_WORDS = (
    "  a busy host disturbed the champion's {what} (its stalls may have moved its objective): "
    "it tests no drift"
)


def _busy(m: Measurement) -> bool:
    """Whether a busy host disturbed measurement ``m``'s windows (``host_stalls.reusable``)."""
    return reusable(m.cells) is None
