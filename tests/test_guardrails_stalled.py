"""A latency guardrail read from a window a busy host stalled measures the host, not the config:
such a reading judges no guardrail, on either side, and the verdict says so; the objective and
the undisturbed cells still judge the change, and such a cell bars no value through a
guardrail declared monotone (MNBT's time to first token)."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

from rich.console import Console

from agents.sweep import SweepProposer
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import Kind
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.known_bad import barred_regions
from orchestrator.profile_sections import VerdictSpec
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from orchestrator.verdict import Evidence, assess
from tests.test_pooling import profile
from tests.test_verdict import NOISE, cell

SPEC = VerdictSpec()
MNBT = "max_num_batched_tokens"


def stalled(
    record: CellResultRecord, client: float = 0.92, engine: float = 4.91
) -> CellResultRecord:
    """``record`` as a busy host left it: its 2 s window stalled ``client + engine`` seconds."""
    return record.model_copy(update={"client_stall_s": client, "engine_stall_s": engine})


def prose(tok_s: float, ttft: float) -> CellResultRecord:
    return cell(tok_s, name="prose-c8", ttft=ttft)


def judged(
    candidate: list[CellResultRecord],
    champion: list[CellResultRecord],
    objectives: tuple[float, float],
) -> Evidence:
    return Evidence(
        candidate=[objectives[0]],
        champion=[objectives[1]] * 3,
        confirmations=0,
        candidate_cells=candidate,
        champion_cells=champion,
    )


def test_a_stalled_candidate_cell_judges_no_guardrail_and_the_verdict_says_so() -> None:
    """The review's #5: prose-c8 of the candidate stalled 5.83 s around its 2 s window, its TTFT
    p90 156 ms against the champion's 20 ms (+680 %): not a guardrail discard, and the verdict's
    words and stats name the cell and the stall; the objective still judges the change."""
    ev = judged([stalled(prose(100.0, 156.0))], [prose(100.0, 20.0)], (100.0, 100.0))
    verdict = assess(SPEC, ev, NOISE)
    assert verdict.rule != "ttft-guardrail", verdict.reason
    assert verdict.reason.endswith(
        "; TTFT guardrail not judged on prose-c8: its window stalled 5.83 s by a busy host"
    ), verdict.reason
    assert verdict.stats["ttft_unjudged"] == {"prose-c8": 5.83}
    # a change worse on its objective is still discarded, on the objective
    worse = assess(
        SPEC, judged([stalled(prose(85.0, 156.0))], [prose(100.0, 20.0)], (85.0, 100.0)), NOISE
    )
    assert (worse.status, worse.rule) == ("discard", "posterior"), worse.reason


def test_a_stalled_champion_reading_judges_no_guardrail() -> None:
    """The champion's prose-c8 read 4 ms in a window its host stalled: the candidate's 66 ms
    is not measured against it."""
    ev = judged([prose(100.0, 66.0)], [stalled(prose(100.0, 4.0), 3.0, 0.0)], (100.0, 100.0))
    verdict = assess(SPEC, ev, NOISE)
    assert verdict.rule != "ttft-guardrail", verdict.reason
    assert verdict.reason.endswith(
        "TTFT guardrail not judged on prose-c8: the champion's window stalled 3.00 s by a busy host"
    ), verdict.reason


def test_an_undisturbed_cell_or_reading_still_judges_the_guardrail() -> None:
    """A stall sets aside only the readings it disturbed: another cell's growth, or the same
    cell's undisturbed boot, still discards the change; a stall below the disturbed fraction
    (``cluster.stall.disturbed``) sets nothing aside."""
    other = judged(
        [stalled(prose(100.0, 156.0)), cell(100.0, ttft=400.0)],
        [prose(100.0, 20.0), cell(100.0, ttft=100.0)],
        (100.0, 100.0),
    )
    verdict = assess(SPEC, other, NOISE)
    assert (verdict.status, verdict.rule) == ("discard", "ttft-guardrail")
    assert verdict.reason == (
        "TTFT p90 of code-c1 grew +300% (limit +50%); "
        "TTFT guardrail not judged on prose-c8: its window stalled 5.83 s by a busy host"
    )
    # two boots of the candidate: the stalled one's 1000 ms is set aside, the other's 110 ms
    # (+10 %) passes, its 400 ms does not
    calm = judged(
        [stalled(prose(100.0, 1000.0)), prose(100.0, 110.0)], [prose(100.0, 100.0)], (100.0, 100.0)
    )
    assert assess(SPEC, calm, NOISE).rule != "ttft-guardrail"
    slow = judged(
        [stalled(prose(100.0, 1000.0)), prose(100.0, 400.0)], [prose(100.0, 100.0)], (100.0, 100.0)
    )
    assert assess(SPEC, slow, NOISE).rule == "ttft-guardrail"
    # 0.03 s of a 2 s window (under 2 %): the reading judges
    slight = judged(
        [stalled(prose(100.0, 400.0), 0.03, 0.0)], [prose(100.0, 100.0)], (100.0, 100.0)
    )
    slight_verdict = assess(SPEC, slight, NOISE)
    assert slight_verdict.rule == "ttft-guardrail" and "not judged" not in slight_verdict.reason


class BusyHost(SimulatedTestbed):
    """The simulated stack, its host busy while one config is measured: every cell of a config
    with ``MNBT == busy`` comes back stalled over its window, as ``cluster.bench`` keeps the
    least stalled of three measurements on a host that stays busy."""

    def __init__(self, busy: int, seed: int) -> None:
        super().__init__(load_landscape("far-k"), seed)
        self.busy = busy

    def bench(self, cell: CellSpec) -> CellResultRecord:
        record = super().bench(cell)
        config = self._config
        if config is not None and config.as_dict()[MNBT] == self.busy:
            stall = 3.0 * record.duration  # far past the disturbed fraction
            record = record.model_copy(update={"client_stall_s": stall, "engine_stall_s": 0.0})
        return record


def test_a_stalled_cell_bars_no_value_through_a_monotone_guardrail(tmp_path: Path) -> None:
    """MNBT 7168 → 4096 is past the stack's TTFT guardrail, which MNBT declares monotone below
    a value (``test_a_guardrail_declared_monotone_bars_its_side_under_its_champion``: 4096's
    discard bars 3072). Measured on a busy host, 4096's windows say nothing of its TTFT: it is
    judged on its objective, bars no region, and 3072 is measured."""
    prof = profile(tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            BusyHost(4096, seed=0),
            SweepProposer([{MNBT: 4096}, {MNBT: 3072}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=2, proposer="sweep", approve="auto", seed=0))
        candidates = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        first = ledger.verdict(candidates[0].id)
        regions = [r for r in barred_regions(prof, ledger) if r.region.source == "guardrail"]
    assert [e.value for e in candidates] == [4096, 3072]
    assert first is not None
    assert first.rule != "ttft-guardrail", first.reason
    assert "TTFT guardrail not judged on" in first.reason, first.reason
    assert all(r.experiment.id != candidates[0].id for r in regions), regions


def test_an_older_releases_stalled_guardrail_discard_bars_nothing(tmp_path: Path) -> None:
    """A ledger an earlier release wrote: MNBT 4096 measured on a busy host, every window
    stalled, and discarded by the TTFT guardrail of prose-c8 (as the forty-sixth session's
    release judged stalled windows; its readings carry the stalls). MNBT declares that
    guardrail monotone, so the discard barred every smaller MNBT when a newer release opened
    the ledger: 3072 was skipped. Today's rule decides what a record bars, whatever release
    wrote it: the discard stays in the record as it was, and bars nothing; 3072 is measured."""
    prof = profile(tmp_path)
    url = f"sqlite:///{tmp_path}/ledger.db"

    def round_of(*values: int) -> None:
        with Ledger(url) as ledger:
            RoundRunner(
                prof,
                ledger,
                NullSink(),
                BusyHost(4096, seed=0),
                SweepProposer([{MNBT: v} for v in values]),
                ApprovalGate(ledger, "auto"),
                RoundDisplay(Console(file=io.StringIO())),
            ).run(RoundOptions(budget=len(values), proposer="sweep", approve="auto", seed=0))

    round_of(4096)
    reason = "TTFT p90 of prose-c8 grew +676% (limit +50%)"
    with Ledger(url) as ledger:
        [first] = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        assert first.status != "keep", first  # the champion stays 7168, as it did then
        stats = {k: v for k, v in first_stats(ledger, first.id).items() if k != "ttft_unjudged"}
    # what the earlier release recorded of it: a discard by the TTFT guardrail
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        db.execute(
            "UPDATE verdict SET status = 'discard', rule = 'ttft-guardrail', reason = ?, "
            "stats = ? WHERE experiment_id = ?",
            (reason, json.dumps({**stats, "ttft_cell": "prose-c8"}), first.id),
        )
        db.execute("UPDATE experiment SET status = 'discard' WHERE id = ?", (first.id,))
    with Ledger(url) as ledger:
        regions = [r for r in barred_regions(prof, ledger) if r.region.source == "guardrail"]
        recorded = ledger.verdict(first.id)
    assert regions == [], [r.region.region() for r in regions]
    assert recorded is not None and (recorded.rule, recorded.reason) == ("ttft-guardrail", reason)
    round_of(3072)
    with Ledger(url) as ledger:
        values = [e.value for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
    assert values == [4096, 3072]


def first_stats(ledger: Ledger, experiment: int) -> dict[str, object]:
    verdict = ledger.verdict(experiment)
    assert verdict is not None
    return dict(verdict.stats)
