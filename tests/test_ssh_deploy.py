"""Deploying the twin over SSH to four real sshd test hosts: the order of starts and stops as
the nodes' own journals record it, and real faults, each ending in its failure class, with
every node torn down and the champion restored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cluster.deploy import Deployer
from cluster.errors import NodeUnreachable
from cluster.launcher import EVENTS, SCRIPT
from knobs.vocabulary import NODE_ACCESS
from orchestrator.profile import Profile, load_profile
from orchestrator.testbed import deployer_for
from tests.fixtures.profiles import write_profile
from tests.fixtures.sshd import SshCluster
from tests.fixtures.wait import wait_until


def ssh_profile(cluster: SshCluster, directory: Path) -> Profile:
    return load_profile(str(write_profile(directory, cluster.profile_data())))


def make_deployer(profile: Profile, progress: Callable[[str], None] | None = None) -> Deployer:
    """What ``orchestrate`` builds: one transport per node from the profile."""
    return deployer_for(profile, progress=progress)


@pytest.fixture
def deployers() -> Iterator[list[Deployer]]:
    """Deployers to tear down and close at the end of the test, whatever happened."""
    made: list[Deployer] = []
    yield made
    for d in made:
        d.teardown()
        d.close()


def journal(workdir: Path) -> list[tuple[float, str, str]]:
    """The node's own journal: (node clock, event, last word printed)."""
    path = workdir / EVENTS
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        stamp, event, _rank, _rc, *rest = line.split()
        out.append((float(stamp), event, rest[-1] if rest else ""))
    return out


def ranks_in_order(cluster: SshCluster, event: str) -> list[int]:
    """Ranks ordered by when each node's journal recorded ``event`` (every occurrence)."""
    stamped = [
        (stamp, h.rank) for h in cluster.hosts for stamp, ev, _ in journal(h.workdir) if ev == event
    ]
    return [rank for _, rank in sorted(stamped)]


def serving_config(cluster: SshCluster) -> set[str]:
    """The config keys in the launchers the nodes hold now."""
    keys = set()
    for h in cluster.hosts:
        header = (h.workdir / SCRIPT).read_text().splitlines()[2]
        keys.add(header.split()[2].rstrip(":"))
    return keys


def test_workers_start_first_and_stop_last_as_the_nodes_journals_show(
    ssh_cluster: SshCluster, tmp_path: Path, deployers: list[Deployer]
) -> None:
    profile = ssh_profile(ssh_cluster, tmp_path)
    d = make_deployer(profile)
    deployers.append(d)
    result = d.deploy(profile.initial_champion())
    assert result.start_order == (3, 2, 1, 0)
    assert httpx.get(profile.cluster.base_url + "/health", timeout=5).status_code == 200
    assert sorted(ssh_cluster.engines().values()) == [0, 1, 2, 3]
    for h in ssh_cluster.hosts:
        log = (h.workdir / "engine.log").read_text()
        assert f"Starting node rank {h.rank} of 4" in log
    outcomes = d.teardown()
    assert outcomes[0] == "stopped"
    # a worker exits once its head is gone: found so, or still going and stopped
    assert all(outcomes[r] in ("stopped", "exited with the head") for r in (1, 2, 3)), outcomes
    assert ssh_cluster.engines() == {}
    # each node stamps its own journal when a start or a stop is confirmed on it
    assert ranks_in_order(ssh_cluster, "start") == [3, 2, 1, 0]
    # the deploy began by stopping everything, and the teardown stopped everything again
    assert ranks_in_order(ssh_cluster, "stop") == [0, 1, 2, 3, 0, 1, 2, 3]
    # every command went over one connection per node
    assert [t.connections for t in d.transports.values()] == [1, 1, 1, 1]  # type: ignore[attr-defined]


# ---- faults -------------------------------------------------------------------------------


def kill_engine(cluster: SshCluster, rank: int) -> None:
    """SIGKILL a node's engine process group, as a crash would end it, and wait until the
    process is reaped (this machine's init reaps orphans up to a second late; until then
    the dead engine still answers ``kill -0``)."""
    pid = int((cluster.node(rank).workdir / "engine.pid").read_text().split()[0])
    os.killpg(pid, signal.SIGKILL)
    wait_until(f"engine {pid} to be reaped", lambda: not Path(f"/proc/{pid}").exists(), 10)


def stick_clocks(cluster: SshCluster, rank: int) -> None:
    """The node's GB10 clocks stick low (the twin's node state, which survives restarts)."""
    state = {"boots": 1, "stuck": True, "stuck_rate": 0.6, "stuck_since_boot": 1}
    (cluster.node(rank).workdir / "node.json").write_text(json.dumps(state))


def power_cycle(cluster: SshCluster, rank: int) -> None:
    env = {**os.environ, "TWIN_NODE_DIR": str(cluster.node(rank).workdir)}
    subprocess.run(
        [sys.executable, "-m", "cluster.twin", "power-cycle"], env=env, check=True, timeout=60
    )


@dataclass(frozen=True)
class Fault:
    """A real fault: injected before the deploy or when a progress step begins, healed when
    the deployer starts restoring the champion (after it tore every node down)."""

    name: str
    failure_class: str
    rank: int
    inject: Callable[[SshCluster], object]
    heal: Callable[[SshCluster], object]
    at: str | None = None  # progress message that triggers it; None: before the deploy
    once_logged: tuple[int, str] | None = None  # …and then once node R's log has this text
    left_running: tuple[int, ...] = ()  # engines the teardown cannot reach
    needs_netns: bool = False  # a link to cut exists only in network namespaces (root)


FAULTS = [
    Fault(
        "sshd killed before deploy",
        "unreachable",
        3,
        lambda c: c.node(3).kill_sshd(),
        lambda c: c.node(3).start_sshd(),
    ),
    Fault(
        "sshd stopped during deploy",
        "unreachable",
        1,
        lambda c: c.node(1).freeze_sshd(),
        lambda c: c.node(1).thaw_sshd(),
        at="starting node-2",
    ),
    Fault(
        "worker link cut during boot",
        "unreachable",
        2,
        lambda c: c.node(2).cut_link(),
        lambda c: c.node(2).restore_link(),
        # while the head boots, with rank 2 joined: the connection between them just goes
        # silent, as when a cable is pulled
        at="starting node-0",
        once_logged=(0, "Node rank 2 joined"),
        left_running=(2,),
        needs_netns=True,
    ),
    Fault(
        "host key changed",
        "host_key",
        1,
        lambda c: c.node(1).change_host_key(),
        lambda c: c.heal(),
    ),
    Fault(
        "user key revoked",
        "auth",
        3,
        lambda c: c.node(3).revoke_user_key(c.other_pub),
        lambda c: c.heal(),
    ),
    Fault(
        "worker exits during boot",
        "worker_missing",
        2,
        lambda c: kill_engine(c, 2),
        lambda c: None,
        at="starting node-0",
    ),
    Fault(
        "stuck clocks caught by preflight",
        "clocks_stuck",
        1,
        lambda c: stick_clocks(c, 1),
        lambda c: power_cycle(c, 1),
    ),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name.replace(" ", "-") for f in FAULTS])
def test_fault_is_classified_torn_down_and_the_champion_restored(
    ssh_cluster: SshCluster, tmp_path: Path, deployers: list[Deployer], fault: Fault
) -> None:
    if fault.needs_netns and ssh_cluster.mode != "netns":
        pytest.fail("this fault needs network namespaces, hence root (CI runs as root)")
    data = ssh_cluster.profile_data()
    if fault.failure_class == "clocks_stuck":
        del data["gates"]["recover_command"]  # else the preflight power-cycles the node itself
    profile = load_profile(str(write_profile(tmp_path, data)))
    assert profile.restore_champion
    champion = profile.initial_champion()
    candidate = champion.apply(profile.space.change(champion, "max_num_batched_tokens", 8192))
    seen: dict[str, object] = {}
    watchers: list[threading.Thread] = []

    def inject_once_logged(rank: int, text: str) -> None:
        log = ssh_cluster.node(rank).workdir / "engine.log"
        try:
            wait_until(f"{text!r} in {log}", lambda: log.exists() and text in log.read_text(), 20)
        except TimeoutError:
            return  # the fault's moment never came: the test's assertions say so
        seen["injected"] = fault.inject(ssh_cluster)

    def progress(message: str) -> None:
        if fault.at is not None and message.startswith(fault.at) and "triggered" not in seen:
            seen["triggered"] = True
            if fault.once_logged is None:
                seen["injected"] = fault.inject(ssh_cluster)
            else:
                watcher = threading.Thread(target=inject_once_logged, args=fault.once_logged)
                watcher.start()
                watchers.append(watcher)
        if message == "restoring the champion":
            # the failed deploy is over and torn down: only engines on a node that could not
            # be reached may be left; then the fault goes away and the restore may proceed
            seen["left"] = sorted(ssh_cluster.engines().values())
            fault.heal(ssh_cluster)

    if fault.at is None:
        seen["injected"] = fault.inject(ssh_cluster)
    d = make_deployer(profile, progress)
    deployers.append(d)
    attempt = d.attempt(candidate, fallback=champion)
    for watcher in watchers:
        watcher.join()
    assert "injected" in seen, "the fault was never injected"

    failure = attempt.failure
    assert failure is not None, "the fault did not fail the deploy"
    assert (failure.failure_class, failure.rank) == (fault.failure_class, fault.rank), (
        failure.evidence()
    )
    assert isinstance(failure, NodeUnreachable) == (fault.failure_class in NODE_ACCESS)
    assert failure.exit_code == (5 if fault.failure_class in NODE_ACCESS else 6)
    # evidence: the message names the node; every node's log was collected
    assert f"node-{fault.rank}" in failure.message
    assert set(attempt.logs) == {0, 1, 2, 3}
    # teardown reached every node it could, in order, and said which it could not
    for rank, how in attempt.teardown.items():
        if rank == fault.rank and fault.failure_class in NODE_ACCESS:
            assert how.startswith("unreachable: "), how
        else:
            assert how in ("absent", "stopped", "killed") or how.startswith("exited "), (rank, how)
    assert seen["left"] == list(fault.left_running)
    # the champion is back: healthy, greedy generation works, every node runs its launcher
    assert attempt.restore_failure is None, attempt.restore_failure.evidence()
    assert attempt.restored is not None and attempt.restored.smoke_text.strip()
    assert httpx.get(profile.cluster.base_url + "/health", timeout=5).status_code == 200
    assert serving_config(ssh_cluster) == {champion.key}
    assert sorted(ssh_cluster.engines().values()) == [0, 1, 2, 3]
    d.teardown()
    assert ssh_cluster.engines() == {}


def test_a_wrong_rank_address_fails_the_interface_gate(
    ssh_cluster: SshCluster, tmp_path: Path, deployers: list[Deployer]
) -> None:
    if ssh_cluster.mode != "netns":
        pytest.fail("the interface gate needs each node's own interface: network namespaces")
    data = ssh_cluster.profile_data()
    nodes = data["cluster"]["nodes"]
    nodes[1]["host"], nodes[2]["host"] = nodes[2]["host"], nodes[1]["host"]
    profile = load_profile(str(write_profile(tmp_path, data)))
    d = make_deployer(profile)
    deployers.append(d)
    attempt = d.attempt(profile.initial_champion())
    assert attempt.failure is not None
    assert attempt.failure.failure_class == "preflight_failed"
    assert "wrong rank" in attempt.failure.message
    assert attempt.restored is None
    assert ssh_cluster.engines() == {}
    assert ranks_in_order(ssh_cluster, "start") == []
