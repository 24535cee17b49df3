"""What a round's records count and show of a verdict: a measurement interrupted mid-cells and
finished on a new boot is two boots paid and one measurement weighed, in the report, in MLflow
and in the round's decided line alike (``measurements.BootCount``, the one count); and the
report's 95 % interval cell says what the verdict measured, never nothing: the interval of a
guardrail's discard or of a one-run verdict (the noise model's, over what was measured), or
why there is none."""

from __future__ import annotations

import html
import io
import re
from pathlib import Path

from mlflow.tracking import MlflowClient
from rich.console import Console

from agents.sweep import SweepProposer
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from knobs.vocabulary import Kind
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.report import write_report
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import write_profile
from tests.test_kill_points import CLUSTER, Site, _profile_data
from tests.test_pooling import profile

HEAD = "<th>95 % interval</th><th>boots</th><th>measurements</th>"


def _rows(page: str) -> dict[int, list[str]]:
    """The experiments table of a report page: each experiment's cells as text, by its id."""
    table = page[page.index("<h2>Experiments</h2>") : page.index("<h2>Per knob and value</h2>")]
    rows: dict[int, list[str]] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]:
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        rows[int(cells[0].lstrip("#"))] = cells
    return rows


def test_a_measurement_resumed_on_a_new_boot_is_two_boots_and_one_measurement(
    tmp_path: Path,
) -> None:
    """A twin round SIGKILLed after the change's first cell (``cell.recorded@3``: the baseline
    measured cells 1 and 2), then resumed: the resume measures the cell it lacks on a new boot,
    and the verdict weighs one measurement over two boots. The report said "2" boots and MLflow
    ``boots`` 2, with nothing saying the verdict weighed one; now both show the boots paid and
    the measurements weighed, each by its name. Its one-run (threshold) verdict's interval
    cell, empty before, is the noise model's interval, said so; the baseline's says why it has
    none."""
    site = Site(tmp_path)
    write_profile(site.root, _profile_data(champion_boots=1))
    try:
        killed = site.round({"ORCHESTRATE_CRASHPOINT": "cell.recorded@3"})
        assert killed.returncode == -9, killed.stderr
        resumed = site.round()
        assert resumed.returncode == 0, resumed.stderr
    finally:
        orchestrate(tmp_path, "cluster", "down", "--profile", "profile.yaml", env=site.env)
    with Ledger(site.ledger_url) as ledger:
        baseline, change = ledger.experiments(cluster=CLUSTER)
        boots = ledger.boots(change.id)
        verdict = ledger.verdict(change.id)
        runs = {
            e.id: MlflowClient(site.env["MLFLOW_TRACKING_URI"]).get_run(str(e.mlflow_run_id))
            for e in (baseline, change)
        }
    assert [b.measurement for b in boots] == [0, 0], boots  # stitched: one measurement
    # the resume's decided line says both, as the report does (it said neither: no boot failed)
    decided = " ".join(resumed.stderr.split()).split(f" #{change.id} ")[1].split(" #")[0]
    assert "; 2 boot(s) paid for 1 measurement(s)" in decided, decided
    assert verdict is not None and verdict.stats["candidate_boots"] == 1, verdict
    page = (tmp_path / "reports" / "round-1" / "report.html").read_text()
    assert HEAD in page
    rows = _rows(page)
    # the change: two boots paid, one measurement weighed
    assert rows[change.id][8:10] == ["2", "1"], rows
    assert runs[change.id].data.metrics["boots"] == 2
    assert runs[change.id].data.metrics["measurements"] == 1
    # the baseline: one boot, one measurement
    assert rows[baseline.id][8:10] == ["1", "1"], rows
    assert runs[baseline.id].data.metrics["measurements"] == 1
    # the intervals: the one run's, from the noise model; none for the baseline, said why
    assert re.fullmatch(
        r"[+-]\d+\.\d … [+-]\d+\.\d \(one run: the noise model's\)", rows[change.id][7]
    ), rows[change.id]
    assert rows[baseline.id][7] == "—, the champion's own measurement, nothing to compare"


def test_a_guardrail_discard_shows_the_interval_it_measured(tmp_path: Path) -> None:
    """MNBT 7168 → 4096 on the simulated ``far-k`` stack is discarded by the TTFT guardrail
    before the posterior runs: the report's interval cell was empty. It shows the interval of
    what was measured, with the noise model the verdict recorded, and the guardrail that
    decided; the knob's row shows it too."""
    prof = profile(tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            SimulatedTestbed(load_landscape("far-k"), 0),
            SweepProposer([{"max_num_batched_tokens": 4096}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=1, proposer="sweep", approve="auto", seed=0))
        [change] = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        verdict = ledger.verdict(change.id)
        written = write_report(prof, ledger, out=tmp_path / "report")
    assert verdict is not None and verdict.rule == "ttft-guardrail", verdict
    assert "g" not in verdict.stats  # decided before the posterior
    page = written.page.read_text()
    cell = _rows(page)[change.id][7]
    assert re.fullmatch(
        r"[+-]\d+\.\d … [+-]\d+\.\d \(decided by guardrail ttft-guardrail\)", cell
    ), cell
    low, high = (float(x) for x in re.findall(r"[+-]\d+\.\d", cell))
    assert low < change.delta_pct < high  # type: ignore[operator]
    knobs = page[page.index("<h2>Per knob and value</h2>") :]
    assert f'<td class="n">{cell.split(" (")[0]}</td>' in knobs
