"""A boot killed as it came up (``kill -9`` of the orchestrator while its engines loaded)
measured nothing: `status` said of the baseline under way `1 boot(s) paid for 1
measurement(s)` beside `0 measurement(s) weighed` (the review's D)."""

from __future__ import annotations

from pathlib import Path

from knobs.vocabulary import Kind
from ledger import Ledger
from orchestrator.measurements import BootCount
from tests.test_agents_context import CHAMPION


def test_a_boot_that_never_came_up_is_no_measurement(tmp_path: Path) -> None:
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        rnd = ledger.create_round(
            cluster="c", profile_name="p", profile_digest="d", budget=1, proposer="optuna",
            approve="auto", seed=0,
        )  # fmt: skip
        e = ledger.add_experiment(
            cluster="c", round_id=rnd.id, kind=Kind.BASELINE, config=CHAMPION,
            champion_key=None, champion_objective=None,
        )  # fmt: skip
        ledger.start_boot(e.id, CHAMPION)  # killed as it came up
        killed = BootCount.of(e, ledger.boots(e.id))
        ledger.start_boot(e.id, CHAMPION, measurement=0)  # the resume's, coming up
        again = BootCount.of(e, ledger.boots(e.id))
    assert (killed.boots, killed.measurements) == (1, 0), killed
    assert (again.boots, again.measurements) == (2, 0), again
