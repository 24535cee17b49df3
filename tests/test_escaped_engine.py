"""A native engine that escapes its launcher's process group (it daemonizes: a child in a
session of its own) is stopped with its group, and the node's stop says so: before, the stop
signalled the group only and said ``stopped`` while the escaped process ran on. Real
processes: node 0 is an sshd test host, the deployer reaches it over SSH."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from orchestrator.profile import load_profile
from orchestrator.testbed import deployer_for
from tests.fixtures.profiles import write_profile
from tests.fixtures.sshd import SshCluster
from tests.fixtures.wait import wait_until
from tests.test_engine_containers import failed_boot, profile_data


def _marked(tag: str) -> list[int]:
    """This user's processes whose command line holds ``tag``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if tag in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(int(proc.name))
    return found


def test_an_engine_that_daemonized_is_stopped_with_its_group_and_the_stop_says_so(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    tag = f"escaped-{os.getpid()}-{tmp_path.name}"
    sleeper = f"import time; time.sleep(600)  # {tag}"
    data = profile_data(ssh_cluster, container=False)
    script = (
        f"setsid {{python}} -c '{sleeper} daemon' </dev/null >/dev/null 2>&1 & "
        f"exec {{python}} -c '{sleeper}'"
    )
    data["launcher"]["argv"] = ["bash", "-c", script]
    (tmp_path / "boot").mkdir()
    prof = load_profile(str(write_profile(tmp_path / "boot", data)))
    deployer = deployer_for(prof)
    try:
        failed_boot(deployer, prof.initial_champion())
        wait_until("the engine to daemonize", lambda: len(_marked(tag)) == 2, 30)
        [daemon] = [p for p in _marked(tag) if os.getsid(p) == p]
        outcomes = deployer.teardown()
        left = _marked(tag)
    finally:
        deployer.close()
        for pid in _marked(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == [], f"still running after the node's stop: {left}"
    assert outcomes[0].startswith("stopped; "), outcomes
    assert (
        f"; pid {daemon} (python" in outcomes[0]
        and "had escaped the launcher's process group and still ran: stopped too" in outcomes[0]
    ), outcomes
