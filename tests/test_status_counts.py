"""``orchestrate status`` counts the last round's boots as its report does, from the one home
(``round_boots``): the boots it paid (the champion's re-measurements and failed boots too), the
measurements its verdicts weighed (``measurements.BootCount``), and the boots a busy host
disturbed (``host_stalls.disturbed``). Before, status counted no disturbed boot and no
measurement; the report counted both."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import yaml
from rich.console import Console

from agents.sweep import SweepProposer
from knobs.vocabulary import BootRole
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile
from orchestrator.report import write_report
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.test_pooling import profile_data
from tests.test_report_counts import _rows
from tests.test_verdict_stalled import MNBT, BusyHost


def test_status_counts_the_last_rounds_boots_as_its_report_does(tmp_path: Path) -> None:
    """A round on the simulated stack whose host was busy for every boot of MNBT 4096 (its
    boots disturbed), with two more changes; the champion is re-measured between them (boots
    that no experiment's row counts). The report's page and ``status`` (text and --json) say
    the same boots paid, measurements weighed and disturbed boots."""
    data = profile_data(tmp_path)
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    url = f"sqlite:///{tmp_path}/ledger.db"
    prof = Profile.model_validate(data)
    with Ledger(url) as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            BusyHost(4096, (0.55, 0.9), seed=0),
            SweepProposer([{MNBT: 4096}, {MNBT: 12288}, {"num_speculative_tokens": 5}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=3, proposer="sweep", approve="auto", seed=0))
        roles = [b.role for e in ledger.experiments() for b in ledger.boots(e.id)]
        page = write_report(prof, ledger, out=tmp_path / "report").page.read_text()
    # the page's numbers: every boot, the measurements column summed, the disturbed boots
    rows = _rows(page)
    paid = int(re.findall(r"<p>(\d+) boots? \(", page)[0])
    weighed = sum(int(r[9]) for r in rows.values())
    disturbed = int(
        re.findall(r"(\d+) boot\(s\) measured in windows a busy host disturbed", page)[0]
    )
    remeasures = roles.count(BootRole.REMEASURE)
    assert remeasures >= 1, roles
    # the champion's re-measurements are boots the round paid that no experiment's row counts
    assert paid > sum(int(r[8].split()[0]) for r in rows.values()), rows
    assert disturbed >= 2 and weighed >= 3, page
    assert f"{weighed} measurement(s) weighed by its verdicts" in page
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    shown = orchestrate(tmp_path, "status", "--profile", "profile.yaml", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["last_round"] == {
        "round": 1,
        "boots": paid,
        "failed_boots": 0,
        "remeasures": remeasures,
        "measurements": weighed,
        "disturbed_boots": disturbed,
    }
    text = orchestrate(tmp_path, "status", "--profile", "profile.yaml", env=env)
    assert text.returncode == 0, text.stderr
    said = " ".join(text.stdout.split())
    assert (
        f"round 1: {paid} boot(s) paid ({remeasures} re-measured the champion), {weighed} "
        "measurement(s) weighed by its verdicts; "
        f"{disturbed} boot(s) measured in windows a busy host disturbed"
    ) in said, said
