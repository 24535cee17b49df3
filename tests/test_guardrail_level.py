"""The TTFT guardrail judges a change against the champion's boots in force, as the objective
is judged, not against its latest boot alone: one low reading of the champion's would discard
every change after it, each "grew" by the same amount (the fifty-second session's review, B).
And a breach that rests on windows of few requests, whose p90 is then their slowest request's,
says so and what reads it better."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from agents.sweep import SweepProposer
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import Kind
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.guardrails import guard
from orchestrator.profile_sections import VerdictSpec
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.test_pooling import profile
from tests.test_verdict import cell

MNBT = "max_num_batched_tokens"


class OneLowChampionBoot(SimulatedTestbed):
    """The simulated stack with every cell's TTFT p90 at 500 ms, but for the champion's third
    boot, whose cells read 300 ms (a quiet moment of the host's, a lucky scheduler)."""

    def __init__(self) -> None:
        super().__init__(load_landscape("far-k"), seed=0)
        self.first: Config | None = None
        self.champion_boots = 0

    def deploy(self, config: Config) -> dict[int, str]:
        launchers = super().deploy(config)
        self.first = self.first or config
        if config.key == self.first.key:
            self.champion_boots += 1
        return launchers

    def bench(self, cell: CellSpec) -> CellResultRecord:
        record = super().bench(cell)
        config = self._config
        assert self.first is not None and config is not None
        low = self.champion_boots == 3 and config.key == self.first.key
        ttft = 300.0 if low else 500.0
        return record.model_copy(
            update={
                "mean_ttft_ms": ttft,
                "median_ttft_ms": ttft,
                "p90_ttft_ms": ttft,
                "p99_ttft_ms": ttft,
                "completed": max(record.completed, 20),
            }
        )


def test_the_guardrail_reads_the_champions_boots_in_force_not_its_last(tmp_path: Path) -> None:
    """Every change reads 500 ms, as the champion's first two boots did; its third read 300 ms.
    Against that one boot each change "grew +67%" and was discarded; against the champion's
    three boots in force (433 ms) none grew past the limit."""
    prof = profile(tmp_path)
    testbed = OneLowChampionBoot()
    values = [8192, 6144, 5120, 4096]
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            testbed,
            SweepProposer([{MNBT: v} for v in values]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=len(values), proposer="sweep", approve="auto", seed=0))
        candidates = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        verdicts = [ledger.verdict(e.id) for e in candidates]
    # the champion reached its third boot while these were judged: the low one was in force
    assert testbed.champion_boots >= 3, testbed.champion_boots
    reasons = [v.reason for v in verdicts if v is not None]
    assert all(v is not None and v.rule != "ttft-guardrail" for v in verdicts), reasons
    # and none barred the rest of its side (MNBT declares its TTFT guardrail monotone)
    assert [e.value for e in candidates] == values, reasons


SPEC = VerdictSpec()


def test_a_breach_on_windows_of_few_requests_says_so() -> None:
    """A breach whose windows completed three requests: its p90 is the slowest request's, and
    the words say so and name the cell's window; one of ten requests or more says nothing more."""
    few = cell(100.0, name="agentic-c4", ttft=550.0).model_copy(update={"completed": 3})
    champion = cell(100.0, name="agentic-c4", ttft=330.0)
    breach = guard(SPEC, [few], [champion]).breach
    assert breach is not None and breach.rule == "ttft-guardrail"
    assert breach.reason == (
        "TTFT p90 of agentic-c4 grew +67% (limit +50%); a window of it completed only 3 "
        "request(s), and its p90 is then its slowest one's: a longer window (cell agentic-c4's "
        "duration_s) reads it better"
    ), breach.reason
    enough = guard(SPEC, [few.model_copy(update={"completed": 10})], [champion]).breach
    assert enough is not None and enough.reason == "TTFT p90 of agentic-c4 grew +67% (limit +50%)"
