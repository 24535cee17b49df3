"""A resume killed before it closed the boots the run before it left open: the next resume
finds them open again and records them again. Each is said once, as left by the run that
left it, and the next resume as the one that closed it (``orchestrator.resumes``), on a real
SQLite ledger read by the real ``orchestrate report``."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from knobs.vocabulary import BOOT_INTERRUPTED, BootStatus, EventKind, Kind
from ledger import Ledger
from orchestrator import resumes, revision
from orchestrator.cli import run
from orchestrator.profile import load_profile
from orchestrator.timestamps import utc_minute

CLUSTER = "twin-local"


def test_boots_a_killed_resume_left_open_are_said_once_and_closed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'orchestrate.db'}"
    monkeypatch.setenv("ORCHESTRATE_LEDGER", url)
    profile = load_profile(None)
    with Ledger(url) as ledger:
        revision.record(ledger, CLUSTER, profile)  # this release ran the cluster
        rnd = ledger.create_round(
            cluster=CLUSTER,
            profile_name=profile.name,
            profile_digest=profile.digest,
            budget=2,
            proposer="sweep",
            approve="auto",
            seed=0,
        )
        base = profile.initial_champion()
        e = ledger.add_experiment(
            cluster=CLUSTER,
            round_id=rnd.id,
            kind=Kind.BASELINE,
            config=base,
            champion_key=None,
            champion_objective=None,
        )
        # the round's run is killed as its baseline boots
        boot = ledger.start_boot(e.id, base)
        # the first resume records what it found open, and is killed before it closes it
        resumes.record(ledger, CLUSTER, rnd.id, proposer="sweep", approve="auto", seed=0)
        # the second finds the same boot open, records it, and closes it
        resumes.record(ledger, CLUSTER, rnd.id, proposer="sweep", approve="auto", seed=0)
        ledger.end_boot(boot.id, status=BootStatus.DOWN, failure_detail=BOOT_INTERRUPTED)
        events = ledger.events(CLUSTER, EventKind.ROUND_RESUMED)
        assert [ev.detail["left_open"] for ev in events] == [[boot.id], [boot.id]]
        first, second = resumes.of_round(ledger, ledger.round(rnd.id))
    assert [b.boot.id for b in first.left_open] == [boot.id]
    assert second.left_open == [], "listed again as left open by the killed resume's run"
    assert second.closed_for == {boot.id: first.at}
    assert first.closed_for == {}

    assert run(["report"]) == 0, capsys.readouterr().err
    page = (tmp_path / "reports" / "round-1" / "report.html").read_text()
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert "it was resumed 2 time(s)" in text, text
    said = f"boot #{boot.id} of experiment #{e.id} was coming up"
    assert text.count(said) == 1, text
    assert (
        f"resumed at {utc_minute(second.at)}. It closed boot #{boot.id}, left open before the "
        f"resume at {utc_minute(first.at)}, which was killed before it closed it"
    ) in text, text
