"""The first profile change after an upgrade, named by key.

A release before the forty-eighth session's recorded each profile a cluster ran under
(``profile-revised``) with a digest of each of its sections, not their settings, so the first
change after an upgrade could be named only by section ("verdict changed").
``fixtures/ledgers/schema9.sqlite`` is such a ledger: the release at aab6a58 ran one round on
the embedded twin under ``schema9.profile.yaml`` (its README says how). Now the first run under
today's release that finds the profile unchanged records its settings (a ``profile-revised``
of the same digest), so the next change is named by key; a change made with the upgrade says,
once, that its settings cannot be named.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from agents import SweepProposer
from knobs.vocabulary import EventKind
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import load_profile
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
    # a section this release gave a setting (at its default) reads as changed, once; the
    # verdict's did not change
    assert "verdict" not in shown.split("the profile changed")[-1].split(")")[0], shown
    [kept, now] = revised(url)
    assert kept == release  # the release's record as it wrote it
    assert now["sections"]["verdict"] == release["sections"]["verdict"]
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
        r"digest of each section, not its settings, so a setting a later release added, at its "
        r"default, reads so too; they are recorded from now on, and a later change is named by "
        r"its key\)",
        shown,
    ), shown
    assert "the profile changed" not in round_under(tmp_path, url, edited)
    shown = round_under(
        tmp_path, url, {**edited, "verdict": {**edited["verdict"], "confidence": 0.9}}
    )
    assert "(twin): verdict.confidence 0.95 → 0.9" in shown, shown
    assert len(revised(url)) == 3  # the release's, the edit's, the next edit's: none re-recorded
