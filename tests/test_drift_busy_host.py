"""A busy host's boot of the champion is no drift test: a re-measurement (or the confirmation
of a flag) whose windows its hosts stalled (``host_stalls.disturbed``) neither flags a drift
nor confirms one, so the champion's level is never re-based on the host's load (the
forty-ninth session's review: two stalled boots at −30 % "confirmed a drift" and re-based the
level 30 % low). Such a boot stays in the level with the error its stalls carry."""

from __future__ import annotations

import io
from pathlib import Path

from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from ledger import Ledger
from orchestrator.round import RoundOptions
from tests.test_round_policy import ScriptedTestbed, profile, round_runner


class BusyTestbed(ScriptedTestbed):
    """The scripted testbed whose boots in ``busy`` come back with every window stalled three
    window lengths (a host the load held off the CPU)."""

    def __init__(self, speed: object, busy: set[int]) -> None:
        super().__init__(speed)  # type: ignore[arg-type]
        self.busy = busy

    def bench(self, cell: CellSpec) -> CellResultRecord:
        record = super().bench(cell)
        if len(self.boots) in self.busy:
            return record.model_copy(update={"client_stall_s": 3.0 * record.duration})
        return record


def _run(tmp_path: Path, low: set[int], busy: set[int]) -> tuple[Ledger, str]:
    """The round on the scripted testbed: boots in ``low`` read 30 % low, boots in ``busy``
    are stalled; K=5 is worth +20 %."""

    def speed(config: Config, n: int) -> float:
        return (
            100.0
            * (0.7 if n in low else 1.0)
            * (1.2 if config["num_speculative_tokens"] == 5 else 1)
        )

    changes = [
        {"drafter_adapter_rank": 0},
        {"drafter_adapter_rank": 16},
        {"num_speculative_tokens": 5},
    ]
    out = io.StringIO()
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    runner = round_runner(
        ledger,
        BusyTestbed(speed, busy),
        changes,
        prof=profile(drift_every=2, champion_boots=1),
        out=out,
    )
    runner.run(RoundOptions(budget=3, proposer="sweep", approve="auto"))
    return ledger, out.getvalue()


def test_a_busy_hosts_low_re_measurement_flags_no_drift(tmp_path: Path) -> None:
    """Boot 4, the sentinel's re-measurement, runs on a busy host and reads 30 % low: no
    drift is suspected (no confirmation boot), the round says why, and K=5 (+20 %) is kept."""
    ledger, said = _run(tmp_path, low={4}, busy={4})
    with ledger:
        baseline = ledger.experiments()[0]
        roles = [b.role for b in ledger.boots(baseline.id)]
        assert roles[:2] == ["measure", "remeasure"] and "confirm" not in roles, roles
        assert not any(d.significant for d in ledger.drifts("scripted"))
        assert "a busy host disturbed the champion's re-measurement" in said, said
        assert "suspected drift" not in said
        k5 = ledger.experiments()[-1]
        assert k5.config["num_speculative_tokens"] == 5 and k5.status == "keep", k5.status


def test_a_busy_hosts_confirmation_boot_confirms_no_drift(tmp_path: Path) -> None:
    """Boot 4, undisturbed, reads 30 % low (a flag); its confirmation, boot 5, runs on a busy
    host and reads as low: it confirms nothing, so the level is not re-based on them."""
    ledger, said = _run(tmp_path, low={4, 5}, busy={5})
    with ledger:
        baseline = ledger.experiments()[0]
        roles = [b.role for b in ledger.boots(baseline.id)]
        assert roles[:3] == ["measure", "remeasure", "confirm"], roles
        # the level is never re-based onto the low readings (a later clean boot may re-base
        # it back up to 100 from the one clean low boot: that is the sentinel at work)
        low = [d for d in ledger.drifts("scripted") if d.significant and d.after < 95]
        assert not low, low
        assert "suspected drift" in said, said
        assert "a busy host disturbed the champion's confirmation" in said, said
        assert "drift confirmed: the champion measures -" not in said, said
