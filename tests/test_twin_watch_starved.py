"""The twin head's rendezvous watch, itself kept off the CPU, says so in the engine's log and
holds nothing: its rank's beats waited unread, and the time since the rank was last heard was
this host's, not the rank's. Real twin engines, a real SIGSTOP of the head's process."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.bench import smoke
from cluster.twin.rendezvous import SILENT_S
from tests.twin_fixtures import (
    TwinNodes,
    running_nodes,
)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[TwinNodes]:
    with running_nodes(tmp_path) as started:
        yield started


def test_a_head_whose_watch_was_starved_says_so_and_its_rank_was_not_silent(
    nodes: TwinNodes,
) -> None:
    """The head's process is kept off the CPU (stopped) for longer than a rank may be silent,
    as a host busy for seconds keeps it; its worker beat all the while. Before, the head's
    steps read the rank as unheard for over 5 s and held the group's tokens until the watch
    ran again, with no line in the log; now the watch says it was kept off the CPU, that the
    beats were waiting, and that the engine was not held for them."""
    head, worker, url = nodes.group()
    head.signal(signal.SIGSTOP)
    try:
        time.sleep(SILENT_S + 1.0)  # the fault's length, not a wait for an event
    finally:
        head.signal(signal.SIGCONT)
    said = head.wait_for(
        r"WARNING .*The watch of node rank 1 was kept off the CPU for ([0-9.]+)s \(this host "
        r"busy, or this process stopped\): its beats were waiting, read late; the rank was not "
        r"silent, and the engine was not held for it\.",
        timeout=30,
    )
    assert float(said.group(1)) >= SILENT_S, said.group(0)
    assert smoke(url, "glm53", timeout=30).strip()
    # the rank beat all the while: no line says it went silent
    assert "has not answered" not in head.log, head.log
    assert head.proc.poll() is None and worker.proc.poll() is None
