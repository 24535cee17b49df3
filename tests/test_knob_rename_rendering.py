"""A catalog knob renamed (``renamed_from``) is the same knob rendering the same flags: the
engine it runs is the same. Before, the entry moved under ``knobs:`` rendered its flag after the
catalog's, the launchers' digest read that as another launcher, and the champion's
measurements were set aside and it was booted again; the entry lost the catalog's TTFT
guardrail side and effect prior; a change resumed across the rename was judged with the
profile's prior, its knob's history unread. Now the digest a boot records leaves the knobs'
order out (a boot an older release recorded is compared as that release digested it, before
the rename and after it), the entry inherits what the catalog gave the old name, and a change
recorded under the old name is judged as one of the knob now."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents import SweepProposer
from knobs.vocabulary import State
from ledger import Ledger
from orchestrator.champion import ChampionEvidence
from orchestrator.profile import Profile
from orchestrator.rendering import _digest
from tests.test_migrations import LEDGERS
from tests.test_profile_evolution import FOO, profile_data
from tests.test_profile_evolution_under_way import MNBT, round_of

#: the catalog's MNBT knob as a profile's own entry under another name, spelt whole (no
#: guardrail side, no prior: what a user who copies the flag writes)
MNBT_SPELT = {
    "name": "mnbt",
    "renamed_from": MNBT,
    "type": "int",
    "low": 2048,
    "high": 16384,
    "step": 512,
    "default": 7168,
    "render": {"kind": "flag", "flag": "--max-num-batched-tokens"},
}


def renamed(data: dict[str, Any], entry: dict[str, Any] = MNBT_SPELT) -> dict[str, Any]:
    """``data`` with the catalog's MNBT knob renamed ``mnbt``."""
    return {**data, "untuned": [MNBT], "knobs": [*data.get("knobs", []), entry]}


def counted(data: dict[str, Any], db: Path) -> tuple[int, str | None]:
    """How many of the champion's measurements count for it under profile ``data``, and the
    line saying it is measured again (``None``: it is not)."""
    profile = Profile.model_validate(data)
    with Ledger(f"sqlite:///{db}") as ledger:
        evidence = ChampionEvidence(profile, ledger)
        champion = evidence.fitted()
        assert champion is not None
        return len(evidence.rendered_now(champion)), evidence.restated()


def test_a_catalog_knob_renamed_keeps_the_champions_measurements_of_an_older_release(
    tmp_path: Path,
) -> None:
    """The release at aab6a58 recorded each boot's digest of its argv in the knobs' order
    (``schema9.sqlite``): with MNBT renamed, its flag now comes after the others, and those
    boots still count."""
    db = tmp_path / "orchestrate.db"
    shutil.copyfile(LEDGERS / "schema9.sqlite", db)
    data = yaml.safe_load((LEDGERS / "schema9.profile.yaml").read_text())
    assert counted(data, db) == (2, None)
    assert counted(renamed(data), db) == (2, None)


def test_a_rename_or_knobs_reordered_does_not_measure_the_champion_again(tmp_path: Path) -> None:
    """Boots of this release: the catalog's MNBT renamed, then the profile's own knobs
    reordered; the champion's one measurement counts throughout, and no round boots it."""
    other = {**FOO, "name": "bar", "render": {"kind": "env", "env": "BAR"}}
    before = profile_data(FOO, other)
    round_of(tmp_path, before, 0)
    db = tmp_path / "ledger.db"
    assert counted(before, db) == (1, None)
    after = renamed(before)
    assert counted(after, db) == (1, None)
    shown, bed = round_of(tmp_path, after, 0)
    assert "measured again" not in shown and bed.boots == [], shown
    reordered = {**after, "knobs": [other, MNBT_SPELT, FOO]}
    assert counted(reordered, db) == (1, None)
    # a flag rendered otherwise is another engine still
    moved = {
        **reordered,
        "knobs": [other, MNBT_SPELT, {**FOO, "render": {"kind": "env", "env": "F"}}],
    }
    assert counted(moved, db)[0] == 0


def test_a_renamed_catalog_knob_keeps_what_the_catalog_gave_it_unless_it_says() -> None:
    catalog = Profile.model_validate(profile_data()).space.spec(MNBT)
    spec = Profile.model_validate(renamed(profile_data(), {"name": "mnbt", "renamed_from": MNBT}))
    mnbt = spec.space.spec("mnbt")
    assert mnbt.render == catalog.render and mnbt.domain() == catalog.domain()
    assert mnbt.monotone_guardrails == {"ttft-guardrail": "below"}
    assert mnbt.effect_prior == catalog.effect_prior
    said = {"name": "mnbt", "renamed_from": MNBT, "effect_prior": None, "high": 8192}
    mnbt = Profile.model_validate(renamed(profile_data(), said)).space.spec("mnbt")
    assert mnbt.effect_prior is None and mnbt.domain()[-1] == 8192
    assert mnbt.monotone_guardrails == {"ttft-guardrail": "below"}


def test_a_change_resumed_across_a_rename_is_judged_with_its_knobs_history(
    tmp_path: Path,
) -> None:
    """MNBT 4096 decided, then 6144 killed as it boots; resumed with MNBT renamed ``mnbt``, the
    6144 change is judged with the knob's prior (the catalog's, learned from 4096), not the
    profile's, pooled with 4096."""
    data = {**profile_data(), "verdict": {"max_boots": 2}}
    moves = [{MNBT: 4096}, {MNBT: 6144}]
    with pytest.raises(KeyboardInterrupt):
        round_of(tmp_path, data, 3, SweepProposer(moves), kill=lambda c: c[MNBT] == 6144)
    round_of(tmp_path, renamed(data), 0)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _, _, resumed, *_ = ledger.experiments(cluster="evolving")
        assert (resumed.knob, resumed.value, resumed.state) == (MNBT, 6144, State.DECIDED)
        verdict = ledger.verdict(resumed.id)
    assert verdict is not None, resumed
    assert verdict.stats["prior_from"] == "knob", verdict.stats
    assert verdict.stats["pooled_values"] == 1, verdict.stats  # 4096, decided under MNBT


def older_form(data: dict[str, Any], db: Path) -> None:
    """Every boot in ledger ``db`` given the digest a release before the fifty-second
    session's recorded under profile ``data``: its argv in the profile's order of the knobs
    (``rendering._digest`` of the space as ordered, the form the schema-9 fixture's boots hold)."""
    profile = Profile.model_validate(data)
    with Ledger(f"sqlite:///{db}") as ledger:
        configs = {e.id: e.config for e in ledger.experiments()}
    with sqlite3.connect(db) as raw:
        boots = raw.execute("SELECT id, experiment_id FROM boot").fetchall()
        for boot, experiment in boots:
            then = _digest(profile, profile.space, configs[experiment])
            raw.execute("UPDATE boot SET rendering = ? WHERE id = ?", (then, boot))


def test_the_older_form_is_the_profiles_order_as_an_older_release_recorded_it(
    tmp_path: Path,
) -> None:
    """What ``older_form`` writes is what the release at aab6a58 recorded."""
    data = yaml.safe_load((LEDGERS / "schema9.profile.yaml").read_text())
    profile = Profile.model_validate(data)
    with Ledger(f"sqlite:///{LEDGERS / 'schema9.sqlite'}") as ledger:
        champion = ChampionEvidence(profile, ledger).fitted()
        assert champion is not None
        recorded = {b.rendering for b in ledger.boots(champion.experiment_id)}
    assert recorded == {_digest(profile, profile.space, champion.config)}


def test_own_knobs_reordered_keep_the_champions_measurements_of_an_older_release(
    tmp_path: Path,
) -> None:
    """A champion measured by an older release (its boots' digest of the argv in the
    profile's order), then the profile's own knobs reordered, nothing renamed: the boots'
    digest is the launchers of now in the order the ledger's profile recorded, and they
    count. Before, they read as another rendering: set aside, the champion booted again."""
    bar = {**FOO, "name": "bar", "render": {"kind": "flag", "flag": "--bar"}}
    before = profile_data(FOO, bar)
    round_of(tmp_path, before, 0)
    db = tmp_path / "ledger.db"
    older_form(before, db)
    assert counted(before, db) == (1, None)
    reordered = profile_data(bar, FOO)
    assert counted(reordered, db) == (1, None)
    shown, bed = round_of(tmp_path, reordered, 0)
    assert "measured again" not in shown and bed.boots == [], shown
    # a flag rendered otherwise is another engine still, in any order
    moved = profile_data({**bar, "render": {"kind": "flag", "flag": "--baz"}}, FOO)
    assert counted(moved, db)[0] == 0
