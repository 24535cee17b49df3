"""A node that fails for the infrastructure's reasons is not a verdict on the config: the boot
is taken again after the policy's backoff; if it keeps failing the round stops with exit 5,
the experiment undecided and nothing barred, and the same command resumes it. The testbed is
scripted (the real loop, ledger and verdict code run unchanged)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from agents import SweepProposer
from cluster.errors import DeployError, NodeError
from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import BootStatus, EventKind, FailureClass, Kind, State, Status
from ledger import Ledger, VerdictRecord
from ledger.mlflow_sink import MlflowSink
from orchestrator import policy
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.faults import InfrastructureFault
from orchestrator.profile_sections import VerdictSpec
from orchestrator.report import write_report
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.stops import last_stop
from orchestrator.testbed import NullSink, Sink
from tests.fixtures.cli import orchestrate
from tests.fixtures.mlflow_store import MlflowStore
from tests.test_round_policy import ScriptedTestbed, profile, scripted_cli

CHANGES = [{"num_speculative_tokens": 5}, {"num_speculative_tokens": 6}]


class FlakyNode(ScriptedTestbed):
    """Every config measures 100 tok/s; node 2 is unreachable on the deploys ``down`` names
    (1 is the first deploy), whatever the config."""

    def __init__(
        self, down: Callable[[int], bool], speed: Callable[[Config], float] = lambda c: 100.0
    ) -> None:
        super().__init__(lambda c, n: speed(c))
        self.down = down
        self.attempts = 0

    def deploy(self, config: Config) -> dict[int, str]:
        self.attempts += 1
        if self.down(self.attempts):
            raise DeployError(
                "node-2: ssh: connection refused", failure_class="unreachable", rank=2, host="n2"
            )
        return super().deploy(config)


def runner(
    tmp_path: Path,
    testbed: ScriptedTestbed,
    waits: list[float],
    said: io.StringIO | None = None,
    *,
    sink: Sink | None = None,
    **verdict: object,
) -> RoundRunner:
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    return RoundRunner(
        profile(**{"infra_retries": 2, "infra_backoff_s": 10, **verdict}),
        ledger,
        sink or NullSink(),
        testbed,
        SweepProposer(CHANGES),
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=said or io.StringIO(), width=200)),
        sleep=waits.append,
    )


def test_the_backoff_doubles_and_the_retries_end() -> None:
    spec = VerdictSpec(infra_retries=2, infra_backoff_s=10)
    assert [policy.infrastructure_retry(spec, n) for n in (1, 2, 3)] == [10.0, 20.0, None]
    assert policy.infrastructure_retry(VerdictSpec(infra_retries=0), 1) is None
    # the defaults ride out a node's reboot (about 25 minutes), each wait at most 10 minutes
    default = [policy.infrastructure_retry(VerdictSpec(), n) for n in range(1, 8)]
    assert default == [30.0, 60.0, 120.0, 240.0, 480.0, 600.0, None]


def test_a_node_back_after_a_retry_costs_no_verdict(tmp_path: Path) -> None:
    # the first candidate's first deploy (the baseline's second came before the first proposal)
    testbed = FlakyNode(lambda attempt: attempt == 3)
    waits: list[float] = []
    loop = runner(tmp_path, testbed, waits)
    report = loop.run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    assert waits == [10.0]
    assert [e.status for e in report.experiments] == [Status.KEEP, Status.DISCARD, Status.DISCARD]
    first = report.experiments[1]
    assert [(b.status, b.failure_class) for b in loop.ledger.boots(first.id)][:2] == [
        (BootStatus.FAILED, "unreachable"),
        (BootStatus.DOWN, None),
    ]
    # the ledger records the node it failed on, whatever its message says
    assert (first_boots := loop.ledger.boots(first.id))[0].failed_rank == 2
    assert first_boots[0].failed_host == "n2" and first_boots[1].failed_rank is None
    # the morning's page names the failure, its node and how often
    written = write_report(loop.profile, loop.ledger, out=tmp_path / "report")
    html = written.page.read_text()
    assert "<li>unreachable: node-2: ssh: connection refused (×1)</li>" in html
    loop.ledger.close()
    # and ``orchestrate status`` counts each node's failures, as it counts its clocks
    profile_file, env = scripted_cli(tmp_path, nodes=3)
    shown = orchestrate(tmp_path, "status", "--profile", str(profile_file), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert [n["infrastructure_failures"] for n in data["nodes"]] == [{}, {}, {"unreachable": 1}]
    assert data["infrastructure_failures_without_node"] == 0
    text = orchestrate(tmp_path, "status", "--profile", str(profile_file), env=env)
    said = " ".join(text.stdout.split())
    host = data["nodes"][2]["host"]
    assert f"node-2 ({host}): 1 boot(s) failed for the node's reasons, not a config's: " in said
    assert "unreachable ×1" in said and "node-0 (" not in said


def test_a_measurement_on_a_boot_after_a_failed_one_is_two_boots_one_failed(
    tmp_path: Path, mlflow_db: MlflowStore
) -> None:
    """The change's first boot found node 2 unreachable, its second measured it: the round's
    line, its MLflow run and the report count two boots, one failed, from the ledger's boot
    rows (not the one measurement the verdict weighs)."""
    testbed = FlakyNode(lambda attempt: attempt == 3)  # the first candidate's first deploy
    said = io.StringIO()
    loop = runner(tmp_path, testbed, [], said, sink=MlflowSink())
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    change = report.experiments[1]
    assert [b.status for b in loop.ledger.boots(change.id)] == [
        BootStatus.FAILED,
        BootStatus.DOWN,
    ]
    # its decided line: the change took two boots, the verdict weighed one measurement
    text = " ".join(said.getvalue().split())
    decided = text.split(f" #{change.id} ")[1].split(" #")[0]
    said_both = "; 2 boot(s) paid for 1 measurement(s), failed: unreachable ×1"
    assert decided.endswith(said_both), decided
    assert change.mlflow_run_id is not None
    metrics = MlflowClient(mlflow_db.tracking_uri).get_run(change.mlflow_run_id).data.metrics
    assert (metrics["boots"], metrics["failed_boots"]) == (2, 1)
    html = write_report(loop.profile, loop.ledger, out=tmp_path / "report").page.read_text()
    # its row and its knob value's: two boots, one failed
    assert html.count('<td class="n">2 (1 failed)</td>') == 2
    loop.ledger.close()


class LostWhileBenched(FlakyNode):
    """On the deploys ``lost`` names, the head stops answering once it is up: its cell fails
    (the bench client's ``bench_failed``, a configuration class) and its teardown finds it
    unreachable."""

    def __init__(self, lost: Callable[[int], bool]) -> None:
        super().__init__(lambda attempt: False)
        self.lost = lost

    def bench(self, cell: CellSpec) -> CellResultRecord:
        if self.lost(self.attempts):
            raise NodeError("bench cell c failed: ReadError", failure_class="bench_failed")
        return super().bench(cell)

    def stop_all(self) -> None:
        super().stop_all()
        if self.lost(self.attempts):
            raise DeployError("node-0: no SSH banner", failure_class="unreachable", rank=0)


def test_a_bench_failure_on_a_node_lost_by_its_teardown_is_the_nodes(tmp_path: Path) -> None:
    """A cell that failed on a head that its teardown then found unreachable failed because
    the node was lost, not for the config: the boot is recorded as ``unreachable`` and taken
    again; the change is decided on the boot after it, with nothing barred."""
    testbed = LostWhileBenched(lambda attempt: attempt == 3)
    waits: list[float] = []
    loop = runner(tmp_path, testbed, waits)
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert waits == [10.0]
    first = report.experiments[1]
    assert first.status == Status.DISCARD
    boots = loop.ledger.boots(first.id)
    assert [(b.status, b.failure_class) for b in boots] == [
        (BootStatus.FAILED, "unreachable"),
        (BootStatus.DOWN, None),
    ]
    assert boots[0].failure_detail == (
        "node-0: no SSH banner; before it, the boot had failed: bench_failed: bench cell c "
        "failed: ReadError"
    )
    loop.ledger.close()


def test_a_node_that_stays_away_stops_the_round_undecided_and_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    node = {"back": False}
    testbed = FlakyNode(lambda attempt: attempt >= 2 and not node["back"])
    waits: list[float] = []
    loop = runner(tmp_path, testbed, waits)
    with pytest.raises(InfrastructureFault) as stopped:
        loop.run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    assert stopped.value.exit_code == 5
    assert "node 2 (n2): unreachable 3 times in a row" in stopped.value.message
    assert waits == [10.0, 20.0]  # two retries, then the stop
    ledger = loop.ledger
    candidate = ledger.experiments()[1]
    assert candidate.state != State.DECIDED and candidate.status is None
    assert stopped.value.experiment == candidate.id
    assert loop.context(ledger.rounds("scripted")[-1]).known_bad == ()  # nothing barred
    assert ledger.unfinished_round("scripted") is not None
    # recorded for the morning's ``status``: the line the command ended with
    (stop,) = ledger.events("scripted", EventKind.ROUND_STOPPED)
    assert stop.subject == str(ledger.rounds("scripted")[-1].id)
    assert stop.reason == stopped.value.message
    assert stop.detail == {
        "error": "InfrastructureFault",
        "node": "node-2",
        "failure_class": "unreachable",
        "exit_code": 5,
    }
    assert last_stop(ledger, "scripted", int(stop.subject)) == stop
    ledger.close()

    # the node is back: the same command resumes the experiment and finishes the budget
    node["back"] = True
    said = io.StringIO()
    again = runner(tmp_path, testbed, waits, said)
    resumed = again.run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    assert resumed.resumed and resumed.stopped_by == "budget"
    # the resume says why the round had stopped; once it booted, that is old news
    assert f"(exit 5): {stopped.value.message}" in " ".join(said.getvalue().split())
    assert last_stop(again.ledger, "scripted", resumed.round.id) is None
    decided = [e for e in resumed.experiments if e.kind == Kind.CANDIDATE]
    assert [e.status for e in decided] == [Status.DISCARD, Status.DISCARD]
    assert decided[0].id == candidate.id
    again.ledger.close()


#: Crash verdicts as older releases wrote them: the class and detail stored, whether the value
#: is barred as this release reads them.
OLD_CRASHES = [
    ("unreachable", "node-2: ssh: connection refused", False),
    # a preflight gate's, before it had a class of its own (``preflight_failed``)
    (
        "gate_failed",
        "failed twice: gate_failed, gate_failed; node-0: only 23323 MiB free after settling "
        "(the gate wants 104000)",
        False,
    ),
    ("gate_failed", "node-1: 10.0.0.2 is not on enP7s7 (which has 10.0.0.3): wrong rank?", False),
    # a boot-log gate's: the config's, barred as it was
    (
        "gate_failed",
        "failed twice: gate_failed, gate_failed; node-0: boot log has a forbidden line: "
        "'falling back to eager mode: MiB free after settling'",
        True,
    ),
]


@pytest.mark.parametrize(("failure_class", "detail", "barred"), OLD_CRASHES)
def test_an_old_ledgers_infrastructure_crash_bars_nothing(
    tmp_path: Path, failure_class: FailureClass, detail: str, barred: bool
) -> None:
    """A ledger written before such failures stopped the round has them as crash verdicts:
    they bar no value and do not count as decided. So has one written before a preflight
    gate's failure was the infrastructure's: it is read as such (``read_failure_class``)."""
    testbed = FlakyNode(lambda attempt: False)
    loop = runner(tmp_path, testbed, [])
    loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    ledger = loop.ledger
    rnd = ledger.rounds("scripted")[-1]
    champion = ledger.champion("scripted")
    assert champion is not None
    change = loop.profile.space.change(champion.config, "num_speculative_tokens", 4)
    e = ledger.add_experiment(
        cluster="scripted",
        round_id=rnd.id,
        kind=Kind.CANDIDATE,
        config=champion.config.apply(change),
        champion_key=champion.config.key,
        champion_objective=champion.objective,
        knob="num_speculative_tokens",
        value=4,
    )
    crash = policy.crash(failure_class, detail)
    ledger.decide(
        e.id,
        verdict=VerdictRecord(
            status=crash.status, rule=crash.rule, reason=crash.reason, stats=crash.stats
        ),
        objective=None,
        delta_pct=None,
        accept_len=None,
        failure_class=failure_class,
        failure_detail=detail,
    )
    context = loop.context(rnd)
    assert [bad.when for bad in context.known_bad] == (
        [{"num_speculative_tokens": 4}] if barred else []
    )
    assert (champion.config.apply(change).key in context.decided_keys) == barred
    ledger.close()


def test_a_resume_says_what_it_keeps_that_the_command_asked_otherwise(tmp_path: Path) -> None:
    node = {"back": False}
    testbed = FlakyNode(lambda attempt: attempt >= 2 and not node["back"])
    with pytest.raises(InfrastructureFault):
        runner(tmp_path, testbed, []).run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    node["back"] = True
    said = io.StringIO()
    # another budget, seed and profile (its noise prior changed) than the round started with
    again = runner(tmp_path, testbed, [], said, noise={"boot_to_boot": 0.03, "run_to_run": 0.01})
    again.run(RoundOptions(budget=5, proposer="sweep", approve="auto", seed=7))
    text = " ".join(said.getvalue().split())
    assert "keeps its budget 2 (this command asked for 5)" in text
    assert "started with seed 0; this command's 7 runs it from here" in text
    assert "started with proposer" not in text  # what was asked the same is not mentioned
    assert "the profile changed since round 1 started" in text
    assert len([e for e in again.ledger.experiments() if e.kind == Kind.CANDIDATE]) == 2
    again.ledger.close()


def test_the_champion_unreachable_for_a_confirmation_leaves_the_candidate_undecided(
    tmp_path: Path,
) -> None:
    # K=5 measures +30 %: the confirmation wants the champion measured again (the fourth
    # deploy: the baseline's second came before the first proposal), and node 2 is gone from
    # then on
    testbed = FlakyNode(
        lambda attempt: attempt >= 4,
        speed=lambda c: 130.0 if c["num_speculative_tokens"] == 5 else 100.0,
    )
    waits: list[float] = []
    loop = runner(tmp_path, testbed, waits)
    with pytest.raises(InfrastructureFault) as stopped:
        loop.run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    baseline, candidate = loop.ledger.experiments()
    assert waits == [10.0, 20.0]
    assert stopped.value.experiment == candidate.id and candidate.status is None
    assert f"experiment #{candidate.id} is left undecided" in stopped.value.message
    champion_boots = loop.ledger.boots(baseline.id)
    assert [b.failure_class for b in champion_boots] == [
        None,
        None,
        "unreachable",
        "unreachable",
        "unreachable",
    ]
    loop.ledger.close()


class Hours:
    """A clock the round reads: each reading is an hour after the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 3600.0
        return self.now


def test_max_hours_is_kept_with_the_round_and_a_stop_by_it_says_so(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")

    def runner_at(said: io.StringIO) -> RoundRunner:
        return RoundRunner(
            profile(),
            ledger,
            NullSink(),
            ScriptedTestbed(lambda c, n: 100.0),
            SweepProposer(CHANGES),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=said, width=200)),
            clock=Hours(),
        )

    said = io.StringIO()
    # each look at the clock is an hour on: the first experiment starts within 1.5 hours,
    # the second does not
    first = runner_at(said).run(
        RoundOptions(budget=2, proposer="sweep", approve="auto", max_hours=1.5)
    )
    assert first.stopped_by == "max-hours" and first.round.status == "running"
    assert first.round.max_hours == 1.5
    text = " ".join(said.getvalue().split())
    assert "stopped by --max-hours 1.5: 1 of 2 experiments done" in text
    assert "the same command resumes it" in text
    # a resume without --max-hours keeps the round's cap, counted from its own start
    said = io.StringIO()
    again = runner_at(said).run(RoundOptions(budget=2, proposer="sweep", approve="auto"))
    assert "keeps its --max-hours 1.5, counted from now" in " ".join(said.getvalue().split())
    assert again.stopped_by == "budget" and again.round.status == "done"
    assert again.round.max_hours == 1.5
    ledger.close()


def test_a_resume_given_max_hours_takes_it_and_keeps_it(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    rnd = ledger.create_round(
        cluster="c",
        profile_name="p",
        profile_digest="d",
        budget=2,
        proposer="sweep",
        approve="auto",
        seed=0,
    )
    assert rnd.max_hours is None
    ledger.set_round_max_hours(rnd.id, 3.0)
    assert ledger.round(rnd.id).max_hours == 3.0
    ledger.close()
