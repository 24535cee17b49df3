"""Real faults on four real sshd test hosts while ``orchestrate round`` runs (issue #17).

Each fault is the infrastructure's, not the change's: the round stops with exit code 5 and one
line naming the node and its failure class, no engine is left on a node that can still be
reached, no value is barred, and once the fault is healed the same command resumes the
experiment it left undecided and finishes the original budget.

A fault before the round is made before the command starts. A fault during a boot is made
when the nodes' own journals and the ledger say the boot got there (a candidate's boot
started, the node's engine started), never after a guessed delay.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.launcher import EVENTS
from knobs.vocabulary import INFRASTRUCTURE, Kind, State, Status
from ledger import ExperimentRecord, Ledger
from tests.fixtures.profiles import write_profile
from tests.fixtures.sshd import SshCluster, SshHost
from tests.fixtures.wait import wait_until

ORCHESTRATE = [sys.executable, "-m", "orchestrator"]
BUDGET = 1


@dataclass
class Round:
    """One ``orchestrate round`` subprocess; its output goes to files (no pipe to fill)."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def wait(self, timeout: float = 240) -> tuple[int, str]:
        rc = self.proc.wait(timeout=timeout)
        return rc, self.err.read_text()

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the round ended early ({self.proc.returncode}): " + self.tail())
        return True

    def tail(self) -> str:
        return self.err.read_text()[-2000:]


def start_round(cwd: Path, profile: Path, tag: str) -> Round:
    out, err = cwd / f"{tag}.out", cwd / f"{tag}.err"
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{cwd}/orchestrate.db"}
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [*ORCHESTRATE, "round", "--budget", str(BUDGET), "--profile", str(profile)],
            cwd=cwd,
            env=env,
            stdout=o,
            stderr=e,
        )
    return Round(proc, out, err)


def fault_profile(cluster: SshCluster, tmp_path: Path) -> Path:
    """The twin over the test hosts: one short cell, one boot a verdict, one retry 0.2 s
    after an infrastructure failure, K=5 as the one experiment."""
    data: dict[str, Any] = cluster.profile_data()
    data["cells"] = data["cells"][:1]
    data["verdict"] = {
        "policy": "threshold",
        "champion_boots": 1,
        "infra_retries": 1,
        "infra_backoff_s": 0.2,
    }
    data["proposer"] = {"kind": "sweep", "sweep": [{"num_speculative_tokens": 5}]}
    # a failed candidate is not followed by a champion boot here: the fault stays the only
    # thing that happens to the nodes after it
    data["restore_champion"] = False
    return write_profile(tmp_path, data)


def experiments(cwd: Path) -> list[ExperimentRecord]:
    with Ledger(f"sqlite:///{cwd}/orchestrate.db") as ledger:
        return ledger.experiments()


def starts(host: SshHost) -> int:
    """How many engine starts the node's journal holds."""
    path = host.workdir / EVENTS
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(1 for line in lines if line.split()[1:2] == ["start"])


def wait_for_candidate_start(rnd: Round, cwd: Path, host: SshHost) -> None:
    """Until the candidate's boot has started ``host``'s engine: its journal holds more
    starts than the boots before the candidate (each boot starts every node once)."""

    def reached() -> bool:
        rnd.alive()
        with Ledger(f"sqlite:///{cwd}/orchestrate.db") as ledger:
            found = ledger.experiments()
            if not any(e.kind == Kind.CANDIDATE for e in found):
                return False
            earlier = sum(len(ledger.boots(e.id)) for e in found if e.kind != Kind.CANDIDATE)
        return starts(host) > earlier

    wait_until(f"node {host.rank} started for the candidate", reached, timeout=240, interval=0.05)


def assert_stopped_by(rc: int, err: str, rank: int, failure_class: str) -> None:
    """Exit code 5 and one line naming the node and the class; no traceback."""
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert rc == 5, err[-3000:]
    assert len(errors) == 1, err[-3000:]
    assert f"node {rank}" in errors[0] and failure_class in errors[0], errors[0]
    assert "Traceback" not in err


def assert_undecided_and_nothing_barred(cwd: Path) -> ExperimentRecord:
    """The experiment the fault hit is undecided; nothing is a crash; the round is open."""
    found = experiments(cwd)
    assert not any(e.status == Status.CRASH for e in found), found
    undecided = [e for e in found if e.state != State.DECIDED]
    assert len(undecided) == 1, found
    with Ledger(f"sqlite:///{cwd}/orchestrate.db") as ledger:
        assert ledger.unfinished_round("twin-ssh") is not None
    return undecided[0]


def assert_resumes_and_finishes(
    cluster: SshCluster, cwd: Path, profile: Path, undecided: ExperimentRecord | None
) -> None:
    """Healed, the same command finishes the undecided experiment and the budget."""
    cluster.heal()
    rc, err = start_round(cwd, profile, "resume").wait()
    assert rc == 0, err[-3000:]
    found = experiments(cwd)
    assert all(e.state == State.DECIDED for e in found), found
    assert not any(e.status == Status.CRASH for e in found), found
    assert undecided is None or undecided.id in {e.id for e in found}
    candidates = [e for e in found if e.kind == Kind.CANDIDATE]
    assert len(candidates) == BUDGET
    with Ledger(f"sqlite:///{cwd}/orchestrate.db") as ledger:
        assert ledger.unfinished_round("twin-ssh") is None
        assert ledger.champion("twin-ssh") is not None
    assert cluster.engines() == {}


def engines_on_reachable(cluster: SshCluster, unreachable: int) -> dict[int, int]:
    return {pid: rank for pid, rank in cluster.engines().items() if rank != unreachable}


#: Faults made before the round starts: the node, how it is broken, the class it must give.
BEFORE: dict[int, tuple[str, str]] = {
    2: ("kill_sshd", "unreachable"),
    1: ("revoke_user_key", "auth"),
    3: ("change_host_key", "host_key"),
}


def test_nodes_broken_before_the_round_stop_it_with_exit_5_and_it_resumes(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """Three nodes broken three ways: each run is refused naming one of them with its class,
    nothing started; that node is mended and the command run again, until the round runs."""
    profile = fault_profile(ssh_cluster, tmp_path)
    broken = dict(BEFORE)
    while broken:
        ssh_cluster.heal()
        for rank, (fault, _) in broken.items():
            host = ssh_cluster.node(rank)
            if fault == "revoke_user_key":
                host.revoke_user_key(ssh_cluster.other_pub)
            else:
                getattr(host, fault)()
        rc, err = start_round(tmp_path, profile, f"broken-{len(broken)}").wait()
        named = [r for r in broken if f"Error: node {r} (" in err]
        assert len(named) == 1, err[-3000:]
        rank = named[0]
        # the round claims every node before anything else: the claim meets the fault, and
        # nothing ran (no experiment, no engine anywhere)
        assert_stopped_by(rc, err, rank, broken.pop(rank)[1])
        assert "before anything started" in err
        assert experiments(tmp_path) == []
        assert ssh_cluster.engines() == {}
    assert_resumes_and_finishes(ssh_cluster, tmp_path, profile, None)


@pytest.mark.parametrize(
    ("fault", "rank", "failure_class"),
    [
        # workers start first: node 1 is up for the candidate, then its sshd stops answering
        # (SIGSTOP: TCP still connects, nothing answers)
        ("freeze_sshd", 1, "unreachable"),
        # the head starts last: once it has, the round waits for its /health (or benches)
        ("cut_link", 0, "unreachable"),
    ],
)
def test_a_node_lost_while_the_candidate_boots_stops_the_round_and_it_resumes(
    ssh_cluster: SshCluster, tmp_path: Path, fault: str, rank: int, failure_class: str
) -> None:
    profile = fault_profile(ssh_cluster, tmp_path)
    host = ssh_cluster.node(rank)
    rnd = start_round(tmp_path, profile, "first")
    wait_for_candidate_start(rnd, tmp_path, host)
    getattr(host, fault)()
    rc, err = rnd.wait()
    assert_stopped_by(rc, err, rank, failure_class)
    undecided = assert_undecided_and_nothing_barred(tmp_path)
    assert undecided.kind == Kind.CANDIDATE
    assert engines_on_reachable(ssh_cluster, rank) == {}
    assert_resumes_and_finishes(ssh_cluster, tmp_path, profile, undecided)


def test_a_node_lost_while_the_candidate_is_benched_is_not_the_configs_failure(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """A node whose sshd stops answering during the candidate's cells (the twin's profile
    reads every node's clocks over SSH around each cell) fails that boot as ``unreachable``,
    the infrastructure's: before, the bench client's wrapper recast it as ``bench_failed``, a
    configuration failure that a second boot could make a crash."""
    profile = fault_profile(ssh_cluster, tmp_path)
    rnd = start_round(tmp_path, profile, "first")

    def benching() -> bool:
        rnd.alive()
        return any(
            e.kind == Kind.CANDIDATE and e.state == State.BENCHING for e in experiments(tmp_path)
        )

    wait_until("the candidate's cells started", benching, timeout=240, interval=0.05)
    ssh_cluster.node(1).freeze_sshd()
    rc, err = rnd.wait()
    assert_stopped_by(rc, err, 1, "unreachable")
    undecided = assert_undecided_and_nothing_barred(tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/orchestrate.db") as ledger:
        boots = ledger.boots(undecided.id)
    assert boots and all(b.failure_class in INFRASTRUCTURE for b in boots), boots
    assert_resumes_and_finishes(ssh_cluster, tmp_path, profile, undecided)


def test_a_node_that_fails_a_preflight_gate_is_not_the_configs_failure(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """Every node short of the free memory the profile's preflight asks for (an engine of
    another job still holding it): the boot fails before any engine starts, as the
    infrastructure's (``preflight_failed``), is taken again, and the round stops with exit 5,
    nothing barred; with the memory free again the same command runs the round. Before, the
    gate's failure was a configuration failure: the baseline itself became a crash."""
    data = yaml.safe_load(fault_profile(ssh_cluster, tmp_path).read_text())
    data["gates"]["min_free_mib"] = 1 << 40  # more than any test machine has free
    short = write_profile(tmp_path, data, "short.yaml")
    rc, err = start_round(tmp_path, short, "first").wait()
    assert_stopped_by(rc, err, 0, "preflight_failed")
    assert "MiB free" in err
    undecided = assert_undecided_and_nothing_barred(tmp_path)
    with Ledger(f"sqlite:///{tmp_path}/orchestrate.db") as ledger:
        boots = ledger.boots(undecided.id)
    assert [b.failure_class for b in boots] == ["preflight_failed", "preflight_failed"]
    assert ssh_cluster.engines() == {} and all(starts(h) == 0 for h in ssh_cluster.hosts)
    # the morning: ``status`` says why the round stopped (the timer's log is elsewhere)
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    shown, as_json = (
        subprocess.run(
            [*ORCHESTRATE, "status", "--profile", str(short), *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for extra in ([], ["--json"])
    )
    assert shown.returncode == 0 and as_json.returncode == 0, shown.stderr + as_json.stderr
    said = " ".join(shown.stdout.split())
    error = next(line for line in err.splitlines() if line.startswith("Error:"))
    line = error.removeprefix("Error: ")
    assert f"(exit 5): {' '.join(line.split())}" in said, said
    stopped = json.loads(as_json.stdout)["running_round"]["stopped"]
    assert (stopped["exit_code"], stopped["error"]) == (5, "InfrastructureFault")
    assert stopped["reason"] == line
    assert_resumes_and_finishes(
        ssh_cluster, tmp_path, fault_profile(ssh_cluster, tmp_path), undecided
    )
    # the round's report, written as it ended, tells the night's stop and the boots it cost:
    # the two preflight failures, and any boot the twin brought up with a node's clocks off
    page = " ".join((tmp_path / "reports" / "round-1" / "report.html").read_text().split())
    assert f"(exit 5): {escape(' '.join(line.split()))}; went on at" in page, page[-3000:]
    with Ledger(f"sqlite:///{tmp_path}/orchestrate.db") as ledger:
        boots = [b for e in ledger.experiments() for b in ledger.boots(e.id)]
        slow = {
            boot
            for e in ledger.experiments()
            for boot, _, cell, _ in ledger.cell_results(e.id)
            if any(c.matmul_rate < 0.9 for c in cell.clocks)
        }
    failed = [b for b in boots if b.failure_class in INFRASTRUCTURE]
    assert len(failed) == 2
    assert f"{len(failed) + len(slow)} boot(s) were the infrastructure's, not a config's" in page


def test_a_port_taken_on_the_head_is_not_the_configs_failure(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    profile = fault_profile(ssh_cluster, tmp_path)
    head = ssh_cluster.node(0)
    port = int(_profile_port(profile))
    squatter = _listen(ssh_cluster, head, port)
    try:
        rc, err = start_round(tmp_path, profile, "first").wait()
        assert_stopped_by(rc, err, 0, "port")
        assert str(port) in err
        undecided = assert_undecided_and_nothing_barred(tmp_path)
        assert ssh_cluster.engines() == {}
    finally:
        squatter.kill()
        squatter.communicate()  # reaped, its pipes closed
    assert_resumes_and_finishes(ssh_cluster, tmp_path, profile, undecided)


def _profile_port(profile: Path) -> str:
    data = yaml.safe_load(profile.read_text())
    return str(data["cluster"]["port"])


def _listen(cluster: SshCluster, host: SshHost, port: int) -> subprocess.Popen[bytes]:
    """Something else listening on ``host``'s ``port`` (in its namespace, when it has one)."""
    code = (
        "import socket,sys,time\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(({host.address!r}, {port})); s.listen(); print('up', flush=True)\n"
        "sys.stdin.read()\n"
    )
    prefix = ["ip", "netns", "exec", host.netns] if host.netns else []
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    with socket.create_connection((host.address, port), timeout=5):
        pass
    return proc


def _status(cwd: Path, profile: Path, *json_flag: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{cwd}/orchestrate.db"}
    return subprocess.run(
        [*ORCHESTRATE, "status", "--profile", str(profile), *json_flag],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _stops(cwd: Path) -> list[dict[str, Any]]:
    with Ledger(f"sqlite:///{cwd}/orchestrate.db") as ledger:
        return [
            {"subject": ev.subject, **ev.detail}
            for ev in ledger.events("twin-ssh")
            if ev.kind == "round-stopped"
        ]


def test_a_node_away_as_a_new_round_starts_is_said_by_status_in_the_morning(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """No round began (the claims met the node away), yet `status` and the ledger's events
    say which node stopped the night, once however often a timer tried; nothing is barred,
    and the same command runs the round once the node is back. Before, nothing was kept."""
    profile = fault_profile(ssh_cluster, tmp_path)
    ssh_cluster.node(2).kill_sshd()
    for tag in ("night", "timer"):  # a timer tries again while the node is still away
        rc, err = start_round(tmp_path, profile, tag).wait()
        assert_stopped_by(rc, err, 2, "unreachable")
        assert "before anything started" in err
    assert experiments(tmp_path) == []
    assert _stops(tmp_path) == [
        {
            "subject": "",
            "error": "NodeUnreachable",
            "node": "node-2",
            "failure_class": "unreachable",
            "exit_code": 5,
        }
    ]
    said = _status(tmp_path, profile, "--json")
    assert said.returncode == 0, said.stderr
    data = json.loads(said.stdout)
    assert data["running_round"] is None
    assert data["not_started"]["node"] == "node-2" and data["not_started"]["exit_code"] == 5
    assert "before anything started" in data["not_started"]["reason"]
    text = _status(tmp_path, profile).stdout
    assert f"no round began: the last `orchestrate round --profile {profile}` stopped at" in text
    assert "(exit 5): node 2 (" in text, text
    assert_resumes_and_finishes(ssh_cluster, tmp_path, profile, None)
    assert json.loads(_status(tmp_path, profile, "--json").stdout)["not_started"] is None


def test_a_node_away_as_a_round_resumes_is_its_stop_for_status_and_the_report(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """A round its cap stopped after the baseline, taken up again with a node away: its
    recorded stop becomes the node's (before, `status` still said the cap stopped it)."""
    profile = fault_profile(ssh_cluster, tmp_path)
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    capped = subprocess.run(
        [*ORCHESTRATE, "round", "--budget", "1", "--max-hours", "0.0001", "-p", str(profile)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert capped.returncode == 0, capped.stderr[-3000:]
    ssh_cluster.node(2).kill_sshd()
    rc, err = start_round(tmp_path, profile, "resume").wait()
    assert_stopped_by(rc, err, 2, "unreachable")
    data = json.loads(_status(tmp_path, profile, "--json").stdout)
    stopped = data["running_round"]["stopped"]
    assert "before anything started" in stopped["reason"], stopped
    assert stopped["node"] == "node-2" and stopped["exit_code"] == 5, stopped
    assert [s["subject"] for s in _stops(tmp_path)] == ["1", "1"]
    assert not any(e.status == Status.CRASH for e in experiments(tmp_path))
    page = tmp_path / "reports" / "round-1" / "report.html"
    assert "node 2 (" in page.read_text(), "the report does not say the node"
