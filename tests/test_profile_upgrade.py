"""The first profile change after an upgrade, named by key.

A release before the forty-eighth session's recorded each profile a cluster ran under
(``profile-revised``) with a digest of each of its sections, not their settings, so the first
change after an upgrade could be named only by section ("verdict changed").
``fixtures/ledgers/schema9.sqlite`` is such a ledger: the release at aab6a58 ran one round on
the embedded twin under ``schema9.profile.yaml`` (its README says how). Now the first run under
today's release that finds the profile unchanged records its settings (a ``profile-revised``
of the same digest), so the next change is named by key; a change made with the upgrade says,
once, that its settings cannot be named.

A setting a release added with a default (the forty-ninth session's
``proposer.claude.api_deadline_s``) is no change of a profile file left as it was: not under
such a record (``schema9.sqlite``), nor under one by the forty-eighth session's release, which
recorded the settings by key (``schema9s.sqlite``, written by the release at 245e1f9); at
another value than its default it is one, said as before.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from rich.console import Console

from agents import SweepProposer
from knobs.vocabulary import EventKind
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile, load_profile
from orchestrator.revision_settings import ADDED, NO_DEFAULT, model_of, release_default
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.profiles import write_profile
from tests.test_migrations import CLUSTER, LEDGERS, _upgraded_release
from tests.test_profile_evolution import RenderingTestbed


def release_profile(**verdict: Any) -> dict[str, Any]:
    """The profile the release ran under, its verdict's settings changed by ``verdict``."""
    data: dict[str, Any] = yaml.safe_load((LEDGERS / "schema9.profile.yaml").read_text())
    data["verdict"] = {**data["verdict"], **verdict}
    return data


def round_under(tmp_path: Path, url: str, data: dict[str, Any]) -> str:
    """A round of one change on the simulated testbed under profile ``data``: what it showed."""
    path = write_profile(tmp_path, data, "now.yaml")
    profile = load_profile(str(path), base_dir=tmp_path)
    shown = io.StringIO()
    with Ledger(url) as ledger:
        RoundRunner(
            profile,
            ledger,
            NullSink(),
            RenderingTestbed(profile.space),
            SweepProposer(),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=shown, width=300)),
        ).run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    return " ".join(shown.getvalue().split())


def revised(url: str) -> list[dict[str, Any]]:
    with Ledger(url) as ledger:
        return [e.detail for e in ledger.events(CLUSTER, EventKind.PROFILE_REVISED)]


def test_the_first_run_after_an_upgrade_records_the_settings_so_the_next_change_is_named_by_key(
    tmp_path: Path,
) -> None:
    """Upgraded, a round under the profile the release ran under (nothing to say), then one
    with the verdict's run-to-run noise edited. Before, the second said `verdict changed`: the
    release's record had no settings to compare. Now the first round records them, and the
    second names the setting, with its values."""
    url, _ = _upgraded_release("schema9", tmp_path)
    [release] = revised(url)
    assert "settings" not in release
    shown = round_under(tmp_path, url, release_profile())
    # the setting this release added, at its default, is no change (it read `proposer changed`)
    assert "the profile changed" not in shown, shown
    assert "measured again before any change is judged" not in shown, shown
    [kept, now] = revised(url)
    assert kept == release  # the release's record as it wrote it
    # a section no release since added a setting to is recorded with the digest it had
    assert now["sections"]["gates"] == release["sections"]["gates"]
    assert now["settings"]["verdict.noise.run_to_run"] == 0.02
    shown = round_under(tmp_path, url, release_profile(noise={"run_to_run": 0.03}))
    assert (
        "the profile changed since twin-local last ran (twin): verdict.noise.run_to_run 0.02 → 0.03"
    ) in shown, shown
    assert "verdict changed" not in shown, shown


def test_a_change_made_with_the_upgrade_says_once_that_its_settings_cannot_be_named(
    tmp_path: Path,
) -> None:
    """The profile edited before the first run under today's release: what the release
    recorded cannot say which setting changed, and the line says so instead of a bare
    `verdict changed`. The next run has the settings, and names its change by key."""
    url, _ = _upgraded_release("schema9", tmp_path)
    edited = release_profile(noise={"run_to_run": 0.03})
    shown = round_under(tmp_path, url, edited)
    assert re.search(
        r"the profile changed since twin-local last ran \(twin\): (\w+, )*verdict changed "
        r"\(which settings? cannot be said: the release that recorded the profile then kept a "
        r"digest of each section, not its settings; they are recorded from now on, and a later "
        r"change is named by its key\)",
        shown,
    ), shown
    assert "the profile changed" not in round_under(tmp_path, url, edited)
    shown = round_under(
        tmp_path, url, {**edited, "verdict": {**edited["verdict"], "confidence": 0.9}}
    )
    assert "(twin): verdict.confidence 0.95 → 0.9" in shown, shown
    assert len(revised(url)) == 3  # the release's, the edit's, the next edit's: none re-recorded


def claude(**options: Any) -> dict[str, Any]:
    """The release's profile with its Claude options set to ``options``."""
    data = release_profile()
    data["proposer"] = {**data["proposer"], "claude": options}
    return data


def test_a_setting_a_release_added_at_its_default_is_no_change_under_a_record_of_its_settings(
    tmp_path: Path,
) -> None:
    """The forty-eighth session's release recorded the profile's settings by key, without the
    one the forty-ninth added. Before, the first round under today's release said `the profile
    changed since twin-local last ran (twin): proposer.claude.api_deadline_s (unset) → 180.0`
    of a file nobody edited. Now it says nothing, and costs no re-measure of the champion."""
    url, _ = _upgraded_release("schema9s", tmp_path)
    [release] = revised(url)
    assert "proposer.claude.api_deadline_s" not in release["settings"]
    shown = round_under(tmp_path, url, release_profile())
    assert "the profile changed" not in shown, shown
    assert "measured again before any change is judged" not in shown, shown
    # recorded again as this release records it (with the setting), once
    [_, now] = revised(url)
    assert now["settings"]["proposer.claude.api_deadline_s"] == 180.0
    assert "the profile changed" not in round_under(tmp_path, url, release_profile())
    assert len(revised(url)) == 2
    shown = round_under(tmp_path, url, claude(api_deadline_s=120))
    assert "(twin): proposer.claude.api_deadline_s 180.0 → 120.0" in shown, shown


def test_a_setting_a_release_added_is_a_change_at_another_value_than_its_default(
    tmp_path: Path,
) -> None:
    """The new setting written into the profile at another value with the upgrade is a
    change, named by key under a record of settings, by section under one of digests."""
    for sub in ("s", "d"):
        (tmp_path / sub).mkdir()
    url, _ = _upgraded_release("schema9s", tmp_path / "s")
    shown = round_under(tmp_path / "s", url, claude(api_deadline_s=120))
    assert "(twin): proposer.claude.api_deadline_s (unset) → 120.0" in shown, shown
    url, _ = _upgraded_release("schema9", tmp_path / "d")
    shown = round_under(tmp_path / "d", url, claude(api_deadline_s=120))
    assert "(twin): proposer changed (which setting cannot be said" in shown, shown


def test_an_edit_beside_a_setting_a_release_added_is_said_alone(tmp_path: Path) -> None:
    """An edit made with the upgrade in the section that gained the setting: the edit is said,
    the setting at its default is not."""
    for sub in ("s", "d"):
        (tmp_path / sub).mkdir()
    url, _ = _upgraded_release("schema9s", tmp_path / "s")
    shown = round_under(tmp_path / "s", url, claude(max_tries=5))
    line = shown.split("the profile changed since twin-local last ran (twin): ")[1]
    assert line.startswith("proposer.claude.max_tries 3 → 5 "), shown
    assert "api_deadline_s" not in shown, shown
    url, _ = _upgraded_release("schema9", tmp_path / "d")
    shown = round_under(tmp_path / "d", url, claude(max_tries=5))
    assert "(twin): proposer changed (which setting cannot be said" in shown, shown


def keys(model: type[BaseModel], above: str = "") -> list[str]:
    """Every dotted key of ``model``'s fields, through the models they hold."""
    out = []
    for name, spec in model.model_fields.items():
        out.append(above + name)
        inner = model_of(spec.annotation)
        out += keys(inner, f"{above}{name}.") if inner is not None else []
    return out


def test_every_setting_a_release_added_is_listed_with_its_default() -> None:
    """A record of digests alone is compared without the settings releases added since
    (``revision_settings.ADDED``): a key the profile's models gained since revisions were
    first recorded (the release at 32ab39f: ``fixtures/profile_keys.txt``) must be listed there
    with a default, or the first run after an upgrade would read as a change."""
    then = set((Path(__file__).parent / "fixtures" / "profile_keys.txt").read_text().split())
    listed = [key for _, added in ADDED for key in added]
    assert sorted(set(keys(Profile)) - then) == sorted(listed)
    assert all(release_default(key) is not NO_DEFAULT for key in listed)
