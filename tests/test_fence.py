"""The fence on a lease holder's writes (``ledger.fence``): a process that lost its cluster to
another orchestrator writes nothing more, whatever it writes; one whose lease merely expired
(nobody took it) goes on; a command that holds no lease is never fenced. And the round loop on
it: a round whose cluster was taken over mid-boot records nothing more and tears nothing down
(the engines are the new holder's). Real ledgers (SQLite and PostgreSQL), the real round loop
on a scripted testbed."""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import pytest
from rich.console import Console

from agents import SweepProposer
from cluster.errors import OwnershipLost
from cluster.launcher import EVENTS
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import BootStatus, EventKind
from ledger import LeaseLost, Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.errors import UsageError
from orchestrator.lease import ClusterLease, still_leased
from orchestrator.profile import load_profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.settings import lease_ttl_s
from orchestrator.testbed import NullSink, deployer_for
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.rounds import a_round
from tests.test_round_policy import ScriptedTestbed, profile

HOST = socket.gethostname()


def _take(ledger: Ledger, cluster: str, holder: str, *, ttl_s: float = 60.0) -> None:
    """``holder`` takes ``cluster``'s lease, whoever had it (as over an expired one)."""
    ledger.acquire_lease(
        cluster, holder=holder, hostname=HOST, pid=os.getpid(), ttl_s=ttl_s, stale=lambda _l: True
    )


def test_a_fenced_ledger_writes_nothing_once_another_holds_the_lease(ledger_url: str) -> None:
    with Ledger(ledger_url) as mine, Ledger(ledger_url) as other:
        # expired at once, and nobody took it: still this holder's, its writes go on
        _take(mine, "c", "a", ttl_s=0.001)
        mine.fence("c", "a")
        rnd = a_round(mine, "c")
        mine.check_fence()
        mine.add_event("c", EventKind.ROUND_RESUMED, subject=str(rnd.id), detail={}, reason="a")

        _take(other, "c", "b")
        with pytest.raises(LeaseLost, match=r"this orchestrator \(a\) lost cluster c to b ") as e:
            mine.add_event("c", EventKind.ROUND_STOPPED, subject=str(rnd.id), detail={}, reason="")
        assert e.value.exit_code == 8 and e.value.lease is not None and e.value.lease.holder == "b"
        assert "while this one was suspended or away: it wrote nothing to the ledger after" in (
            e.value.message
        )
        assert "the round goes on under that one" in e.value.message
        with pytest.raises(LeaseLost):
            a_round(mine, "c")  # a write that flushed its row first: rolled back
        with pytest.raises(LeaseLost):
            mine.check_fence()
        # nothing of it landed; it still reads
        assert [r.id for r in other.rounds("c")] == [rnd.id]
        assert [ev.kind for ev in other.events("c")] == [EventKind.ROUND_RESUMED]
        assert [r.id for r in mine.rounds("c")] == [rnd.id]

        # a command that holds no lease (a person approving from another terminal) writes
        other.add_event("c", EventKind.KNOWN_BAD_CLEARED, subject="1", detail={}, reason="p")
        mine.fence(None)
        mine.add_event("c", EventKind.KNOWN_BAD_CLEARED, subject="2", detail={}, reason="p")

        # taken over and given back since: still lost
        other.release_lease("c", holder="b")
        mine.fence("c", "a")
        with pytest.raises(LeaseLost, match="which has since given it back"):
            mine.add_event("c", EventKind.ROUND_STOPPED, subject="1", detail={}, reason="")


def test_the_lease_taken_over_fails_the_renewal_with_the_same_line(ledger_url: str) -> None:
    with Ledger(ledger_url) as mine, Ledger(ledger_url) as other:
        lease = ClusterLease(mine, "c")
        with lease:
            _take(other, "c", "b")
            with pytest.raises(OwnershipLost, match=rf"\({lease.holder}\) lost cluster c to b "):
                lease.check()
        # the lease left alone (it is b's), and the ledger unfenced once the block ended
        assert (held := other.lease("c")) is not None and held.holder == "b"
        mine.add_event("c", EventKind.KNOWN_BAD_CLEARED, subject="1", detail={}, reason="p")


def test_a_node_stopped_after_its_line_is_fenced_right_before_the_command(
    tmp_path: Path,
) -> None:
    """The fence sits in the deployer, right before each node's stop command goes out, not on
    the node's progress line: a process suspended just after the line ``stopping node-1`` and
    woken after another took the cluster over sends that node nothing (its journal on the
    node says so)."""
    prof = load_profile(str(write_profile(tmp_path, twin_profile_data(nodes=2))), base_dir=tmp_path)
    for node in prof.cluster.nodes:  # as an earlier boot left them
        Path(node.workdir).mkdir(parents=True)
    shown: list[str] = []
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as mine, ClusterLease(mine, "c"):

        def progress(line: str) -> None:
            shown.append(line)
            if line == "stopping node-1":
                _take(mine, "c", "another:1:x")  # suspended here: another took it over

        deployer = deployer_for(prof, progress=progress, fence=lambda: still_leased(mine))
        try:
            with pytest.raises(LeaseLost, match="lost cluster c to another:1:x "):
                deployer.stop_all()
        finally:
            deployer.close()
    assert shown == ["stopping node-0", "stopping node-1"]
    journals = {n.rank: Path(n.workdir) / EVENTS for n in prof.cluster.nodes}
    assert " stop rank=0 rc=0 absent" in journals[0].read_text()
    assert not journals[1].exists() or " stop " not in journals[1].read_text()


class TakenOver(ScriptedTestbed):
    """Every config serves 100 tok/s; as boot ``at`` measures its first cell, another
    orchestrator takes the cluster's lease over (this one suspended meanwhile)."""

    def __init__(self, url: str, at: int) -> None:
        super().__init__(lambda c, n: 100.0)
        self.url = url
        self.at = at
        self.benched: list[tuple[int, str]] = []
        self.stops: list[int] = []

    def bench(self, cell: CellSpec) -> CellResultRecord:
        self.benched.append((len(self.boots), cell.name))
        if len(self.boots) == self.at:
            with Ledger(self.url) as other:
                _take(other, "scripted", "another:1:x")
        return super().bench(cell)

    def stop_all(self) -> None:
        self.stops.append(len(self.boots))
        super().stop_all()


def test_a_round_taken_over_mid_boot_records_and_tears_down_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    testbed = TakenOver(url, at=2)
    with Ledger(url) as ledger, ClusterLease(ledger, "scripted") as lease:
        loop = RoundRunner(
            profile(),
            ledger,
            NullSink(),
            testbed,
            SweepProposer([{"num_speculative_tokens": 5}]),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=io.StringIO(), width=200)),
            guard=lease.check,
        )
        with pytest.raises((LeaseLost, OwnershipLost)) as e:
            loop.run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    assert e.value.exit_code == 8
    assert "lost cluster scripted to another:1:x " in str(e.value)
    # the second boot's cell was measured, then nothing: not recorded, no other cell, and its
    # engines left to the holder that took the cluster over (stopped once, before boot 2)
    assert testbed.benched[-1][0] == 2 and len(testbed.boots) == 2
    assert testbed.stops == [1]
    with Ledger(url) as ledger:
        boots = [b for e in ledger.experiments() for b in ledger.boots(e.id)]
        assert [b.status for b in boots] == [BootStatus.DOWN, BootStatus.UP]
        cells = [r.boot_id for e in ledger.experiments() for r in ledger.cell_results(e.id)]
        assert boots[1].id not in cells
        assert ledger.events("scripted", EventKind.ROUND_STOPPED) == []


def test_the_lease_ttl_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHESTRATE_LEASE_TTL_S", raising=False)
    assert lease_ttl_s() == 120.0
    monkeypatch.setenv("ORCHESTRATE_LEASE_TTL_S", "6")
    assert lease_ttl_s() == 6.0
    for bad in ("2", "soon", "nan", "inf", "-5"):
        monkeypatch.setenv("ORCHESTRATE_LEASE_TTL_S", bad)
        with pytest.raises(UsageError, match="ORCHESTRATE_LEASE_TTL_S"):
            lease_ttl_s()
