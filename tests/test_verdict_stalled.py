"""A reading a busy host may have made decides nothing: what its stalls may have cost each boot
(``orchestrator.host_stalls``) widens the verdict's error, a keep must hold at the least
favourable reading they allow and a discard (either futility) at the most favourable, and such
a measurement teaches neither the knob's prior nor the noise model as if clean; the verdict's
words and the report say so. Where nothing stalled, nothing changes."""

from __future__ import annotations

import io
import math
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
from orchestrator.champion import ChampionEvidence
from orchestrator.display import RoundDisplay
from orchestrator.host_stalls import HostError, boot_error, busy_words
from orchestrator.priors import base_prior, learned_prior
from orchestrator.profile_sections import VerdictSpec
from orchestrator.report.data import collect, summary
from orchestrator.report.page import page
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from orchestrator.verdict import Assessment, Evidence, assess
from tests.test_pooling import profile
from tests.test_verdict import NOISE, cell

SPEC = VerdictSpec()
CELLS = ("code-c1", "code-c8", "prose-c1", "prose-c8")
MNBT = "max_num_batched_tokens"


def boot(scale: float, stalls: dict[str, float] | None = None) -> list[CellResultRecord]:
    """One boot's four cells at ``scale`` × 1000 tok/s each, their 2 s windows stalled as
    ``stalls`` says (seconds, by cell; ``"*"``: every cell)."""
    stalls = stalls or {}
    return [
        cell(1000.0 * scale, name=name).model_copy(
            update={"client_stall_s": stalls.get(name, stalls.get("*", 0.0))}
        )
        for name in CELLS
    ]


def judge(
    candidate: list[list[CellResultRecord]], champion_boots: int = 3, confirmations: int = 0
) -> Assessment:
    """The verdict on ``candidate``'s boots against an unstalled champion at 4000 tok/s."""
    champion = [boot(1.0) for _ in range(champion_boots)]
    return assess(
        SPEC,
        Evidence(
            candidate=[sum(c.output_throughput for c in b) for b in candidate],
            champion=[sum(c.output_throughput for c in b) for b in champion],
            confirmations=confirmations,
            candidate_cells=[c for b in candidate for c in b],
            champion_cells=champion[-1],
            candidate_stalls=[boot_error(b) for b in candidate],
            champion_stalls=[boot_error(b) for b in champion],
        ),
        NOISE,
    )


def test_a_reading_a_busy_host_stalled_for_seconds_neither_discards_nor_keeps() -> None:
    """The review's #7: every cell's 2 s window stalled 5.72 s, the objective read −45 %. Not
    discarded (neither "worse" nor "not worth a change", nor a keep out of reach), not kept: the
    look asks for another boot, and after three such boots ends inconclusive; the verdict's
    words and stats say what the host did."""
    verdict = judge([boot(0.55, {"*": 5.72})])
    assert (verdict.status, verdict.rule, verdict.next_boot) == (
        "more",
        "posterior",
        "candidate",
    ), verdict.reason
    # the widened error alone leaves the posterior near the prior, whose P(gain > 1 %) is under
    # the futility: the most favourable reading is what keeps it from "not worth a change"
    assert verdict.stats["p_worth"] < SPEC.futility  # type: ignore[operator]
    assert verdict.stats["stall_p_worth"] >= SPEC.futility  # type: ignore[operator]
    # the predictive futility reads it at its most favourable too: a keep is not out of reach
    assert verdict.stats["p_reach"] >= SPEC.predictive_futility  # type: ignore[operator]
    assert verdict.stats["stall_se"] == 1.0 and verdict.stats["stall_bound"] == 1.0
    assert "a busy host widened the error ±100.0%" in verdict.reason, verdict.reason
    last = judge([boot(0.55, {"*": 5.72}) for _ in range(SPEC.max_boots)])
    assert (last.status, last.rule) == ("inconclusive", "max-boots"), last.reason
    # a +45 % reading so stalled is not kept either
    up = judge([boot(1.45, {"*": 5.72})], confirmations=1)
    assert up.status == "more", up.reason


def test_a_stall_in_one_cell_judges_against_a_bound_of_its_share() -> None:
    """One cell of four stalled 5.72 s around its 2 s window may have moved the objective by
    up to its share: a quarter. −45 % is worse even read that much higher; −8 % is not
    (another boot), though unstalled it is discarded; a cell stalled 1 s of its 2 s may have
    moved an eighth, and −8 % read 12.5 % higher is still out of a keep's reach."""
    worse = judge([boot(0.55, {"prose-c8": 5.72})])
    assert (worse.status, worse.rule) == ("discard", "posterior"), worse.reason
    assert worse.stats["stall_bound"] == 0.25
    assert judge([boot(0.92)]).status == "discard"
    near = judge([boot(0.92, {"prose-c8": 5.72})])
    assert near.status == "more", near.reason
    second = judge([boot(0.92, {"prose-c8": 1.0})])
    assert (second.status, second.rule, second.stats["stall_bound"]) == (
        "discard",
        "futility",
        0.125,
    ), second.reason


def test_small_stalls_are_nearly_harmless_and_no_stall_changes_nothing() -> None:
    """0.05 s of a 2 s window in one cell (a loaded CI machine): a −15 % change is still
    discarded as worse, a +15 % one still kept; unstalled, the verdict records no stall."""
    small = {"code-c8": 0.05}
    worse = judge([boot(0.85, small)])
    assert (worse.status, worse.rule) == ("discard", "posterior"), worse.reason
    assert "): worse; " in worse.reason, worse.reason
    kept = judge([boot(1.15, small)], confirmations=1)
    assert kept.status == "keep", kept.reason
    assert kept.stats["stall_se"] < 0.01  # type: ignore[operator]
    clean = judge([boot(1.15)], confirmations=1)
    assert clean.status == "keep" and "stall_se" not in clean.stats
    assert "busy host" not in clean.reason


class BusyHost(SimulatedTestbed):
    """The simulated far-k stack, its host busy while one config is measured: every cell of a
    config with ``MNBT == busy`` comes back stalled 3 windows long and reading low by what
    ``lows`` says of its boot (one factor per boot, in turn), as a host that stays busy leaves
    the least stalled of three measurements."""

    def __init__(self, busy: int, lows: tuple[float, ...], seed: int) -> None:
        super().__init__(load_landscape("far-k"), seed)
        self.busy = busy
        self.lows = lows
        self.busy_boots = 0

    def deploy(self, config: Config) -> dict[int, str]:
        if config.as_dict()[MNBT] == self.busy:
            self.busy_boots += 1
        return super().deploy(config)

    def bench(self, cell: CellSpec) -> CellResultRecord:
        record = super().bench(cell)
        config = self._config
        if config is not None and config.as_dict()[MNBT] == self.busy:
            low = self.lows[(self.busy_boots - 1) % len(self.lows)]
            record = record.model_copy(
                update={
                    "client_stall_s": 3.0 * record.duration,
                    "output_throughput": record.output_throughput * low,
                }
            )
        return record


def test_a_busy_hosts_boots_teach_nothing_and_the_report_counts_them(tmp_path: Path) -> None:
    """A round on the simulated stack whose host was busy for every boot of MNBT 4096, reading
    it 45 % low, then 10 % low: the verdict is no discard (nor keep), its words and stats say
    the host widened its error; MNBT's learned prior stays near its card's (the review's
    "±45.5 %, n=4" came from such readings); the noise model learns nothing from the scatter
    of those boots; the report counts them instead of saying no boot was the infrastructure's."""
    prof = profile(tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            BusyHost(4096, (0.55, 0.9), seed=0),
            SweepProposer([{MNBT: 4096}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=1, proposer="sweep", approve="auto", seed=0))
        (candidate,) = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        verdict = ledger.verdict(candidate.id)
        prior = learned_prior(prof, ledger, MNBT)
        noise = ChampionEvidence(prof, ledger).noise()
        data = collect(prof, ledger)
        html = page(data, dict.fromkeys(("progress.png", "effects.png", "boots.png"), b""))
    assert verdict is not None
    assert candidate.status not in ("discard", "keep"), verdict.reason
    assert "a busy host widened the error" in verdict.reason, verdict.reason
    # its record (results.tsv's description, ``experiments show``) says whose reading it is
    assert "every boot measured on a busy host" in candidate.description, candidate.description
    assert verdict.stats["stall_se"] > 0.5, verdict.stats  # type: ignore[operator]
    base = base_prior(prof, MNBT)
    assert prior is not None
    assert abs(prior.p_null - base.p_null) < 0.05, (prior, base)
    assert abs(math.log(prior.effect_pct / base.effect_pct)) < 0.2, (prior, base)
    # log(0.55 / 0.9) apart: learned, the boot-to-boot cv would be ~0.13
    assert noise.boot_cv < 0.08, noise
    assert data.disturbed_boots >= 2, data
    assert summary(data)["disturbed_boots"] == data.disturbed_boots
    assert "No boot was the infrastructure's" not in html
    assert f"{data.disturbed_boots} boot(s) measured in windows a busy host disturbed" in html


def test_a_discard_on_a_busy_host_says_what_it_rests_on_not_that_the_host_read_it() -> None:
    """A change every boot of which a busy host disturbed: left undecided, the record says the
    reading is the host's. Discarded all the same, it said so too, beside a status that barred
    a region (a TTFT guardrail judged on a window no host stalled, MNBT ≤ 2560 barred): the
    record said two opposite things. A discard now says what it rests on."""
    stalled = [boot(0.9, {"*": 0.3}), boot(0.9, {"*": 0.3})]
    undecided = busy_words(stalled)
    assert undecided is not None and undecided.endswith(": the host's reading, not the change's")
    guardrail = busy_words(stalled, "ttft-guardrail")
    assert guardrail is not None and "the host's reading" not in guardrail
    assert guardrail.endswith(
        "; the discard rests on its guardrail (ttft-guardrail), not on the objective"
    )
    bounded = busy_words(stalled, "posterior")
    assert bounded is not None
    assert bounded.endswith("; the discard holds at the most favourable reading they allow")
    # one undisturbed boot: nothing to say
    assert busy_words([boot(0.9, {"*": 0.3}), boot(0.9)], "posterior") is None


def test_a_stall_bound_past_the_reading_itself_is_said_so_not_as_a_percentage() -> None:
    """Both sides' stall bounds added may pass 100 % of the reading: "may have moved the
    reading up to 152.3%" of a throughput is no number a person can use."""
    wide = HostError(se=0.6, bound=1.523, disturbed=True).words(0.5, 0.5, 2.0)
    assert "may have moved the reading by more than the reading itself" in wide, wide
    assert "152.3%" not in wide
    narrow = HostError(se=0.1, bound=0.25, disturbed=True).words(0.5, 0.5, 2.0)
    assert "may have moved the reading up to 25.0%" in narrow, narrow
