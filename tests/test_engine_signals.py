"""An engine stopped or killed from outside is its node's, never the config's: a worker's
engine stopped (SIGSTOP: a suspended host, a debugger, a person's ``kill -STOP``) while a cell
is measured, or while a boot comes up, is ``engine_stopped`` on that node; a head engine that
died of a SIGTERM orchestrate did not send is ``engine_killed`` on it. SIGKILL stays the
config's (the OOM killer sends it too). Real twin engines, real signals to their processes."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cluster.bench import cold_start_limit_s
from cluster.errors import DeployError, NodeError
from cluster.launcher import LOG, PIDFILE
from knobs.vocabulary import INFRASTRUCTURE
from orchestrator.profile import Profile, load_profile
from orchestrator.testbed import ClusterTestbed, deployer_for, round_testbed
from tests.fixtures.profiles import twin_profile_data, write_profile


def wait_for(what: str, condition: object, timeout: float = 30.0) -> None:
    """Poll ``condition`` (a callable) until it holds; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _group_of(pid: int) -> tuple[str, int] | None:
    """Process ``pid``'s state and process group, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2])


def engine_of(workdir: Path) -> int | None:
    """The pid of the node's engine: the process of the group its pid file names that is no
    shell (the launcher's wrapper is one; an older release's group had none), or None."""
    if not (workdir / PIDFILE).exists():
        return None
    group = int((workdir / PIDFILE).read_text().split()[0])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        found = _group_of(int(proc.name))
        try:
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if found and found[1] == group and found[0] != "Z" and not argv0.endswith(b"bash"):
            return int(proc.name)
    return None


def stop_worker_till_the_head_waits(prof: Profile, workdir: str) -> int:
    """Stop the booted worker's engine at ``workdir`` (SIGSTOP to its process alone, as a
    person's ``kill -STOP`` or a debugger leaves it) and wait until the head says it stopped
    answering (vLLM's broadcast warning): from then on the group's steps wait for it. Its
    pid, for the ``kill -CONT``."""
    engine = engine_of(Path(workdir))
    assert engine is not None
    os.kill(engine, signal.SIGSTOP)
    head_log = Path(prof.cluster.head.workdir) / LOG
    wait_for(
        "the head to find rank 1 silent",
        lambda: "(node rank 1 has not answered)" in head_log.read_text(),
    )
    return engine


def test_a_worker_stopped_while_a_cell_is_measured_is_its_nodes_not_the_configs(
    tmp_path: Path,
) -> None:
    """Worker 1's engine is stopped (SIGSTOP to its process alone, as a person's ``kill -STOP``
    or a debugger leaves it) once the boot is up: the tensor-parallel group waits on it, the
    head stops answering, and the cell fails by its deadline. Before, that was the config's
    ``bench_failed`` on node-0, and two such nights barred the value. Now every node's engine
    is looked at: node-1's is found stopped, and the failure is ``engine_stopped`` on node-1,
    the infrastructure's, its line naming the node and the stopped process."""
    data = twin_profile_data()
    data["bench"] = {"hang_after_s": 5}  # the default minute is what the test would wait
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    deployer = deployer_for(prof)
    testbed = round_testbed(prof, deployer)  # as a round's
    worker = next(n for n in prof.cluster.nodes if n.rank == 1)
    cell = prof.cells[0]
    try:
        testbed.deploy(prof.initial_champion())
        engine = stop_worker_till_the_head_waits(prof, worker.workdir)
        with ThreadPoolExecutor(1) as pool:
            bench = pool.submit(testbed.bench, cell)
            try:
                # by the profile's deadline and a margin: the default minute fails the test
                failure = bench.exception(
                    timeout=cold_start_limit_s(cell, prof.bench.hang_after_s) + 30
                )
            finally:
                os.kill(engine, signal.SIGCONT)
                if not bench.done():
                    deployer.teardown()
    finally:
        deployer.teardown()
        deployer.close()
    assert isinstance(failure, NodeError), failure
    assert failure.failure_class == "engine_stopped", failure.message
    assert failure.failure_class in INFRASTRUCTURE
    assert (failure.rank, failure.host) == (1, "127.0.0.1")
    assert failure.message.startswith(f"bench cell {cell.name} failed: "), failure.message
    assert f"; node-1's engine was found stopped on 127.0.0.1: pid {engine} (" in failure.message
    assert "stopped by a signal" in failure.message


def test_an_engine_stopped_while_the_boot_comes_up_is_its_nodes(tmp_path: Path) -> None:
    """The engine is stopped as it loads: its log stops, and the boot wedges. Before, that
    was the config's ``boot_wedge``; now the engine found stopped makes it ``engine_stopped``,
    the node's. (An engine that hangs unstopped stays ``boot_wedge``: test_config_failures.)"""
    data = twin_profile_data(nodes=1)
    data["launcher"]["argv"] = ["{python}", "-c", "import time; time.sleep(600)"]
    data["launcher"]["head_argv"] = []
    data["launcher"]["worker_argv"] = []
    data["gates"]["stall_s"] = 3.0
    prof = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    deployer = deployer_for(prof)
    workdir = Path(prof.cluster.head.workdir)
    stopped: list[int] = []

    def stop_the_engine() -> None:
        wait_for("the engine to start", lambda: engine_of(workdir) is not None)
        stopped.append(engine_of(workdir) or 0)
        os.kill(stopped[0], signal.SIGSTOP)

    try:
        with ThreadPoolExecutor(1) as pool:
            stopper = pool.submit(stop_the_engine)
            with pytest.raises(DeployError) as failed:
                deployer.deploy(prof.initial_champion())
            stopper.result(timeout=30)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        deployer.teardown()
        deployer.close()
    err = failed.value
    assert err.failure_class == "engine_stopped", err.message
    assert err.message.startswith("node-0: boot wedged"), err.message
    assert f"node-0's engine was found stopped on 127.0.0.1: pid {stopped[0]} (" in err.message


def killed_in_a_cell(tmp_path: Path, sig: signal.Signals) -> NodeError:
    """Boot the four-node twin, send ``sig`` to the head's engine process alone (a person's
    ``kill``, a service manager), wait until its group is gone, and measure a cell: the
    cell's failure."""
    prof = load_profile(str(write_profile(tmp_path, twin_profile_data())), base_dir=tmp_path)
    deployer = deployer_for(prof)
    testbed = ClusterTestbed(deployer, prof.cluster.base_url, prof.model)
    try:
        testbed.deploy(prof.initial_champion())
        engine = engine_of(Path(prof.cluster.head.workdir))
        assert engine is not None
        os.kill(engine, sig)
        wait_for("the head's engine group to go", lambda: not deployer.alive(prof.cluster.head))
        with pytest.raises(NodeError) as failed:
            testbed.bench(prof.cells[0])
        return failed.value
    finally:
        deployer.teardown()
        deployer.close()


def test_a_head_killed_from_outside_mid_cell_is_its_nodes_and_sigkill_stays_the_configs(
    tmp_path: Path,
) -> None:
    """The head's engine dies of a SIGTERM that orchestrate did not send: its launcher's
    wrapper records the status (128+15), and the cell's failure is ``engine_killed`` on
    node-0, the node's, naming the signal. Before, it was the config's ``bench_failed``, and
    counted once it reproduced. A SIGKILL (the OOM killer's as much as a person's) stays
    ``bench_failed``: the config's, counted only once it reproduces."""
    (tmp_path / "term").mkdir()
    (tmp_path / "kill").mkdir()
    term = killed_in_a_cell(tmp_path / "term", signal.SIGTERM)
    assert term.failure_class == "engine_killed", term.message
    assert term.failure_class in INFRASTRUCTURE and term.rank == 0
    assert term.message.startswith("node-0: engine exited while cell code-c1 was measured: ")
    assert "killed by SIGTERM from outside on 127.0.0.1" in term.message
    kill = killed_in_a_cell(tmp_path / "kill", signal.SIGKILL)
    assert kill.failure_class == "bench_failed", kill.message
