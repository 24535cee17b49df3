"""A host too busy to measure on stops the round (``orchestrator.busy_host``): after
``verdict.busy_host_stop`` changes in a row every measurement of which a busy host disturbed,
the round stops with exit 5 as a node whose clocks stay off does, their verdicts recorded,
nothing barred, the stop recorded for ``status`` and the resume; such a change is not offered
again in the sitting that measured it, and is offered again after the resume. A change partly
disturbed, or an undisturbed one between, leaves the round going."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest

from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import Kind
from ledger import Ledger
from orchestrator.away import stop_data
from orchestrator.busy_host import BusyHost
from orchestrator.priors import measured
from orchestrator.round import RoundOptions
from orchestrator.stops import last_stop
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_round_policy import ScriptedTestbed, profile, proposal_context, round_runner

RANK = "drafter_adapter_rank"
K = "num_speculative_tokens"
#: the sweep: the adapter rank's values other than the champion's (64), then K 7 → 6; none of
#: them does anything
CHANGES: list[dict[str, object]] = [{RANK: r} for r in (0, 16, 32, 128)]
CHANGES.append({"num_speculative_tokens": 6})


class Busy(ScriptedTestbed):
    """The scripted testbed at 100 tok/s whatever the config (else as ``speed`` says), whose
    boots ``busy`` says (the config, and its how-many-th boot) come back with every window
    stalled three window lengths (a host the load held off the CPU; else ``stall`` of them),
    the client's stall (else the engine's: ``engine_stall_s``, as the twin reports its host's)."""

    def __init__(
        self,
        busy: Callable[[Config, int], bool],
        speed: Callable[[Config, int], float] = lambda config, n: 100.0,
        stall: Callable[[Config], float] = lambda config: 3.0,
        side: str = "client_stall_s",
    ) -> None:
        super().__init__(speed)
        self.busy = busy
        self.stall = stall
        self.side = side

    def bench(self, cell: CellSpec) -> CellResultRecord:
        record = super().bench(cell)
        config = self.boots[-1]
        if self.busy(config, sum(1 for c in self.boots if c == config)):
            return record.model_copy(update={self.side: self.stall(config) * record.duration})
        return record


def test_changes_a_busy_host_disturbed_in_a_row_stop_the_round_and_bar_nothing(
    tmp_path: Path,
) -> None:
    """Every boot of a change is on a busy host (the champion's are not): K 7 → 5, rank 0 and
    rank 16 end inconclusive, and before a fourth change is proposed the round stops (exit 5,
    ``BusyHost``) with one line that says what was seen and what to do, recorded for the
    morning. Nothing is barred, and the sitting holds the three: K=5, which a clean
    inconclusive would leave open for a second look at once, is not offered again in it. The
    host quiet, the same command resumes, and K=5 and rank 0 are measured again first."""
    quiet = False
    changes: list[dict[str, object]] = [{K: 5}, *CHANGES[:3]]
    testbed = Busy(lambda config, n: not quiet and config != testbed.boots[0])
    out = io.StringIO()
    options = RoundOptions(budget=5, proposer="sweep", approve="auto")
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        with pytest.raises(BusyHost) as stopped:
            round_runner(ledger, testbed, changes, out=out).run(options)
        busy = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        assert [e.status for e in busy] == ["inconclusive"] * 3, [e.status for e in busy]
        assert stopped.value.exit_code == 5
        assert stopped.value.experiments == [e.id for e in busy]
        said = str(stopped.value)
        ids = ", ".join(f"#{e.id}" for e in busy)
        assert f"every measurement of the last 3 changes in a row (experiments {ids};" in said
        assert "nothing was barred" in said and "run the same command to resume" in said, said
        assert "open for a second look" not in busy[0].description, busy[0].description
        assert ledger.unfinished_round("scripted") is not None  # open for the same command
        stop = last_stop(ledger, "scripted", busy[0].round_id or 0)
        assert stop is not None and stop.reason == said and stop.detail["exit_code"] == 5
        # nothing barred; held for the rest of this sitting, no second look at once
        context = proposal_context(ledger, testbed)
        assert context.known_bad == ()
        assert {e.config.key for e in busy} <= context.decided_keys
        entries = [h for h in context.history if h.experiment in {e.id for e in busy}]
        assert [(h.second_look, h.judged) for h in entries] == [(None, False)] * 3, entries

        quiet = True
        report = round_runner(ledger, testbed, changes, out=out).run(options)
        assert report.resumed and report.stopped_by == "budget"
        after = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE][3:]
        # offered again after the resume: the host made nothing of them
        assert [e.config.key for e in after] == [e.config.key for e in busy[:2]]
        assert all(e.status != "inconclusive" for e in after), [e.status for e in after]


def test_a_change_partly_disturbed_or_an_undisturbed_one_between_leaves_the_round_going(
    tmp_path: Path,
) -> None:
    """Rank 0 on a busy host, rank 16 only on its first boot, 32 and 128 on a busy host, K=6
    on a quiet one: never three changes in a row whose every boot was disturbed, so the round
    goes to its budget (the ordinary round on a loaded machine). The three the host made
    nothing of are no look at their values; rank 16 is."""

    def busy(config: Config, n: int) -> bool:
        rank = config[RANK]
        return rank in (0, 32, 128) or (rank == 16 and n == 1)

    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        report = round_runner(ledger, Busy(busy), CHANGES).run(
            RoundOptions(budget=5, proposer="sweep", approve="auto")
        )
        assert report.stopped_by == "budget"
        changes = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        assert [e.config[RANK] for e in changes] == [0, 16, 32, 128, 64]
        # the three the host made nothing of judged nothing (held for the sitting, no look);
        # the one it disturbed only once was judged on its other boots, as ever
        context = proposal_context(ledger, Busy(busy))
        judged = {h.value: h.judged for h in context.history if h.knob == RANK}
        assert judged == {0: False, 16: True, 32: False, 128: False}, judged


def test_the_setting_stops_after_as_many_as_it_says_and_is_validated(tmp_path: Path) -> None:
    """``verdict.busy_host_stop: 2`` stops after two such changes; 0 is refused with one line
    that names the key."""
    testbed = Busy(lambda config, n: config[RANK] != 64)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        runner = round_runner(ledger, testbed, CHANGES, prof=profile(busy_host_stop=2))
        with pytest.raises(BusyHost, match="the last 2 changes in a row"):
            runner.run(RoundOptions(budget=5, proposer="sweep", approve="auto"))
        assert len([e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]) == 2

    data = twin_profile_data(1)
    data.setdefault("verdict", {})["busy_host_stop"] = 0
    path = write_profile(tmp_path, data)
    env = {"ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/refused.db", "HOME": str(tmp_path)}
    done = orchestrate(tmp_path, "status", "--profile", str(path), env=env)
    assert done.returncode == 3, done.stderr
    assert "verdict.busy_host_stop: Input should be greater than or equal to 1" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_look_a_busy_host_left_undecided_is_no_look_at_its_value(tmp_path: Path) -> None:
    """K 7 → 5 on a busy host is left undecided and the round stops (``busy_host_stop: 1``).
    Resumed on a quiet host, K=5 is measured again as a first look, not a second: its record
    names no earlier look (``busy_host.looks_at``), and the knob's prior learned nothing from
    the host's reading."""
    quiet = False
    testbed = Busy(lambda config, n: not quiet and config != testbed.boots[0])
    prof = profile(busy_host_stop=1)
    options = RoundOptions(budget=2, proposer="sweep", approve="auto")
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        with pytest.raises(BusyHost):
            round_runner(ledger, testbed, [{K: 5}, *CHANGES], prof=prof).run(options)
        quiet = True
        round_runner(ledger, testbed, [{K: 5}, *CHANGES], prof=prof).run(options)
        held, again = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE][:2]
        assert (held.status, again.config.key) == ("inconclusive", held.config.key)
        assert "look after" not in (again.description or ""), again.description
        learned = [m.experiment for m in measured(ledger, ledger.experiments(), prof.cells)]
        assert held.id not in learned and again.id in learned, learned


def test_a_change_decided_on_a_busy_host_neither_counts_toward_the_stop_nor_ends_it(
    tmp_path: Path,
) -> None:
    """``busy_host_stop: 2``; every change's boots on a busy host. Rank 0 is left undecided;
    rank 16, −50 %, is discarded all the same (worse even at the most favourable reading its
    stalls allow): a decision was made, so it does not count toward the stop, and the host
    was not quiet, so it does not end the run. Rank 32, left undecided, makes two."""
    testbed = Busy(
        lambda config, n: config[RANK] != 64,
        speed=lambda config, n: 50.0 if config[RANK] == 16 else 100.0,
        stall=lambda config: 0.1 if config[RANK] == 16 else 3.0,
    )
    options = RoundOptions(budget=5, proposer="sweep", approve="auto")
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        runner = round_runner(ledger, testbed, CHANGES, prof=profile(busy_host_stop=2))
        with pytest.raises(BusyHost) as stopped:
            runner.run(options)
        changes = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        statuses = [(e.config[RANK], e.status) for e in changes]
        assert statuses == [(0, "inconclusive"), (16, "discard"), (32, "inconclusive")], statuses
        assert stopped.value.experiments == [changes[0].id, changes[2].id]


def test_the_stop_names_whose_host_stalled(tmp_path: Path) -> None:
    """The stop's line, and its record (``status --json``), name whose host stalled, as a
    cell's notice does: the engine's node (the twin reports its scheduler's stalls) or this
    machine, the client's."""
    options = RoundOptions(budget=5, proposer="sweep", approve="auto")
    for side, named, who, where in (
        ("engine_stall_s", "node-0", "the engine's host, node-0 (127.0.0.1)", "node-0"),
        ("client_stall_s", "client", "this machine (the client", "this machine"),
    ):
        testbed = Busy(lambda config, n: config[RANK] != 64, side=side)
        with Ledger(f"sqlite:///{tmp_path}/{side}.db") as ledger:
            runner = round_runner(ledger, testbed, CHANGES, prof=profile(busy_host_stop=1))
            with pytest.raises(BusyHost) as stopped:
                runner.run(options)
            said = str(stopped.value)
            assert f"the busy host was {who}" in said, said
            assert f"find what else runs on {where} " in said, said
            (change,) = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
            stop = last_stop(ledger, "scripted", change.round_id or 0)
            data = stop_data(stop)
            assert data is not None and data["busy_hosts"] == [named], data
