"""``orchestrate report --round N`` of a round that later rounds followed, under a profile edited
since: the page says that round as it ended (the fifty-second session's review, A). Before, it
showed the champion fitted to today's profile (a knob round 1 never ran, with its default) and
its level as later rounds measured it, with today's priors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from knobs.config import Config
from knobs.spec import Value
from ledger import Ledger
from orchestrator.profile import load_profile
from orchestrator.report.data import collect
from tests.fixtures.profiles import write_profile
from tests.test_profile_evolution import FOO, profile_data
from tests.test_profile_evolution_under_way import round_of


def faster_each_boot() -> Callable[[Config], float]:
    """Each boot of the first config booted (the champion, whatever knobs the profile gained
    since: foo) a little faster, every other config slower."""
    boots: list[dict[str, Value]] = []

    def speed(config: Config) -> float:
        settings = {k: v for k, v in config.items() if k != "foo"}
        if boots and settings != boots[0]:
            return 80.0
        boots.append(settings)
        return 100.0 + 4 * len(boots)

    return speed


def test_a_past_rounds_report_shows_its_champion_as_that_round_ran_it(tmp_path: Path) -> None:
    """Round 2 ran under a profile that gained knob foo: round 1's page showed its champion
    with foo=3, which round 1 never ran."""
    speed = faster_each_boot()
    round_of(tmp_path, profile_data(), 2, speed=speed)
    now = {**profile_data({**FOO, "new": True}), "name": "p2"}
    round_of(tmp_path, now, 2, speed=speed)
    profile = load_profile(str(write_profile(tmp_path, now)), base_dir=tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        first, second = ledger.rounds("evolving")
        champion = ledger.champion_history("evolving")[0]
        past = collect(profile, ledger, first.id)
        last = collect(profile, ledger, second.id)
    # as round 1 ran it, as the ledger recorded it: no foo
    assert past.champion_config is not None
    assert "foo" not in past.champion_config, past.champion_config
    assert past.champion_config.key == champion.config.key
    assert past.past and not last.past
    # the last round's champion is the one the next round runs: fitted, foo at its default
    assert last.champion_config is not None and last.champion_config["foo"] == 3


def test_a_past_rounds_report_says_its_champions_level_at_that_rounds_end(
    tmp_path: Path,
) -> None:
    """Round 1 measured its champion twice (104, 108); round 2 measured it again (112, …):
    round 1's page said the level over all of them, as of today."""
    speed = faster_each_boot()
    round_of(tmp_path, profile_data(), 2, speed=speed)
    round_of(tmp_path, profile_data(), 2, speed=speed)
    profile = load_profile(str(write_profile(tmp_path, profile_data())), base_dir=tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        first, second = ledger.rounds("evolving")
        assert first.finished_at is not None
        champion = ledger.champion_history("evolving")[0]
        then = [
            b for b in ledger.boots(champion.experiment_id) if b.started_at <= first.finished_at
        ]
        past = collect(profile, ledger, first.id)
        last = collect(profile, ledger, second.id)
    assert past.level is not None and last.level is not None
    assert past.level.boots == len(then) == 2 < last.level.boots, (past.level, last.level)
    assert past.level.level == pytest.approx(106.0, rel=0.01), past.level
