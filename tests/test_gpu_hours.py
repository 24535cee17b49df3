"""GPU-hours: every boot's wall time in the ledger times the GPUs the profile's nodes declare;
``--max-gpu-hours`` is kept with the round, counts every boot of it across resumes (a champion
re-measured included), and a stop by it says so. The real loop, ledger and verdict code run on
a scripted testbed."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from agents import SweepProposer
from knobs.vocabulary import Kind
from ledger import Ledger, RoundRecord
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.gpu_hours import cluster_gpus, gpu_hours
from orchestrator.profile import Profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_round_policy import ScriptedTestbed, profile

CHANGES = [{"num_speculative_tokens": k} for k in (5, 6, 4)]


def two_nodes_of(gpus: int) -> Profile:
    base = profile()
    node = base.cluster.nodes[0]
    nodes = tuple(node.model_copy(update={"rank": r, "gpus": gpus}) for r in (0, 1))
    return base.model_copy(update={"cluster": base.cluster.model_copy(update={"nodes": nodes})})


def _boot_hours_by_hand(ledger: Ledger, rnd: RoundRecord) -> float:
    """The round's boots, read from the ledger's rows one by one (every experiment of the
    cluster, the champion's included): their wall time summed, in hours."""
    seconds = 0.0
    for e in ledger.experiments(cluster=rnd.cluster):
        for b in ledger.boots(e.id):
            if b.started_at >= rnd.started_at and b.ended_at is not None:
                seconds += (b.ended_at - b.started_at).total_seconds()
    return seconds / 3600


def test_a_round_stops_at_its_gpu_hours_and_a_resume_keeps_counting(tmp_path: Path) -> None:
    prof = two_nodes_of(gpus=4)
    assert cluster_gpus(prof) == 8
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")

    def runner(said: io.StringIO) -> RoundRunner:
        return RoundRunner(
            prof,
            ledger,
            NullSink(),
            ScriptedTestbed(lambda c, n: 100.0),
            SweepProposer(CHANGES),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=said, width=200)),
        )

    said = io.StringIO()
    # the baseline's boots hold the GPUs for milliseconds: more than a nanohour
    first = runner(said).run(
        RoundOptions(budget=2, proposer="sweep", approve="auto", max_gpu_hours=1e-9)
    )
    assert first.stopped_by == "max-gpu-hours" and first.round.status == "running"
    assert first.round.max_gpu_hours == 1e-9
    assert [e.kind for e in first.experiments] == [Kind.BASELINE]
    text = " ".join(said.getvalue().split())
    assert "stopped by --max-gpu-hours 1e-09 (0.00 GPU-hours used): 0 of 2 experiments" in text
    assert "a larger --max-gpu-hours resumes it" in text
    by_hand = _boot_hours_by_hand(ledger, first.round)
    assert by_hand > 0
    assert first.gpu_hours == pytest.approx(8 * by_hand, rel=1e-9)

    # a resume without the flag keeps the cap: stopped again at once, nothing booted
    said = io.StringIO()
    again = runner(said).run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    assert again.stopped_by == "max-gpu-hours" and len(again.experiments) == 1
    assert "keeps its --max-gpu-hours 1e-09" in " ".join(said.getvalue().split())

    # a larger cap: the round goes on to its budget, and its GPU-hours are every boot's since
    # the round started, the first run's included
    said = io.StringIO()
    done = runner(said).run(
        RoundOptions(budget=2, proposer="sweep", approve="auto", max_gpu_hours=100.0)
    )
    assert "takes --max-gpu-hours 100" in " ".join(said.getvalue().split())
    assert done.stopped_by == "budget" and done.round.status == "done"
    assert done.round.max_gpu_hours == 100.0
    assert done.gpu_hours > first.gpu_hours
    total = gpu_hours(ledger, done.round, prof)
    assert total == pytest.approx(8 * _boot_hours_by_hand(ledger, done.round), rel=1e-9)
    # the next round's boots are not this round's
    nxt = runner(io.StringIO()).run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert nxt.round.id != done.round.id and nxt.gpu_hours > 0
    assert gpu_hours(ledger, ledger.round(done.round.id), prof) == pytest.approx(total, rel=1e-9)
    ledger.close()


def test_max_gpu_hours_on_nodes_without_gpus_is_one_line(tmp_path: Path) -> None:
    data = twin_profile_data(nodes=1)
    data["cluster"]["nodes"][0]["gpus"] = 0
    path = write_profile(tmp_path, data)
    done = orchestrate(
        tmp_path, "round", "--max-gpu-hours", "2", "--profile", str(path),
        env={**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/o.db"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "declare no GPUs (gpus: 0)" in lines[0], done.stderr
