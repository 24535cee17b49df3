"""What a round report's gains compare (the forty-ninth session's review, F4): a champion is
measured again after its verdict (its level in force), and every change's Δ is against that
level, never against the objective the champion's row keeps. Round 1 of a 40-experiment night
read "+6.4 % over the round's start" (the levels), a keep's row +11.74 % (its Δ against its
champion then) and the rows' objectives +8.2 %, none of it said; a change's row read below the
baseline's with a positive Δ. The header now says what it compares, in the words ``status``
uses; the table says what each Δ is against, and under it which rows read the other way round
from their champion's row; results.tsv's description says so for those rows."""

from __future__ import annotations

import html
import io
import math
import re
from pathlib import Path

from rich.console import Console

from agents.sweep import SweepProposer
from cluster.simulated import SimulatedTestbed
from cluster.twin.landscape import load_landscape
from knobs.config import Config
from knobs.vocabulary import Kind, Status
from ledger import Ledger
from ledger.export import tsv_rows
from orchestrator.approval import ApprovalGate
from orchestrator.compared_with import tsv_notes
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile
from orchestrator.report.data import collect
from orchestrator.report.page import page
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.test_pooling import profile, profile_data

NULL = {"drafter_adapter_rank": 128}  # no effect on the far-k stack
GOOD = {"num_speculative_tokens": 5}  # +9.9 % on it
OTHER = {"drafter_adapter_rank": 32}  # no effect either


class Scripted(SimulatedTestbed):
    """The far-k stack without noise, each config's boots read at the factors ``script`` gives
    its key, in turn (the last one from then on; none: 1.0): a champion whose first boot read
    high and whose boots since read lower, as a night's re-measures do."""

    def __init__(self, script: dict[str, tuple[float, ...]]) -> None:
        super().__init__(load_landscape("far-k").without_noise(), 0)
        self.script = script
        self.booted: dict[str, int] = {}

    def deploy(self, config: Config) -> dict[int, str]:
        launchers = super().deploy(config)
        n = self.booted[config.key] = self.booted.get(config.key, 0) + 1
        factors = self.script.get(config.key, (1.0,))
        self._factor = factors[min(n, len(factors)) - 1]
        return launchers


def _rows(page_html: str) -> dict[int, list[str]]:
    table = page_html[page_html.index("<h2>Experiments</h2>") : page_html.index("<h2>Per knob")]
    rows: dict[int, list[str]] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]:
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        rows[int(cells[0].lstrip("#"))] = cells
    return rows


def test_the_report_says_what_its_gains_compare_and_what_each_delta_is_against(
    tmp_path: Path,
) -> None:
    prof = profile(tmp_path)
    base = prof.initial_champion()
    good = Config({**base.as_dict(), **GOOD})
    testbed = Scripted({base.key: (1.03, 0.95), good.key: (1.02, 1.0, 0.97)})
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            testbed,
            SweepProposer([NULL, GOOD]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=2, proposer="sweep", approve="auto", seed=0))
        baseline, null, keep = ledger.experiments(cluster=prof.cluster.name)
        start, end = ledger.champion_history(prof.cluster.name)
        null_stats = ledger.verdict(null.id).stats  # type: ignore[union-attr]
        keep_stats = ledger.verdict(keep.id).stats  # type: ignore[union-attr]
        data = collect(prof, ledger)
        notes = tsv_notes(prof, ledger)
        tsv = {
            int(line.split("\t")[0]): line.split("\t")
            for line in tsv_rows(ledger.experiments(cluster=prof.cluster.name), notes)[1:]
        }
    text = page(data, dict.fromkeys(("progress.png", "effects.png", "boots.png"), b""))
    assert (baseline.kind, null.kind, keep.status) == (Kind.BASELINE, Kind.CANDIDATE, Status.KEEP)
    assert (start.experiment_id, end.experiment_id) == (baseline.id, keep.id)
    # both champions measured again since their verdicts: their levels are not their rows
    assert baseline.objective is not None and keep.objective is not None
    assert abs(start.objective / baseline.objective - 1) > 0.005, (start, baseline)
    assert abs(end.objective / keep.objective - 1) > 0.005, (end, keep)
    # the do-nothing change reads below the baseline's row, and its Δ against the level is up
    assert null.objective is not None and null.delta_pct is not None
    assert null.objective < baseline.objective and null.delta_pct > 0, (null, baseline)

    head = html.unescape(text[text.index("<p>Profile") : text.index("<h2>Progress")])
    gained = (end.objective / start.objective - 1) * 100
    assert (
        f"the champion {gained:+.1f} % by the champions' levels in force, "
        f"{start.objective:.1f} → {end.objective:.1f} (#{baseline.id} → #{keep.id}; both "
        f"measured again since their verdicts, whose rows keep {baseline.objective:.1f} and "
        f"{keep.objective:.1f}); the keep measured #{keep.id} {keep.delta_pct:+.2f} % against "
        f"#{baseline.id}'s level in force then, {keep_stats['champion_objective']:.1f} over "
        f"{keep_stats['champion_boots']} boot(s)"
    ) in head, head
    assert "over the round's start" not in head

    rows = _rows(text)
    level = f"{null_stats['champion_objective']:.1f} over {null_stats['champion_boots']} boot(s)"
    assert rows[null.id][6] == f"#{baseline.id}: {level}", rows[null.id]
    assert rows[baseline.id][6] == "", rows[baseline.id]
    under = html.unescape(text[text.index("</table>") : text.index("<h2>Per knob")])
    assert "A Δ is against the champion's level in force when the change was judged" in under
    assert (
        f"#{null.id} ({null.objective:.1f}, {null.delta_pct:+.2f} %; #{baseline.id}'s row "
        f"{baseline.objective:.1f}, its level then {null_stats['champion_objective']:.1f})"
    ) in under, under
    assert f"#{keep.id} (" not in under  # a keep's row above its champion's: nothing to say

    # results.tsv: the same columns; the misleading row's description says what its Δ is
    # against, the others are as they were
    assert len(tsv[null.id]) == 8
    assert tsv[null.id][7] == (
        f"{null.description}; Δ {null.delta_pct:+.2f}% is against champion #{baseline.id}'s "
        f"level in force then, {level} (measured again since its verdict; its row keeps "
        f"{baseline.objective:.2f}), not against its row's objective"
    ), tsv[null.id]
    assert tsv[baseline.id][7] == baseline.description


def test_a_round_without_a_keep_says_its_champion_s_level_not_a_gain(tmp_path: Path) -> None:
    """A round that kept nothing read "the champion +0.0 % over the round's start" beside a
    baseline row of another objective; it says the champion it started from and its level in
    force, and the objective its row keeps."""
    prof = profile(tmp_path)
    base = prof.initial_champion()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            Scripted({base.key: (1.03, 0.95)}),
            SweepProposer([NULL]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=1, proposer="sweep", approve="auto", seed=0))
        baseline, null = ledger.experiments(cluster=prof.cluster.name)
        [champion] = ledger.champion_history(prof.cluster.name)
        data = collect(prof, ledger)
    text = page(data, dict.fromkeys(("progress.png", "effects.png", "boots.png"), b""))
    head = html.unescape(text[text.index("<p>Profile") : text.index("<h2>Progress")])
    assert null.status != Status.KEEP and baseline.objective is not None
    assert (
        f", no keep: the champion #{baseline.id} it started from, its level in force "
        f"{champion.objective:.1f}, measured again since its verdict (its row keeps "
        f"{baseline.objective:.1f}); started"
    ) in head, head
    assert "%" not in head, head


def test_a_past_round_s_report_reads_its_champion_s_level_as_it_stood_at_the_round_s_end(
    tmp_path: Path,
) -> None:
    """Round 1 keeps K 5; round 2 measures that champion again before its first change (it
    reads 15 % lower, a drift confirmed). Round 1's report read the level the champion has
    now, measured in round 2, in its header ("the champion -3.6 % by the champions' levels in
    force, 4632.8 → 4463.8"), a level round 1 never saw. It reads the level as it stood when
    round 1 ended; round 2's report reads the level round 2 measured."""
    prof = profile(tmp_path)
    # round 2's profile measures the champion again before its first change (its last
    # measurement is older than a millisecond): the drift sentinel by age
    aged = Profile.model_validate({**profile_data(tmp_path), "verdict": {"drift_max_age_s": 0.001}})
    base = prof.initial_champion()
    good = Config({**base.as_dict(), **GOOD})
    same = Config({**good.as_dict(), **OTHER})  # round 2's change: nothing, read alike
    testbed = Scripted(
        {base.key: (1.03, 0.95), good.key: (1.02, 1.0, 0.97, 0.85), same.key: (0.85,)}
    )

    def run(prof: Profile, budget: int, changes: list[dict[str, int]]) -> None:
        RoundRunner(
            prof,
            ledger,
            NullSink(),
            testbed,
            SweepProposer(changes),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=budget, proposer="sweep", approve="auto", seed=0))

    cluster = prof.cluster.name
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        run(prof, 2, [NULL, GOOD])
        [first] = ledger.rounds(cluster)
        then = ledger.champion(cluster)
        run(aged, 1, [OTHER])
        second = ledger.rounds(cluster)[-1]
        now = ledger.champion(cluster)
        assert then is not None and now is not None and second.id != first.id
        # the same champion, measured again in round 2: its level moved
        assert now.experiment_id == then.experiment_id
        assert abs(now.objective / then.objective - 1) > 0.02, (then, now)
        data = collect(prof, ledger, first.id)
        old, new = data.gain, collect(prof, ledger, second.id).gain
    assert old is not None and new is not None
    assert old.end.experiment_id == then.experiment_id
    assert math.isclose(old.end.objective, then.objective, rel_tol=1e-9), (old.end, then)
    text = page(data, dict.fromkeys(("progress.png", "effects.png", "boots.png"), b""))
    head = html.unescape(text[text.index("<p>Profile") : text.index("<h2>Progress")])
    assert f"→ {then.objective:.1f} (#" in head, head
    assert f"{now.objective:.1f}" not in head, head
    # and its progress plot's champion line ends where round 1 left it
    assert data.champion_after[-1] is not None
    assert math.isclose(data.champion_after[-1], then.objective, rel_tol=1e-9), data.champion_after
    # round 2, which measured it again, reads its level in force now
    assert new.end.objective == now.objective
    assert f"its level in force {now.objective:.1f}" in new.words(), new.words()
