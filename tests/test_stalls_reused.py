"""A boot a busy host disturbed is evidence only where its stall error goes with it: a later
verdict that pools an earlier boot (another value of the knob, the value's own earlier look)
carries each boot's stall error, or leaves a disturbed boot out (``host_stalls.reusable``);
and a keep or discard an earlier release decided on such windows, without the stall rule, is
read by today's rule (``stalled_verdicts``): the discard bars nothing, neither teaches the
knob's prior, and the report's row says how it was decided. A champion's boot a busy host
disturbed tests nothing of its level (``remeasure``): no drift, no keep's boots set aside."""

from __future__ import annotations

import io
import json
import math
import sqlite3
from pathlib import Path

from rich.console import Console

from agents.sweep import SweepProposer
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import BootRole, EventKind, Kind
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.history import proposal_context_of
from orchestrator.host_stalls import boot_error, reusable
from orchestrator.pooling import ValueBoots, pool
from orchestrator.priors import MEASURING, measured
from orchestrator.profile import Profile
from orchestrator.profile_sections import VerdictSpec
from orchestrator.report.data import collect
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.stalled_verdicts import WORDS
from orchestrator.step_cost import draft_changes
from orchestrator.testbed import NullSink
from orchestrator.verdict import Assessment, Evidence, assess
from tests.test_pooling import CV, TAU, K, profile
from tests.test_verdict import NOISE
from tests.test_verdict_stalled import MNBT, BusyHost, boot

#: The far-k stack's champion's MNBT.
CHAMPION = 7168


def run(tmp: Path, *values: int) -> None:
    """A round on the simulated far-k stack that sweeps MNBT through ``values``, its host busy
    for every boot of MNBT 4096 (reading it 45 % low, then 10 % low: ``BusyHost``)."""
    with Ledger(f"sqlite:///{tmp}/ledger.db") as ledger:
        RoundRunner(
            profile(tmp),
            ledger,
            NullSink(),
            BusyHost(4096, (0.55, 0.9), seed=0),
            SweepProposer([{MNBT: v} for v in values]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=len(values), proposer="sweep", approve="auto", seed=0))


def _pooled(
    spec: VerdictSpec,
    champion: list[list[CellResultRecord]],
    candidate: list[list[CellResultRecord]],
    errors: list[float],
    neighbours: list[ValueBoots],
) -> Assessment:
    """The verdict on K=5's ``candidate`` boots (each off by ``errors``) pooled with K's
    ``neighbours``, against the unstalled ``champion``."""
    objectives = [sum(c.output_throughput for c in b) for b in candidate]
    own = ValueBoots(5, tuple(math.log(x) for x in objectives), tuple(errors))
    champion_logs = [math.log(sum(c.output_throughput for c in b)) for b in champion]
    pooled = pool(K, 7, champion_logs, own, neighbours, boot_cv=NOISE.boot_cv, p_null=0.5, tau=TAU)
    assert pooled is not None
    evidence = Evidence(
        candidate=objectives,
        champion=[sum(c.output_throughput for c in b) for b in champion],
        confirmations=0,
        candidate_cells=[c for b in candidate for c in b],
        champion_cells=champion[-1],
        candidate_stalls=errors,
        champion_stalls=[0.0] * len(champion),
    )
    return assess(spec, evidence, NOISE, pooled=pooled)


def test_another_values_disturbed_boots_are_not_pooled_as_clean(tmp_path: Path) -> None:
    """MNBT 4096 measured on a busy host ends undecided at the boot cap (its verdict a
    measured one, so MNBT's next value is judged with it); 8704, measured on a quiet host,
    is then judged on its own boots: 4096's boots measured the host, and pooled they would
    pass a −45 % reading off as MNBT's curve."""
    run(tmp_path, 4096, 8704)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        first, second = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        earlier, later = ledger.verdict(first.id), ledger.verdict(second.id)
    assert (first.value, second.value) == (4096, 8704)
    assert earlier is not None and later is not None
    assert (earlier.status, earlier.rule) == ("inconclusive", "max-boots"), earlier.reason
    assert "pooled_values" not in later.stats, later.reason
    assert "other value(s) of the knob" not in later.reason, later.reason


def test_a_pooled_boot_carries_its_stall_error_and_a_disturbed_one_is_left_out() -> None:
    """A boot stalled a little enters a later look with its error, as in its own verdict: K's
    neighbours that gained +8 % lift a candidate less when their boots (or the champion's)
    were stalled, and not at all past what their errors allow; errors of 0 change nothing. A
    boot the host disturbed is not reused at all."""
    champion = [0.0, 0.01, -0.01]
    candidate = ValueBoots(5, (0.02,))
    neighbours = [ValueBoots(v, (0.077, 0.077)) for v in (6, 4)]

    def judged(
        errors: tuple[float, ...] = (), champion_errors: tuple[float, ...] = ()
    ) -> tuple[float, float]:
        others = [ValueBoots(n.value, n.logs, errors) for n in neighbours]
        pooled = pool(
            K,
            7,
            champion,
            candidate,
            others,
            boot_cv=CV,
            p_null=0.1,
            tau=TAU,
            champion_errors=champion_errors,
        )
        assert pooled is not None
        return pooled.posterior.p_above(0.0), pooled.prior.sd

    clean = judged()
    assert judged((0.0, 0.0), (0.0, 0.0, 0.0)) == clean
    stalled = judged((0.06, 0.06))
    assert stalled[0] < clean[0] and stalled[1] > clean[1], (stalled, clean)
    shared = judged(champion_errors=(0.06, 0.06, 0.06))
    assert shared[0] < clean[0], (shared, clean)
    # what each boot carries: its error where the host barely touched it, nothing disturbed
    small = boot(1.0, {"code-c8": 0.05})
    assert reusable(small) == boot_error(small) and 0 < boot_error(small) < 0.01
    assert reusable(boot(1.0)) == 0.0
    assert reusable(boot(0.55, {"*": 5.72})) is None


def test_a_pooled_verdict_discards_only_at_the_most_favourable_reading_the_stalls_allow() -> None:
    """K=5 read +6 % on two boots whose code-c8 window stalled 0.15 s of its 2 s (each boot
    off by up to 1.9 %: stalled, not disturbed), K's neighbours +3 %. Pooled, the posterior
    finds it not worth a change, as it does unstalled; but a discard must hold at the most
    favourable reading the stalls allow, pooled or not (``HostError.judged``): +7.9 % is not
    futile, so the look asks for another boot instead, and its words say what it read."""
    spec = VerdictSpec()
    champion = [boot(1.0) for _ in range(3)]
    neighbours = [ValueBoots(v, (math.log(4000 * 1.03),) * 2) for v in (6, 4)]

    def judged(stall: float) -> Assessment:
        candidate = [boot(1.06, {"code-c8": stall}) for _ in range(2)]
        return _pooled(spec, champion, candidate, [boot_error(b) for b in candidate], neighbours)

    clean = judged(0.0)
    assert (clean.status, clean.rule) == ("discard", "posterior"), clean.reason
    stalled = judged(0.15)
    assert "pooled_values" in stalled.stats and "a busy host widened" in stalled.reason
    assert 0 < float(stalled.stats["stall_bound"]) < 0.02  # type: ignore[arg-type]
    # the pooled posterior alone would discard it ...
    assert float(stalled.stats["p_worth"]) < spec.futility  # type: ignore[arg-type]
    # ... its most favourable reading is not futile: another boot, not a discard
    assert float(stalled.stats["stall_p_worth"]) >= spec.futility  # type: ignore[arg-type]
    assert (stalled.status, stalled.next_boot) in (("more", "candidate"), ("more", "champion"))
    assert "not worth a change" not in stalled.reason, stalled.reason


def test_an_earlier_releases_discard_on_a_busy_hosts_windows_bars_nothing(
    tmp_path: Path,
) -> None:
    """A ledger an earlier release wrote: MNBT 4096 measured on a busy host, every window
    stalled, and discarded at −45 % as "worse" by the posterior, with no stall error (as the
    releases before the forty-eighth session judged such windows). Opened now, the record
    keeps what it said, but the discard bars nothing: 4096 may be proposed again under the
    same champion; MNBT's learned prior (nor the step cost's fit) does not learn −45 % from it;
    the report's row says it was decided on a busy host's windows."""
    run(tmp_path, 4096)
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        [first] = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        verdict = ledger.verdict(first.id)
        assert verdict is not None and "stall_se" in verdict.stats, verdict
        assert first.round_id is not None
    # what the earlier release recorded of it: the same readings, judged without the stalls
    stats = {
        k: v
        for k, v in verdict.stats.items()
        if not k.startswith("stall_") and k not in ("noise_se", "p_reach", "next_boot")
    }
    g = verdict.stats["g"]
    assert isinstance(g, float) and g < math.log(0.8), g
    reason = f"{math.expm1(g) * 100:+.2f}% over 3 measurement(s) vs 3; P(gain)=0.00: worse"
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        db.execute(
            "UPDATE verdict SET status = 'discard', rule = 'posterior', reason = ?, stats = ? "
            "WHERE experiment_id = ?",
            (reason, json.dumps({**stats, "se": 0.03}), first.id),
        )
        db.execute("UPDATE experiment SET status = 'discard' WHERE id = ?", (first.id,))
    prof = profile(tmp_path)
    with Ledger(url) as ledger:
        recorded = ledger.verdict(first.id)
        context = proposal_context_of(prof, ledger, first.round_id)
        changes = measured(ledger, ledger.experiments(), prof.cells)
        steps = draft_changes(ledger, ledger.experiments(), MNBT, MEASURING)
        data = collect(prof, ledger)
    assert recorded is not None and (recorded.status, recorded.reason) == ("discard", reason)
    assert first.config.key not in context.decided_keys
    assert [c for c in changes if c.experiment == first.id] == []
    assert steps == []  # nor the step cost a K change's counters are read with
    [row] = [p for p in data.points if p.experiment == first.id]
    assert row.status == "discard" and row.label.endswith(f"; {WORDS}"), row.label


class BusyLater(SimulatedTestbed):
    """The simulated far-k stack whose host turns busy after the ``quiet`` first boots of MNBT
    ``mnbt`` (which read ``scale`` × what the stack says): every later boot of it comes back
    with every window stalled 3 windows long and reading 45 % low."""

    def __init__(self, mnbt: int, quiet: int, seed: int, scale: float = 1.0) -> None:
        super().__init__(load_landscape("far-k"), seed)
        self.mnbt, self.quiet, self.scale = mnbt, quiet, scale
        self.booted = 0

    def deploy(self, config: Config) -> dict[int, str]:
        if config.as_dict()[MNBT] == self.mnbt:
            self.booted += 1
        return super().deploy(config)

    def bench(self, cell: CellSpec) -> CellResultRecord:
        record = super().bench(cell)
        config = self._config
        if config is None or config.as_dict()[MNBT] != self.mnbt:
            return record
        if self.booted <= self.quiet:
            return record.model_copy(
                update={"output_throughput": record.output_throughput * self.scale}
            )
        return record.model_copy(
            update={
                "client_stall_s": 3.0 * record.duration,
                "output_throughput": record.output_throughput * 0.55,
            }
        )


def busy_round(tmp: Path, testbed: BusyLater, prof: Profile, *values: int) -> str:
    """A round that sweeps MNBT through ``values`` on ``testbed``: what it said."""
    out = io.StringIO()
    with Ledger(f"sqlite:///{tmp}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            testbed,
            SweepProposer([{MNBT: v} for v in values]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=out, width=400)),
        ).run(RoundOptions(budget=len(values), proposer="sweep", approve="auto", seed=0))
    return out.getvalue()


def test_a_champion_boot_a_busy_host_disturbed_tests_no_drift(tmp_path: Path) -> None:
    """The drift sentinel re-measures the champion after every decided change
    (``drift_every: 1``); from its third boot on its host is busy and reads it 45 % low. Such
    a boot measured the host: it flags no drift (no confirmation boot), re-bases nothing, and
    the round says why; the re-measurement is recorded as any other."""
    base = profile(tmp_path)
    prof = base.model_copy(update={"verdict": base.verdict.model_copy(update={"drift_every": 1})})
    testbed = BusyLater(CHAMPION, quiet=2, seed=0)
    said = busy_round(tmp_path, testbed, prof, 8704, 9728)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion(prof.cluster.name)
        assert champion is not None
        boots = ledger.boots(champion.experiment_id)
        drifts = ledger.drifts(prof.cluster.name)
    assert champion.config.as_dict()[MNBT] == CHAMPION
    assert testbed.booted > 2, testbed.booted
    assert [b.role for b in boots if b.role == BootRole.CONFIRM] == [], boots
    assert not any(d.significant for d in drifts), drifts
    assert len(drifts) >= testbed.booted - 1, drifts
    assert "a busy host disturbed the champion's re-measurement" in said, said


def test_a_kept_changes_first_boot_a_busy_host_disturbed_sets_no_boots_aside(
    tmp_path: Path,
) -> None:
    """MNBT 8704 reads 30 % high on its two boots as a candidate and is kept; its first boot of
    its own as champion, which tests whether those boots read high, comes from a busy host
    and reads 45 % low. It measured the host: the boots that kept it stay in its level, no
    drift is flagged, and the round says why."""
    prof = profile(tmp_path)
    said = busy_round(tmp_path, BusyLater(8704, quiet=2, seed=0, scale=1.3), prof, 8704)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion(prof.cluster.name)
        assert champion is not None
        boots = ledger.boots(champion.experiment_id)
        set_aside = ledger.events(prof.cluster.name, EventKind.KEEP_BOOTS_SET_ASIDE)
    assert champion.config.as_dict()[MNBT] == 8704
    assert [b.role for b in boots] == [BootRole.MEASURE, BootRole.CONFIRM, BootRole.REMEASURE]
    assert set_aside == [], set_aside
    assert "a busy host disturbed the champion's re-measurement" in said, said


def test_a_pooled_verdict_reads_the_other_values_at_the_least_and_most_favourable_too() -> None:
    """The candidate's own boots are clean; K's neighbours' boots stalled a little (each off by
    up to 1.9 %: stalled, not disturbed). Pooled, their readings decide much of the verdict, so
    a keep must hold, and a discard, at the least and the most favourable readings their
    stalls allow, as the candidate's own would (``Pooled.least``, ``most``): a +8 % boot beside
    neighbours at +10 % is promising only if their +10 % is taken at its word, and a +2 % value
    beside neighbours at +5 % is "not worth a change" only so. Unstalled, the same readings
    confirm and discard, as before."""
    spec = VerdictSpec()
    champion = [boot(1.0) for _ in range(3)]

    def judged(own: float, boots: int, theirs: float, error: float) -> Assessment:
        neighbours = [ValueBoots(v, (math.log(4000 * theirs),) * 2, (error,) * 2) for v in (6, 4)]
        candidate = [boot(own) for _ in range(boots)]
        return _pooled(spec, champion, candidate, [0.0] * boots, neighbours)

    promising, gained = judged(1.08, 1, 1.10, 0.0), judged(1.08, 1, 1.10, 0.019)
    assert promising.status == "confirm" and "pooled_stall_bound" not in promising.stats
    assert gained.status == "more", gained.reason
    assert float(gained.stats["p_gain"]) >= spec.confidence  # type: ignore[arg-type]
    assert float(gained.stats["stall_p_gain"]) < spec.confidence  # type: ignore[arg-type]
    assert "the other values' boots stalled too" in gained.reason, gained.reason
    flat, stalled = judged(1.02, 3, 1.05, 0.0), judged(1.02, 3, 1.05, 0.019)
    assert (flat.status, flat.rule) == ("discard", "posterior"), flat.reason
    assert float(stalled.stats["p_worth"]) < spec.futility  # type: ignore[arg-type]
    assert stalled.status != "discard" and "not worth" not in stalled.reason, stalled.reason
