"""A failure that follows the config bars its value only when it reproduces (issue #17): a
flaky start is booted once more and measured, a bad flag fails twice and is a crash, a class
the knob declares monotone (an OOM above a memory fraction) bars at once. A port another
process holds is the host's (``port_in_use``): retried, then the round stops with exit 5 and
nothing barred. The rounds run on a scripted testbed (the real loop, ledger and verdict code);
the port clash also on real twin engines."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agents import SweepProposer
from cluster.bench import cold_start_limit_s
from cluster.errors import DeployError, NodeError
from cluster.gates import GateSpec
from cluster.launcher import LOG, PIDFILE
from knobs.config import Config
from knobs.errors import ProfileError
from knobs.vocabulary import (
    INFRASTRUCTURE,
    BootStatus,
    EventKind,
    FailureClass,
    Kind,
    State,
    Status,
    cut_short,
)
from ledger import Ledger
from orchestrator import policy
from orchestrator.approval import ApprovalGate
from orchestrator.baseline import BaselineFailed
from orchestrator.display import RoundDisplay
from orchestrator.faults import ChampionFailing, InfrastructureFault
from orchestrator.policy import BootCandidate, BootChampion, BootFailure, Crash, Progress
from orchestrator.profile import load_profile
from orchestrator.profile_sections import VerdictSpec
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import ClusterTestbed, NullSink, deployer_for, round_testbed
from tests.fixtures.profiles import small_twin_profile_data, twin_profile_data, write_profile
from tests.test_policy import measured, never
from tests.test_round_policy import ScriptedTestbed, profile
from tests.twin_fixtures import TwinNodes, running_nodes, serve_argv

K5 = [{"num_speculative_tokens": 5}]


class Failing(ScriptedTestbed):
    """Every config measures 100 tok/s, but deploy ``n`` (1 is the baseline's) fails with the
    class ``fails(n, config)`` names; ``interrupt(n)``: deploy ``n`` is killed (Ctrl-C)."""

    def __init__(
        self,
        fails: Callable[[int, Config], FailureClass | None],
        interrupt: Callable[[int], bool] = lambda n: False,
    ) -> None:
        super().__init__(lambda c, n: 100.0)
        self.fails = fails
        self.interrupt = interrupt
        self.attempts = 0
        #: every config a deploy was asked for, failed or not (``boots``: those that came up)
        self.tried: list[Config] = []

    def deploy(self, config: Config) -> dict[int, str]:
        self.attempts += 1
        self.tried.append(config)
        if self.interrupt(self.attempts):
            raise KeyboardInterrupt
        cls = self.fails(self.attempts, config)
        if cls is not None:
            raise DeployError(
                f"node-0: engine exited within 5s of its start ({cls})",
                failure_class=cls,
                rank=0,
                host="n0",
            )
        return super().deploy(config)


def runner(
    tmp_path: Path,
    testbed: ScriptedTestbed,
    said: io.StringIO | None = None,
    changes: list[dict[str, object]] | None = None,
    waits: list[float] | None = None,
) -> RoundRunner:
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    return RoundRunner(
        profile(infra_retries=2, infra_backoff_s=10),
        ledger,
        NullSink(),
        testbed,
        SweepProposer(changes or K5),  # type: ignore[arg-type]
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=said or io.StringIO(), width=300)),
        sleep=(waits if waits is not None else []).append,
    )


def regions(loop: RoundRunner) -> set[str]:
    return {r.region() for r in loop.context(loop.ledger.rounds("scripted")[-1]).known_bad}


# ---- the rule, as policy ------------------------------------------------------------------


def test_a_configuration_failure_counts_once_it_reproduces_or_at_once_when_monotone() -> None:
    start = BootFailure("start", "node-0: engine exited")
    assert policy.config_failure([start], monotone=()) is None
    twice = policy.config_failure([start, start], monotone=())
    assert twice is not None and twice.status == Status.CRASH
    assert twice.reason == "failed twice: start, start; node-0: engine exited"
    assert twice.stats == {"failure_class": "start", "failed_boots": 2}
    oom = policy.config_failure([BootFailure("oom", "OOM")], monotone={"oom"})
    assert oom is not None and oom.reason == "OOM" and oom.stats == {"failure_class": "oom"}


def test_the_policy_boots_a_first_failure_again_and_crashes_a_second() -> None:
    failed = BootFailure("start", "bad")
    unfinished = measured(0)
    unfinished.complete, unfinished.cells = False, []
    once = Progress(
        baseline=False,
        measurements=[unfinished],
        min_matmul_rate=0.9,
        failed_boots=[failed],
        last_failed=True,
    )
    action = policy.next_action(VerdictSpec(), once, never)
    assert isinstance(action, BootCandidate) and action.measurement == 0
    assert action.note is not None and "only when it reproduces" in action.note
    twice = Progress(
        baseline=False,
        measurements=[unfinished],
        min_matmul_rate=0.9,
        failed_boots=[failed, failed],
        last_failed=True,
    )
    # the champion first: it must still boot for the failure to be the change's
    check = policy.next_action(VerdictSpec(), twice, never)
    assert isinstance(check, BootChampion) and check.checks is not None
    assert check.checks.status == Status.CRASH and check.phase == policy.CHAMPION_CHECK
    booted = Progress(**{**twice.__dict__, "champion_measured_after": True})
    assert isinstance(policy.next_action(VerdictSpec(), booted, never), Crash)
    # the baseline has no champion to boot; a class the knob declares monotone is its own
    baseline = Progress(**{**twice.__dict__, "baseline": True})
    assert isinstance(policy.next_action(VerdictSpec(), baseline, never), Crash)
    monotone = Progress(**{**twice.__dict__, "monotone": {"start"}})
    assert isinstance(policy.next_action(VerdictSpec(), monotone, never), Crash)


# ---- the rule, in a round -----------------------------------------------------------------


def test_a_flaky_start_is_booted_again_measured_and_bars_nothing(tmp_path: Path) -> None:
    said = io.StringIO()
    # deploy 3, the candidate's first (the baseline's second came before the first proposal)
    loop = runner(tmp_path, Failing(lambda n, c: "start" if n == 3 else None), said)
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    candidate = report.experiments[1]
    assert candidate.status == Status.DISCARD and candidate.failure_class is None
    boots = loop.ledger.boots(candidate.id)
    # the failed boot and the one after are one measurement: the failure is not a measurement
    assert [(b.status, b.failure_class, b.measurement) for b in boots[:2]] == [
        (BootStatus.FAILED, "start", 0),
        (BootStatus.DOWN, None, 0),
    ]
    verdict = loop.ledger.verdict(candidate.id)
    assert verdict is not None and verdict.stats["failed_boots"] == 1
    assert "1 failed boot(s) before (start), not reproduced" in verdict.reason
    assert "bars its value only when it reproduces: booting the same config once more" in (
        " ".join(said.getvalue().split())
    )
    assert regions(loop) == set()
    loop.ledger.close()


def test_a_start_failure_that_reproduces_is_a_crash_and_bars_the_value(tmp_path: Path) -> None:
    testbed = Failing(lambda n, c: "start" if c["num_speculative_tokens"] == 5 else None)
    loop = runner(tmp_path, testbed)
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    candidate = report.experiments[1]
    assert candidate.status == Status.CRASH and candidate.failure_class == "start"
    assert [b.status for b in loop.ledger.boots(candidate.id)] == [BootStatus.FAILED] * 2
    verdict = loop.ledger.verdict(candidate.id)
    assert verdict is not None and verdict.reason.startswith("failed twice: start, start; node-0")
    assert regions(loop) == {"num_speculative_tokens=5"}
    loop.ledger.close()


def test_a_failure_that_reproduces_bars_its_value_once_the_champion_still_boots(
    tmp_path: Path,
) -> None:
    """The champion is booted between the change's second failure and its crash verdict: it
    comes up, so the failure is the change's."""
    testbed = Failing(lambda n, c: "start" if c["num_speculative_tokens"] == 5 else None)
    loop = runner(tmp_path, testbed)
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    baseline, candidate = report.experiments
    assert candidate.status == Status.CRASH
    # deploys: the baseline's two, the change's two (failed), then the champion's check
    assert [c["num_speculative_tokens"] for c in testbed.boots[2:]] == [7]
    assert testbed.attempts == 5
    champion = loop.ledger.boots(baseline.id)
    assert champion[-1].status == BootStatus.DOWN
    assert champion[-1].started_at > loop.ledger.boots(candidate.id)[-1].started_at
    assert regions(loop) == {"num_speculative_tokens=5"}
    loop.ledger.close()


def test_a_cluster_that_breaks_after_the_baseline_stops_the_round_and_bars_nothing(
    tmp_path: Path,
) -> None:
    """Every boot after the baseline's fails for what looks like the config's reason (a node's
    disk full, its GPU wedged: the engine exits at start), the champion's too: the change
    failed twice, then the champion that booted before fails twice in a row, so the round
    stops (exit 5) with the change undecided and nothing barred, where before each change of
    the night was booted three times and decided inconclusive. Mended, the same command boots
    the champion, then the change afresh (its failures were the cluster's), and decides it."""
    said = io.StringIO()
    cluster = {"broken": True}
    testbed = Failing(lambda n, c: "start" if n > 2 and cluster["broken"] else None)
    loop = runner(tmp_path, testbed, said)
    with pytest.raises(ChampionFailing) as stopped:
        loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert stopped.value.exit_code == 5
    message = stopped.value.message
    assert message.startswith("the champion (experiment #1), which booted before, failed 2 ")
    assert "(start, start; node-0: engine exited" in message
    assert "experiment #2 is left undecided and nothing was barred" in message
    _, candidate = loop.ledger.experiments()
    assert candidate.state != State.DECIDED and candidate.status is None
    # deploys: the baseline's two, the change's two, the champion's two (the second the
    # first's reproduction), then the stop
    assert [c["num_speculative_tokens"] for c in testbed.tried] == [7, 7, 5, 5, 7, 7]
    assert regions(loop) == set()
    text = " ".join(said.getvalue().split())
    assert policy.CHAMPION_CHECK in text
    assert "the champion (experiment #1), which booted before, failed (start" in text
    assert "booting it once more" in text
    loop.ledger.close()

    cluster["broken"] = False
    again = runner(tmp_path, testbed)
    report = again.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert report.resumed
    decided = again.ledger.experiment(candidate.id)
    assert decided.status == Status.DISCARD and decided.failure_class is None
    # the champion first (its check), then the change afresh
    assert [c["num_speculative_tokens"] for c in testbed.tried[6:8]] == [7, 5]
    assert regions(again) == set()
    again.ledger.close()


def test_a_night_that_starts_on_a_broken_cluster_stops_before_any_change_boots(
    tmp_path: Path,
) -> None:
    """The next night's round re-measures the champion first (it is due); the cluster broke
    in between, so the champion fails, is booted once more, fails again, and the round stops
    (exit 5) before any change is proposed or booted on it. Mended, the same command runs the
    round to its budget."""
    cluster = {"broken": False}
    two: list[dict[str, object]] = [{"num_speculative_tokens": 5}, {"num_speculative_tokens": 6}]
    testbed = Failing(lambda n, c: "start" if cluster["broken"] else None)
    first = runner(tmp_path, testbed, changes=two)
    first.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    first.ledger.close()
    booted = len(testbed.tried)

    cluster["broken"] = True
    night = runner(tmp_path, testbed, changes=two)
    with pytest.raises(ChampionFailing) as stopped:
        night.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert stopped.value.experiment is None
    assert "failed 2 times in a row (start, start;" in stopped.value.message
    assert "no change is left undecided and nothing was barred" in stopped.value.message
    assert [c["num_speculative_tokens"] for c in testbed.tried[booted:]] == [7, 7]
    rnd = night.ledger.unfinished_round("scripted")
    assert rnd is not None and night.ledger.experiments(round_id=rnd.id) == []
    night.ledger.close()

    cluster["broken"] = False
    mended = runner(tmp_path, testbed, changes=two)
    report = mended.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert report.resumed and report.stopped_by == "budget"
    mended.ledger.close()


def test_a_champion_that_fails_once_is_booted_again_and_the_change_afresh(
    tmp_path: Path,
) -> None:
    """The change failed twice; the champion's check boot fails, its next comes up: the
    cluster had a bad moment, so the change's two failures, made before it, do not bar its
    value: it is booted afresh, and fails twice again, and its crash then stands on a cluster
    that boots its champion."""
    champion_boots = {"n": 0}

    def fails(n: int, c: Config) -> FailureClass | None:
        if c["num_speculative_tokens"] == 5:
            return "start"
        if n > 2:
            champion_boots["n"] += 1
            return "start" if champion_boots["n"] == 1 else None
        return None

    testbed = Failing(fails)
    loop = runner(tmp_path, testbed)
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    candidate = report.experiments[1]
    assert candidate.status == Status.CRASH
    assert [c["num_speculative_tokens"] for c in testbed.tried] == [7, 7, 5, 5, 7, 7, 5, 5, 7]
    assert regions(loop) == {"num_speculative_tokens=5"}
    loop.ledger.close()


def test_an_oom_another_knob_declares_monotone_bars_only_once_it_reproduced(
    tmp_path: Path,
) -> None:
    """K 7 → 5 runs out of memory once (memory a leftover process still held: what a profile
    without a memory gate cannot tell from the config): the memory fraction declares OOM
    monotone, but K, the knob moved, does not, so the change is booted again, comes up and is
    judged; nothing is barred. Before, the first OOM barred K 5 at that memory fraction and
    above at once. When the OOM reproduces (and the champion still boots), it is barred so."""
    once = Failing(lambda n, c: "oom" if n == 3 else None)
    loop = runner(tmp_path, once)
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    candidate = report.experiments[1]
    assert candidate.status == Status.DISCARD
    assert [(b.status, b.failure_class) for b in loop.ledger.boots(candidate.id)][:2] == [
        (BootStatus.FAILED, "oom"),
        (BootStatus.DOWN, None),
    ]
    assert regions(loop) == set()
    loop.ledger.close()

    (tmp_path / "always").mkdir()
    always = Failing(lambda n, c: "oom" if c["num_speculative_tokens"] == 5 else None)
    again = runner(tmp_path / "always", always)
    report = again.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert report.experiments[1].status == Status.CRASH
    # the change twice, then the champion's check boot
    assert [c["num_speculative_tokens"] for c in always.tried[2:]] == [5, 5, 7]
    assert regions(again) == {"num_speculative_tokens=5, gpu_memory_utilization>=0.85"}
    again.ledger.close()


def test_a_monotone_oom_bars_its_side_at_once(tmp_path: Path) -> None:
    # the catalog's gpu_memory_utilization declares oom monotone upwards
    testbed = Failing(lambda n, c: "oom" if c["gpu_memory_utilization"] == 0.9 else None)
    loop = runner(tmp_path, testbed, changes=[{"gpu_memory_utilization": 0.9}])
    report = loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    candidate = report.experiments[1]
    assert candidate.status == Status.CRASH and candidate.failure_class == "oom"
    assert [b.status for b in loop.ledger.boots(candidate.id)] == [BootStatus.FAILED]
    assert regions(loop) == {"gpu_memory_utilization>=0.9"}
    loop.ledger.close()


def test_a_kill_during_the_second_boot_resumes_counting_the_first_failure(
    tmp_path: Path,
) -> None:
    # deploys 1 and 2 are the baseline's; deploy 3 fails (start), deploy 4 (its second boot)
    # is killed, deploy 5 fails again
    testbed = Failing(lambda n, c: "start" if n in (3, 5) else None, interrupt=lambda n: n == 4)
    first = runner(tmp_path, testbed)
    with pytest.raises(KeyboardInterrupt):
        first.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    # an interrupt (Ctrl-C, a service manager's SIGTERM) is recorded as the round's stop too
    (stop,) = first.ledger.events("scripted", EventKind.ROUND_STOPPED)
    assert stop.detail == {"error": "Ctrl-C", "exit_code": 130}
    assert stop.reason == "interrupted by Ctrl-C; run the same command again to resume"
    first.ledger.close()
    again = runner(tmp_path, testbed)
    report = again.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert report.resumed
    candidate = report.experiments[1]
    assert candidate.status == Status.CRASH
    boots = again.ledger.boots(candidate.id)
    assert [(b.status, b.failure_class) for b in boots] == [
        (BootStatus.FAILED, "start"),
        (BootStatus.DOWN, None),  # the killed boot, closed by the resume: not a failure
        (BootStatus.FAILED, "start"),
    ]
    verdict = again.ledger.verdict(candidate.id)
    assert verdict is not None and verdict.reason.startswith("failed twice: start, start")
    again.ledger.close()


class Erring(Failing):
    """Deploy ``n`` raises an error of orchestrate's (a launcher that does not render), after
    which the boot is torn down as any is."""

    def __init__(self, n: int) -> None:
        super().__init__(lambda k, c: None)
        self.n = n

    def deploy(self, config: Config) -> dict[int, str]:
        if self.attempts + 1 == self.n:
            self.attempts += 1
            raise ProfileError("launcher of node-0: unknown placeholder {nope}")
        return super().deploy(config)


def test_a_boot_an_error_of_ours_stopped_is_closed_with_that_error_not_as_interrupted(
    tmp_path: Path,
) -> None:
    """An error of ours mid-boot stops the round; its boot, torn down, is closed with the
    error (``experiments show`` says what stopped it), not as a run interrupted or killed."""
    loop = runner(tmp_path, Erring(3))  # deploys 1 and 2 are the baseline's
    with pytest.raises(ProfileError):
        loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    candidate = loop.ledger.experiments(cluster="scripted")[-1]
    (boot,) = loop.ledger.boots(candidate.id)
    assert (boot.status, boot.failure_class) == (BootStatus.DOWN, None)
    assert boot.failure_detail == "error: launcher of node-0: unknown placeholder {nope}"
    assert cut_short(boot.failure_detail) == (
        "cut short: an error of orchestrate's stopped the run: launcher of node-0: unknown "
        "placeholder {nope}"
    )
    loop.ledger.close()


def test_the_baseline_gets_one_more_boot_too(tmp_path: Path) -> None:
    (tmp_path / "flaky").mkdir()
    flaky = runner(tmp_path / "flaky", Failing(lambda n, c: "start" if n == 1 else None))
    report = flaky.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    baseline = report.experiments[0]
    assert baseline.kind == Kind.BASELINE and baseline.status == Status.KEEP
    verdict = flaky.ledger.verdict(baseline.id)
    assert verdict is not None and verdict.stats["failed_boots"] == 1
    flaky.ledger.close()

    (tmp_path / "broken").mkdir()
    broken = runner(tmp_path / "broken", Failing(lambda n, c: "start"))
    with pytest.raises(BaselineFailed, match=r"\(start: failed twice: start, start;"):
        broken.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    broken.ledger.close()


def test_a_port_clash_is_retried_then_stops_the_round_with_nothing_barred(
    tmp_path: Path,
) -> None:
    assert "port_in_use" in INFRASTRUCTURE
    waits: list[float] = []
    testbed = Failing(lambda n, c: "port_in_use" if n >= 2 else None)
    loop = runner(tmp_path, testbed, waits=waits)
    with pytest.raises(InfrastructureFault) as stopped:
        loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert stopped.value.exit_code == 5
    assert "node 0 (n0): port_in_use 3 times in a row" in stopped.value.message
    # it says what the same command waits for, and offers no veto: a taken port fails every
    # change alike, and a veto would bar a value for the node's fault
    assert "once the cluster's port is free on the node" in stopped.value.message
    assert "once the node is back" not in stopped.value.message
    assert "experiments veto" not in stopped.value.message
    assert waits == [10.0, 20.0]
    candidate = loop.ledger.experiments()[1]
    assert candidate.status is None
    assert regions(loop) == set()
    loop.ledger.close()


# ---- the port clash on real twin engines --------------------------------------------------


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[TwinNodes]:
    with running_nodes(tmp_path) as started:
        yield started


def test_a_twin_engine_whose_port_is_taken_says_so_as_a_real_one_does(
    nodes: TwinNodes,
) -> None:
    patterns = GateSpec().failure_patterns["port_in_use"]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        engine = nodes.start(serve_argv(port=port), name="clash")
        assert engine.wait_exit(60) == 1
    line = engine.wait_for(r"Address already in use").string
    assert f"OSError: [Errno 98] could not bind 127.0.0.1:{port}" in line
    assert any(re.search(p, line, re.IGNORECASE) for p in patterns)
    # a bad flag's own line is none of them: it stays `start`
    bad = nodes.start(["/m", "--no-such-flag"], name="bad-flag")
    assert bad.wait_exit(60) != 0
    assert not any(re.search(p, bad.log, re.IGNORECASE) for p in patterns)


def deploy_failure(tmp_path: Path, data: dict[str, object], hold: bool) -> DeployError:
    """Deploy the four-node twin profile ``data`` on this machine; its failure."""
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    deployer = deployer_for(prof)
    try:
        with socket.socket() as held:
            if hold:
                # bound, not listening yet, as a foreign vLLM is while it loads its model: the
                # ports preflight cannot see it, the engine's own bind does
                held.bind(("127.0.0.1", prof.cluster.port))
            with pytest.raises(DeployError) as failed:
                deployer.deploy(prof.initial_champion())
        return failed.value
    finally:
        deployer.teardown()
        deployer.close()


def test_a_deploy_onto_a_taken_port_is_port_in_use_naming_the_node_and_port(
    tmp_path: Path,
) -> None:
    data = twin_profile_data()
    err = deploy_failure(tmp_path, data, hold=True)
    assert err.failure_class == "port_in_use"
    port = data["cluster"]["port"]
    assert err.message.startswith(f"node-0: port {port} on 127.0.0.1 is in use, engine exited")
    assert "Address already in use" in err.message


def test_a_port_auto_cluster_whose_kept_pair_is_taken_is_told_how_to_choose_again(
    tmp_path: Path,
) -> None:
    """``port: auto`` chose its pair once and keeps it (``cluster.ports``): the line that
    refuses a taken port tells such a cluster how to choose again, not to say ``port: auto``,
    which it says already (the review's busy-port night)."""
    data = twin_profile_data(nodes=2)
    data["cluster"]["port"] = "auto"
    del data["cluster"]["master_port"]
    head = tmp_path / "nodes" / "node-0"
    head.mkdir(parents=True)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        (head / "cluster.ports").write_text(f"{port} {port + 1}\n")
        prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
        assert prof.cluster.port == port
        deployer = deployer_for(prof)
        try:
            with pytest.raises(DeployError) as failed:
                deployer.deploy(prof.initial_champion())
        finally:
            deployer.teardown()
            deployer.close()
    assert failed.value.failure_class == "port_in_use"
    assert f"port {port} on 127.0.0.1 is in use" in failed.value.message
    assert failed.value.message.endswith(
        f"delete {head / 'cluster.ports'} so that port: auto chooses a free pair again"
    )


@pytest.mark.parametrize("stop", [BrokenPipeError, KeyboardInterrupt], ids=["pipe", "ctrl-c"])
def test_an_error_of_orchestrates_own_or_ctrl_c_mid_boot_leaves_no_engine_up(
    tmp_path: Path, stop: type[BaseException]
) -> None:
    """A deploy stopped by what is no boot's failure — the progress line a terminal piped to
    ``head`` can no longer take, or Ctrl-C in `cluster up` — once the engines are up tears
    every node down before it goes on: nothing is left half up, and the progress that failed
    is not asked again on the way out."""
    prof = load_profile(str(write_profile(tmp_path, twin_profile_data())), base_dir=tmp_path)
    shown: list[str] = []

    def progress(message: str) -> None:
        shown.append(message)
        if message == "smoke generation":
            raise stop()

    deployer = deployer_for(prof, progress=progress)
    try:
        with pytest.raises(stop):
            deployer.attempt(prof.initial_champion())
        assert shown[-1] == "smoke generation"  # nothing more was shown
        assert [n.rank for n in prof.cluster.nodes if deployer.alive(n)] == []
        assert all(not (Path(n.workdir) / PIDFILE).exists() for n in prof.cluster.nodes)
    finally:
        deployer.teardown()
        deployer.close()


def test_an_engine_that_meets_a_full_disk_is_the_nodes_failure(tmp_path: Path) -> None:
    """An engine that cannot write (its compile cache, its weights: here ``/dev/full``, whose
    writes fail as a full disk's do) exits with Python's own ``[Errno 28] No space left on
    device``: ``disk_full``, the node's (retried, then the round stops), not ``start``."""
    data = twin_profile_data()
    data["launcher"]["argv"] = [
        "{python}",
        "-c",
        "import sys; f = open('/dev/full', 'w'); f.write('x' * 65536); f.flush()",
    ]
    data["launcher"]["head_argv"] = []
    data["launcher"]["worker_argv"] = []
    err = deploy_failure(tmp_path, data, hold=False)
    assert err.failure_class == "disk_full" and err.failure_class in INFRASTRUCTURE
    assert "No space left on device" in err.log_tail


def test_an_engine_that_logs_a_full_disk_and_hangs_is_the_nodes_failure(tmp_path: Path) -> None:
    """An engine that met a full disk, logged it and hung there (its health never comes, its
    log stops) is the node's (``disk_full``), not a boot that timed out or wedged on the
    config's account; one that hangs with nothing in its log stays ``boot_wedge``."""
    # dd's own line for a write the disk refused, then a hang
    hang = (
        "import subprocess, time; "
        "subprocess.run(['dd', 'if=/dev/zero', 'of=/dev/full', 'bs=1k', 'count=1']); "
        "time.sleep(600)"
    )
    data = twin_profile_data(nodes=1)
    data["launcher"]["argv"] = ["{python}", "-c", hang]
    data["launcher"]["head_argv"] = []
    data["launcher"]["worker_argv"] = []
    data["gates"]["stall_s"] = 1.0
    err = deploy_failure(tmp_path, data, hold=False)
    assert err.failure_class == "disk_full", err.message
    assert err.message.startswith("node-0: boot wedged")
    assert "node-0's log says: dd: error writing '/dev/full': No space left on device" in (
        err.message
    )

    (tmp_path / "quiet").mkdir()
    data["launcher"]["argv"] = ["{python}", "-c", "import time; time.sleep(600)"]
    quiet = deploy_failure(tmp_path / "quiet", data, hold=False)
    assert quiet.failure_class == "boot_wedge", quiet.message


def test_a_boot_past_its_limit_with_its_log_still_growing_names_the_limits_key(
    tmp_path: Path,
) -> None:
    """A stack that boots in twenty minutes under a hand-written profile's two-minute default
    read `/health not 200 within 120s`, like a broken engine: the line now says the log was
    still growing and which key sets the limit."""
    loading = (
        "import time; "
        "[(print('Loading safetensors shard', i, flush=True), time.sleep(0.1)) "
        "for i in range(3000)]"
    )
    data = twin_profile_data(nodes=1)
    data["launcher"]["argv"] = ["{python}", "-c", loading]
    data["launcher"]["head_argv"] = []
    data["launcher"]["worker_argv"] = []
    data["gates"]["boot_timeout_s"] = 3.0
    data["gates"]["stall_s"] = None
    err = deploy_failure(tmp_path, data, hold=False)
    assert err.failure_class == "boot_timeout", err.message
    assert err.message.startswith(
        "node-0: /health not 200 within 3s while its log was still growing: the engine may "
        "need longer to boot; raise gates.boot_timeout_s"
    ), err.message


def test_an_engine_that_logs_its_gpus_or_networks_fault_as_it_exits_is_the_nodes_failure(
    tmp_path: Path,
) -> None:
    """An engine whose GPU or driver failed as it started (CUDA's uncorrectable ECC error,
    NVML's driver and library out of step after a driver upgrade without a reboot) is the
    node's (``gpu_fault``: retried, then the round stops), not the config's ``start``; so is
    one that could not reach the hub it downloads a model from (``network``: a value whose
    weights the node has not cached, the night the hub or the DNS is away). The failure names
    the line, for the line the round stops with. An air-gapped node's warning about the hub
    before the config's own OOM leaves the failure the config's ``oom``."""
    hub = (
        "OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't "
        "find it in the cached files and it looks like org/adapter-r128 is not the path to a "
        "directory containing a file named config.json."
    )
    warned = (
        "WARNING [config.py] Error retrieving file list: HTTPSConnectionPool(host="
        "'huggingface.co', port=443): Max retries exceeded with url: /api/models/m (Caused by "
        "NameResolutionError: Temporary failure in name resolution)"
    )
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    for said, cls in (
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "gpu_fault"),
        ("Failed to initialize NVML: Driver/library version mismatch", "gpu_fault"),
        (hub, "network"),
        (f"{warned}\n{oom}", "oom"),
    ):
        where = tmp_path / str(len(said))
        where.mkdir()
        data = twin_profile_data(nodes=1)
        data["launcher"]["argv"] = [
            "{python}",
            "-c",
            f"import sys; print({said!r}, file=sys.stderr); sys.exit(1)",
        ]
        data["launcher"]["head_argv"] = []
        data["launcher"]["worker_argv"] = []
        err = deploy_failure(where, data, hold=False)
        assert err.failure_class == cls
        assert (cls in INFRASTRUCTURE) == (cls != "oom")
        # "within 5s of its start" or "before /health was 200": whichever watch saw it first
        assert err.message.startswith("node-0: engine exited "), err.message
        assert err.message.endswith(f": {said.splitlines()[-1]}"), err.message


def cell_failures(
    tmp_path: Path, data: dict[str, Any], lines: list[str | None], rank: int = 0
) -> list[NodeError]:
    """Boot the twin profile ``data`` once per line, append the line (if any) to node
    ``rank``'s log once the boot is up, kill that node's engine and run a bench cell: each
    cell's failure."""
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    deployer = deployer_for(prof)
    testbed = ClusterTestbed(deployer, prof.cluster.base_url, prof.model)
    workdir = Path(next(n for n in prof.cluster.nodes if n.rank == rank).workdir)
    failures: list[NodeError] = []
    try:
        for line in lines:
            testbed.deploy(prof.initial_champion())
            pid = int((workdir / PIDFILE).read_text().split()[0])
            if line is not None:
                with (workdir / LOG).open("a") as log:
                    log.write(line + "\n")
            os.killpg(pid, signal.SIGKILL)
            with pytest.raises(NodeError) as failed:
                testbed.bench(prof.cells[0])
            testbed.stop_all()
            failures.append(failed.value)
    finally:
        deployer.teardown()
        deployer.close()
    return failures


def test_an_engine_that_dies_of_its_gpu_in_a_cell_is_the_nodes_failure(tmp_path: Path) -> None:
    """An engine that came up, then died in a bench cell with its GPU's error in its log (the
    line written to the log and the engine's process group killed, as a GPU fallen off the bus
    ends it) fails the cell as ``gpu_fault``, the node's, naming the line: never a
    ``bench_failed`` that, reproduced, would bar the config. Killed without such a line, the
    cell's failure stays ``bench_failed``."""
    gone = "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus."
    fault, plain = cell_failures(tmp_path, twin_profile_data(), [gone, None])
    assert fault.failure_class == "gpu_fault" and fault.failure_class in INFRASTRUCTURE
    assert fault.message.startswith("bench cell ")
    assert fault.message.endswith(f"node-0's log says: {gone}"), fault.message
    assert plain.failure_class == "bench_failed"


def test_a_head_that_stops_answering_fails_its_cell_by_its_deadline_and_says_it_waits(
    tmp_path: Path,
) -> None:
    """A head whose engine stopped (SIGSTOP: its connections open, nothing answered) fails
    the cell once the cell's own deadline for a token has passed, saying how long it waited.
    While it waits, the round's progress says so. Before, the cell waited out ten-minute read
    timeouts with no line at all. The engine found stopped makes it ``engine_stopped`` on
    node-0, the node's (no config stops its own engine); a hang with no process stopped (a
    GPU's) stays ``bench_failed``, counted only once it reproduces and the champion boots."""
    # the head alone: its cell's deadline is what is waited for, not a four-node boot's; the
    # profile's token deadline, 5 s, not the default minute
    data = small_twin_profile_data(nodes=1)
    data["bench"] = {"hang_after_s": 5}
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    shown: list[str] = []
    deployer = deployer_for(prof, progress=shown.append)
    testbed = round_testbed(prof, deployer)  # as a round's
    head = Path(prof.cluster.head.workdir)
    cell = prof.cells[0]
    limit = cold_start_limit_s(cell, prof.bench.hang_after_s)
    try:
        testbed.deploy(prof.initial_champion())
        pid = int((head / PIDFILE).read_text().split()[0])
        os.killpg(pid, signal.SIGSTOP)
        # the cell in a thread of its own: one that still waits past its deadline and a
        # margin fails the test (the teardown then ends its requests)
        with ThreadPoolExecutor(1) as pool:
            bench = pool.submit(testbed.bench, cell)
            try:
                failure = bench.exception(timeout=limit + 60)
            finally:
                os.killpg(pid, signal.SIGCONT)
                if not bench.done():
                    deployer.teardown()
        assert deployer.alive(prof.cluster.head)  # stopped, never dead: no death was read
    finally:
        deployer.teardown()
        deployer.close()
    assert isinstance(failure, NodeError), failure
    assert failure.failure_class == "engine_stopped" and failure.rank == 0
    assert "; node-0's engine was found stopped on 127.0.0.1: pid " in failure.message, failure
    assert "no token arrived in the window, nor in the " in failure.message, failure
    # what the stall watches saw, and the nodes' clocks around it: a silent engine told from
    # a starved host
    assert "; the stall watch saw the client stalled " in failure.message, failure
    assert "; the nodes' clocks around it: rank 0 matmul rate 1.00 at " in failure.message
    waited = float(failure.message.split("nor in the ")[1].split("s ")[0])
    # its deadline, not its deadline and the 10-s scrapes of a stopped engine's counters after
    # it (the line said 90 s of a 60-s deadline)
    assert limit - 2 <= waited <= limit + 10, waited
    assert "(bench.hang_after_s sets the wait)" in failure.message, failure
    assert any(
        line.startswith(f"{cell.name}: no token after the warm-up; waiting up to") for line in shown
    ), shown


def test_a_worker_lost_in_a_cell_is_the_nodes_and_a_worker_dead_of_oom_the_configs(
    tmp_path: Path,
) -> None:
    """A worker's engine killed while a cell is measured (its node gone, a person's kill -9):
    the head's requests fail, and the head logs that a rank left. Before, the cell failed as
    ``bench_failed`` on node-0, the config's, and two such deaths barred the value. Now the
    dead worker is found, and with no failure of its own in its log it is ``worker_missing``
    on node-1, the node's. A worker whose log names an OOM since the boot came up died of the
    config: ``oom``, on node-1."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    lost, of_oom = cell_failures(tmp_path, twin_profile_data(), [None, oom], rank=1)
    assert lost.failure_class == "worker_missing" and lost.failure_class in INFRASTRUCTURE
    assert (lost.rank, lost.message) == (1, "node-1: engine exited while cell code-c1 was measured")
    assert of_oom.failure_class == "oom" and of_oom.rank == 1
    assert of_oom.message.endswith(f": {oom}"), of_oom.message


def test_a_cell_failure_is_not_read_by_what_the_node_logged_as_it_booted(tmp_path: Path) -> None:
    """A head warns as it boots that it could not write its compile cache (a full disk), then
    serves. An engine that dies in a cell with no line of its own fails it as ``bench_failed``,
    the config's evidence: the boot's warning is not read as the node's disk failing (only
    what a node logged after the boot came up is)."""
    warned = "WARNING: compile cache not written: [Errno 28] No space left on device"
    data = twin_profile_data()
    data["launcher"]["argv"] = [
        "sh",
        "-c",
        'echo "$0" >&2; exec "$@"',
        warned,
        *data["launcher"]["argv"],
    ]
    (failure,) = cell_failures(tmp_path, data, [None])
    log = (tmp_path / "nodes" / "node-0" / LOG).read_text()
    assert warned in log  # the head did log the warning as it booted
    assert failure.failure_class == "bench_failed", failure.message


def test_a_config_failure_names_the_line_its_log_named_it_by(tmp_path: Path) -> None:
    """The twin's vLLM at a memory fraction of 0.71 exits at start, its KV cache short of one
    request: ``kv_capacity``, the config's, and the failure (the verdict's reason, the crash)
    says what the log said, not only that the engine exited."""
    data = twin_profile_data()
    data["champion"]["gpu_memory_utilization"] = 0.71
    err = deploy_failure(tmp_path, data, hold=False)
    assert err.failure_class == "kv_capacity" and err.failure_class not in INFRASTRUCTURE
    assert err.message.startswith("node-0: engine exited "), err.message
    assert "more KV cache memory is needed than the available" in err.message, err.message


# a deploy of a one-node twin profile whose engine is ``sys.argv[2]``'s Python, with node-0's
# workdir on a filesystem of its own (mounted by the test in a mount namespace of the child's)
FULL_DISK_DEPLOY = """
import sys
from pathlib import Path
from cluster.errors import DeployError
from orchestrator.profile import load_profile
from orchestrator.testbed import deployer_for
from tests.fixtures.profiles import twin_profile_data, write_profile
tmp = Path(sys.argv[1])
data = twin_profile_data(nodes=1)
data["launcher"]["argv"] = ["{python}", "-c", sys.argv[2]]
data["launcher"]["head_argv"] = []
data["launcher"]["worker_argv"] = []
prof = load_profile(str(write_profile(tmp, data)), base_dir=tmp)
deployer = deployer_for(prof)
try:
    deployer.deploy(prof.initial_champion())
except DeployError as e:
    print("CLASS", e.failure_class)
    print("MESSAGE", e.message)
finally:
    deployer.teardown()
    deployer.close()
"""


@pytest.mark.parametrize("fills", [True, False])
def test_an_engine_that_fills_its_disk_and_dies_with_an_empty_log_is_the_nodes_failure(
    tmp_path: Path, fills: bool
) -> None:
    """An engine that fills its node's disk (a compile cache, a download) dies of it with
    nothing in its log: the traceback that would say so could not be written. That is the
    node's ``disk_full``, however the config filled it (retried, then the round stops, nothing
    barred), not ``start``, the config's class that barred the value once it reproduced. An
    engine that dies with an empty log on the same small disk with room stays ``start``."""
    workdir = tmp_path / "nodes" / "node-0"
    workdir.mkdir(parents=True)
    engine = (
        f"f = open({str(workdir / 'cache')!r}, 'wb'); "
        "[f.write(b'x' * 65536) and f.flush() for _ in iter(int, 1)]"
        if fills
        else "import os; os._exit(1)"
    )
    # a 2-MiB filesystem of its own for node-0's workdir, in the child's own mount namespace
    # (as root; a user's own namespace otherwise): gone with the child
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Urm"]
    mount = 'mount -t tmpfs -o size=2m tmpfs "$1" && shift && exec "$@"'
    done = subprocess.run(
        [
            *unshare,
            "sh",
            "-c",
            mount,
            "sh",
            str(workdir),
            sys.executable,
            "-c",
            FULL_DISK_DEPLOY,
            str(tmp_path),
            engine,
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert done.returncode == 0 and "CLASS" in said, (done.stdout, done.stderr[-2000:])
    if fills:
        assert said["CLASS"] == "disk_full", said
        assert (
            "node-0: engine exited" in said["MESSAGE"]
            and "full disk (0 KiB free" in (said["MESSAGE"])
        ), said
    else:
        assert said["CLASS"] == "start", said


def test_a_bad_flag_stays_a_start_failure(tmp_path: Path) -> None:
    data = twin_profile_data()
    data["launcher"]["argv"] = [*data["launcher"]["argv"], "--no-such-flag"]
    err = deploy_failure(tmp_path, data, hold=False)
    assert err.failure_class == "start"
    assert err.failure_class not in INFRASTRUCTURE


def test_a_long_failure_line_is_cut_at_a_word_and_says_it_was_cut(tmp_path: Path) -> None:
    """vLLM's KV-capacity line runs past 300 characters; the failure quoted it cut mid-word
    ("… when initializing the engine. (gpu_memory_"), with no sign of the cut."""
    from cluster.blame import Blame

    prof = load_profile("twin", base_dir=tmp_path)
    line = (
        "ValueError: To serve at least one request with the models's max seq len (131072), "
        "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(9.31 GiB). Based on the available memory, the estimated maximum model length is "
        "76256. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine. (gpu_memory_utilization 0.71)"
    )
    head = prof.cluster.head
    blame = Blame(prof.cluster, prof.gates, log_of=lambda _n: f"INFO loading\n{line}\n", alive=bool)
    err = blame.died(head, "before /health was 200")
    assert err.failure_class == "kv_capacity"
    quoted = str(err).split("engine exited before /health was 200: ", 1)[1]
    assert quoted.endswith("…") and len(quoted) <= 300, quoted
    assert line.startswith(quoted[:-1]) and line[len(quoted) - 1] == " ", quoted
