"""A worker's engine stopped for seconds while a cell measures (a person's ``kill -STOP`` then
``kill -CONT``, a host suspended a moment, a debugger's breakpoint) is its node's: neither the
config's nor a busy host's. The stopped process's state is the evidence only while it lasts,
so the cell looks while its engine is silent (``cluster.stopped``). Real twin engines, real
signals to their processes."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.profile import load_profile
from orchestrator.testbed import ClusterTestbed, deployer_for
from tests.fixtures.profiles import small_twin_profile_data, write_profile
from tests.test_engine_signals import stop_worker_till_the_head_waits

#: how long the worker stays stopped once the cell waits on its silent head: the fault's
#: length (a person's ``kill -STOP; sleep; kill -CONT``), not a wait for an event
STOPPED_FOR_S = 5.0


def test_a_worker_stopped_for_seconds_mid_cell_is_measured_again_as_its_nodes_not_a_busy_host(
    tmp_path: Path,
) -> None:
    """Worker 1's engine is stopped; once the head holds the group's tokens for it, a cell is
    measured, and the worker is continued 5 s into the cell's wait. Before, the head's late
    deliveries read as its host's stall, `stalled 8.1s around the 0.6s window (client 0.00s,
    engine 8.10s: a busy host), measuring again`: a user looked for a load that was not there,
    and a kept window of it counted toward the busy-host stop. Now the cell found the worker
    stopped while its head was silent, says so, and measures again; the window kept is one
    no stop touched."""
    prof = load_profile(str(write_profile(tmp_path, small_twin_profile_data())), base_dir=tmp_path)
    shown: list[str] = []
    waiting = threading.Event()

    def progress(line: str) -> None:
        shown.append(line)
        if "no token" in line:
            waiting.set()

    deployer = deployer_for(prof, progress=progress)
    testbed = ClusterTestbed(deployer, prof.cluster.base_url, prof.model)
    worker = next(n for n in prof.cluster.nodes if n.rank == 1)
    cell = prof.cells[0]
    engine = None
    try:
        testbed.deploy(prof.initial_champion())
        engine = stop_worker_till_the_head_waits(prof, worker.workdir)
        with ThreadPoolExecutor(1) as pool:
            bench = pool.submit(testbed.bench, cell)
            try:
                assert waiting.wait(timeout=60), shown
                # the fault's length, then the worker goes on (as a person's kill -CONT)
                bench.exception(timeout=STOPPED_FOR_S)
            except TimeoutError:
                pass
            finally:
                os.kill(engine, signal.SIGCONT)
            record = bench.result(timeout=120)
    finally:
        if engine is not None:
            os.kill(engine, signal.SIGCONT)
        deployer.teardown()
        deployer.close()
    found = [line for line in shown if "engine was found stopped" in line]
    assert found, "\n".join(shown)
    assert found[0].startswith(
        f"{cell.name}: node-1's engine was found stopped on 127.0.0.1: pid {engine} ("
    ), found
    assert "stopped by a signal" in found[0] and "measuring again (2/3)" in found[0], found
    assert "neither the config's nor a busy host's" in found[0], found
    # the stop's gap is no host's stall: no line says it was one (a loaded machine may
    # stall a later window a little, said as a stall of its own)
    stalls = [line for line in shown if ": stalled " in line]
    assert all(float(line.split(": stalled ")[1].split("s ")[0]) < 2.0 for line in stalls), shown
    assert record.measured_again >= 1 and record.engine_found_stopped >= 1, record
    assert record.engine_stall_s < 2.0 and record.output_throughput > 0, record
