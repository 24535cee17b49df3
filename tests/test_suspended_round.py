"""A round suspended past its lease (Ctrl-Z, a laptop asleep: SIGSTOP here) while another
``orchestrate round`` took the cluster over and went on with the round: on waking (SIGCONT)
it writes nothing more to the ledger, tears nothing down, and exits 8 with one line; the round
goes on under the one that took it over, undisturbed. A round whose claim on a node another
orchestrator (of another ledger) took while it was suspended stops its cell as it wakes too.

Real processes throughout: a two-node twin cluster, a SQLite ledger, an MLflow sqlite store.
The lease's TTL is shortened (``ORCHESTRATE_LEASE_TTL_S``) so that the takeover comes in
seconds; every wait is on what the processes say or what the ledger and the nodes hold.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import pytest

from cluster import prompts
from cluster.claims import CLAIM_DIR
from cluster.launcher import EVENTS, LOG
from knobs.vocabulary import BootStatus, EventKind, State
from ledger import Ledger
from orchestrator.crashpoints import ENV, SIGNAL_ENV
from tests.fixtures.cli import ORCHESTRATE, orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.wait import wait_until
from tests.test_claims import write_claim
from tests.test_round_twin import engines_alive

CLUSTER = "twin-local"
TTL_S = 6


class Watched:
    """An ``orchestrate`` process whose output (stdout and stderr) is read as it comes."""

    def __init__(self, root: Path, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [*ORCHESTRATE, *args],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=_read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=_read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def said(self, words: str, since: int = 0) -> int:
        """How many lines of stdout there are up to the first after the ``since``-th that has
        ``words`` (0: none yet); the process must be running."""
        assert self.proc.poll() is None, "\n".join(self.out + self.err)
        lines = enumerate(self.out[since:], start=since + 1)
        return next((n for n, line in lines if words in line), 0)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _read(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line.rstrip("\n"))


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(
        ORCHESTRATE_LEDGER=f"sqlite:///{root / 'orchestrate.db'}",
        MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}",
        ORCHESTRATE_ARTIFACTS=str(root / "mlartifacts"),
        ORCHESTRATE_LEASE_TTL_S=str(TTL_S),
    )
    return env


def _profile(root: Path, cells: tuple[str, ...] = ("code-c1", "prose-c8"), **long: float) -> Path:
    """The two-node twin with ``cells`` in that order (each ``long`` named lasts that many
    seconds; the engines log each request when any does)."""
    data = twin_profile_data(nodes=2)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "2"
    if long:
        argv.append("--enable-log-requests")
    data["launcher"]["env"].update(TWIN_BOOT_SCALE="5000")
    data["gates"].update(clocks_command=None, recover_command=None)
    named = {c["name"]: c for c in data["cells"]}
    data["cells"] = [named[name] for name in cells]
    for cell in data["cells"]:
        # long enough that a process is found mid-cell by its output
        cell["warmup_s"] = 0.1
        cell["duration_s"] = long.get(cell["name"].replace("-", "_"), 2.0)
    data["verdict"] = {
        "policy": "threshold",
        "threshold_pct": 2.0,
        "ttft_p90_regression_pct": None,  # a loaded CI box's TTFT is no verdict on a config
    }
    data["proposer"] = {"kind": "sweep", "sweep": [{"cuda_graphs": True}]}
    return write_profile(root, data)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    # whatever happened, no engine outlives the test
    if engines_alive(tmp_path):
        env = {**_env(tmp_path), "ORCHESTRATE_LEASE_TTL_S": ""}
        orchestrate(tmp_path, "cluster", "down", "--force", "-p", "profile.yaml", env=env)
        pytest.fail("an engine outlived the test")


def _expired(root: Path) -> bool:
    """The suspended round's lease has expired in the ledger, and its claim on every node on
    the node's clock: a command may take the cluster over now."""
    with Ledger(_env(root)["ORCHESTRATE_LEDGER"]) as ledger:
        lease = ledger.lease(CLUSTER)
    if lease is None or lease.expires_at >= datetime.now(UTC):
        return False
    for node in (root / "nodes").glob("node-*"):
        expires = (node / CLAIM_DIR / "expires").read_text().strip()
        if int(expires) >= int(time.time()):
            return False
    return True


def test_a_round_woken_after_another_took_it_over_writes_and_stops_nothing(root: Path) -> None:
    _profile(root)
    env = _env(root)
    args = ("round", "--budget", "1", "-p", "profile.yaml")
    b = Watched(root, env, *args)
    c: Watched | None = None
    try:
        # B measures the baseline's second cell (the first is recorded): suspended there
        wait_until("B in its second cell", lambda: b.said("cell 2 of 2"), timeout=120)
        b.proc.send_signal(signal.SIGSTOP)
        wait_until("B's lease and claims expired", lambda: _expired(root), timeout=4 * TTL_S)

        # C takes the cluster over and resumes the round: B's engines stopped, its boot closed
        c = Watched(root, env, *args)
        took = wait_until("C taking over", lambda: c.said("taking over a stale claim"), 60)
        wait_until("C measuring", lambda: c.said("cell ", since=took), timeout=120)
        with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
            (resumed,) = ledger.events(CLUSTER, EventKind.ROUND_RESUMED)
            left_open = resumed.detail["left_open"]
            assert isinstance(left_open, list) and len(left_open) == 1, left_open
            b_boot_id = left_open[0]
            baseline = ledger.experiments(cluster=CLUSTER)[0]
            b_boot = next(x for x in ledger.boots(baseline.id) if x.id == b_boot_id)
            b_cells = [r for r in ledger.cell_results(baseline.id) if r.boot_id == b_boot_id]
        assert b_boot.status == BootStatus.DOWN and b_boot.failure_detail == "interrupted"

        # B wakes while C is mid-cell
        woke = len(b.out)
        b.proc.send_signal(signal.SIGCONT)
        code = b.wait(timeout=120)
        b_after = b.out[woke:]
        assert code == 8, "\n".join(b.out + b.err)
        errors = [line for line in b.err if line.startswith("Error:")]
        assert len(errors) == 1, "\n".join(b.err)
        assert f"lost cluster {CLUSTER} to " in errors[0], errors[0]
        assert "while this one was suspended or away" in errors[0], errors[0]
        assert "the round goes on under that one" in errors[0], errors[0]
        assert not any("tearing down" in line for line in b_after), b_after

        # C goes on undisturbed: its engines were not stopped under it
        assert c.wait(timeout=240) == 0, "\n".join(c.out + c.err)
    finally:
        b.kill()
        if c is not None:
            c.kill()
    assert not any("engine exited" in line for line in c.out + c.err), c.out + c.err

    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.unfinished_round(CLUSTER) is None
        experiments = ledger.experiments(cluster=CLUSTER)
        assert all(e.state == State.DECIDED for e in experiments)
        # B's boot as C closed it, its cells as B recorded them before it was suspended
        boots = {x.id: x for e in experiments for x in ledger.boots(e.id)}
        assert boots[b_boot_id] == b_boot
        cells = [r for r in ledger.cell_results(baseline.id) if r.boot_id == b_boot_id]
        assert cells == b_cells
        # no boot failed (none was stopped under C), and no measurement holds a cell twice
        assert [x.id for x in boots.values() if x.status == BootStatus.FAILED] == []
        for e in experiments:
            measured = Counter(
                (boots[r.boot_id].measurement, r.result.cell, r.repeat)
                for r in ledger.cell_results(e.id)
            )
            assert max(measured.values()) == 1, measured
        # nothing of B's: not its stop either
        assert ledger.events(CLUSTER, EventKind.ROUND_STOPPED) == []


def _suspended(proc: subprocess.Popen[str]) -> bool:
    """``proc`` is stopped (SIGSTOP): its state in /proc is ``T``."""
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def _starts(root: Path, rank: int) -> int:
    """How many times an engine was launched on node ``rank``: the node's own journal."""
    journal = root / "nodes" / f"node-{rank}" / EVENTS
    text = journal.read_text() if journal.exists() else ""
    return sum(1 for line in text.splitlines() if f" start rank={rank} " in line)


def test_a_round_woken_between_a_nodes_line_and_its_launch_launches_nothing(root: Path) -> None:
    """The fence is asked right before a node's launch goes out, not on its `starting …` line:
    a round suspended between the two, and woken after another took the cluster over, does
    not launch that node over the new owner's engine."""
    _profile(root)
    env = _env(root)
    args = ("round", "--budget", "1", "-p", "profile.yaml")
    # B stops itself once its head's `starting node-0 (head)` line is due (its worker up), a
    # moment before the head's launch would go out
    b = Watched(root, {**env, ENV: "node.started@1", SIGNAL_ENV: "SIGSTOP"}, *args)
    c: Watched | None = None
    try:
        wait_until(
            "B suspended before its head's launch",
            lambda: "crashpoint node.started@1: SIGSTOP" in b.err and _suspended(b.proc),
            timeout=120,
        )
        assert _starts(root, 0) == 0 and _starts(root, 1) == 1
        wait_until("B's lease and claims expired", lambda: _expired(root), timeout=4 * TTL_S)

        # C takes the cluster over: B's worker stopped, its boot closed, C's own boot measured
        c = Watched(root, env, *args)
        took = wait_until("C taking over", lambda: c.said("taking over a stale claim"), 60)
        wait_until("C measuring", lambda: c.said("cell ", since=took), timeout=120)

        # B wakes while C's engines serve C's cells
        b.proc.send_signal(signal.SIGCONT)
        code = b.wait(timeout=120)
        assert code == 8, "\n".join(b.out + b.err)
        errors = [line for line in b.err if line.startswith("Error:")]
        assert len(errors) == 1 and f"lost cluster {CLUSTER} to " in errors[0], b.err
        assert c.wait(timeout=240) == 0, "\n".join(c.out + c.err)
    finally:
        b.kill()
        if c is not None:
            c.kill()
    # every launch on the head's node was C's: B launched nothing once it woke
    assert _starts(root, 0) == sum("starting node-0 (head)" in line for line in c.out), c.out
    assert not any("engine exited" in line for line in c.out + c.err), c.out + c.err
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.unfinished_round(CLUSTER) is None
        boots = [x for e in ledger.experiments(cluster=CLUSTER) for x in ledger.boots(e.id)]
        assert [x.id for x in boots if x.status == BootStatus.FAILED] == []


def _prose_requests(log: Path, since: int) -> int:
    """Requests for prose prompts the head's engine logged past byte ``since`` of its log."""
    prose = [
        repr(prompts.build_prompt("prose", 0, i).text[:80])
        for i in range(len(prompts.base_prompts("prose")))
    ]
    with log.open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return sum(1 for line in text.splitlines() if any(p in line for p in prose))


def test_a_cell_in_flight_as_its_round_wakes_taken_over_stops_its_requests(root: Path) -> None:
    """A round suspended mid-cell and woken after another took the cluster over stops that
    cell as soon as it learns the lease is gone: it does not go on loading the new owner's
    engines with its requests for the rest of the cell (nor measure it again)."""
    _profile(root, ("prose-c8", "code-c1"), prose_c8=4.0, code_c1=6.0)
    env = _env(root)
    args = ("round", "--budget", "1", "-p", "profile.yaml")
    b = Watched(root, env, *args)
    c: Watched | None = None
    head_log = root / "nodes" / "node-0" / LOG
    try:
        # B measures its prose cell: suspended there
        wait_until("B in its prose cell", lambda: b.said("cell 1 of 2: prose-c8"), timeout=120)
        b.proc.send_signal(signal.SIGSTOP)
        wait_until("B's lease and claims expired", lambda: _expired(root), timeout=4 * TTL_S)
        c = Watched(root, env, *args)
        took = wait_until("C taking over", lambda: c.said("taking over a stale claim"), 60)
        # C in its code cell: any prose request its head sees from now on is B's
        cell = wait_until("C's code cell", lambda: c.said("cell 2 of 2: code-c1", since=took), 120)
        since = head_log.stat().st_size
        b.proc.send_signal(signal.SIGCONT)
        seen = 0

        def over() -> bool:
            nonlocal seen
            seen = max(seen, _prose_requests(head_log, since))
            return b.proc.poll() is not None or bool(c.said("tearing down", since=cell))

        wait_until("B's end, or C's code cell's", over, timeout=120)
        assert b.wait(timeout=120) == 8, "\n".join(b.out + b.err)
        # at most the one request each of its 8 streams may have sent before the renewal found
        # the lease gone; before, the cell went on for its window and measured again
        assert seen <= 8, seen
        assert c.wait(timeout=240) == 0, "\n".join(c.out + c.err)
    finally:
        b.kill()
        if c is not None:
            c.kill()


def test_a_cell_in_flight_as_its_node_claim_is_found_taken_stops_its_requests(root: Path) -> None:
    """A round suspended mid-cell, whose claim on the head node another orchestrator took
    meanwhile (one of another ledger: the lease stays this round's), stops that cell as soon
    as it learns the claim is lost, as it does for a lost lease: its requests would load an
    engine that may be the new holder's now. Its line names the node and who holds it; the
    ledger blames no config for it."""
    _profile(root, ("prose-c8", "code-c1"), prose_c8=20.0)
    env = _env(root)
    b = Watched(root, env, "round", "--budget", "1", "-p", "profile.yaml")
    head = root / "nodes" / "node-0"
    try:
        wait_until("B in its prose cell", lambda: b.said("cell 1 of 2: prose-c8"), timeout=120)
        b.proc.send_signal(signal.SIGSTOP)
        wait_until("B's lease and claims expired", lambda: _expired(root), timeout=4 * TTL_S)
        # another orchestrator breaks the stale claim on the head and takes it for itself
        shutil.rmtree(head / CLAIM_DIR)
        write_claim(
            head,
            what="round",
            pid=os.getpid(),
            host=socket.gethostname(),
            expires=int(time.time()) + 3600,
        )
        since = (head / LOG).stat().st_size
        b.proc.send_signal(signal.SIGCONT)
        seen = 0

        def over() -> bool:
            nonlocal seen
            seen = max(seen, _prose_requests(head / LOG, since))
            return b.proc.poll() is not None

        wait_until("B's end", over, timeout=240)
        assert b.wait(timeout=60) == 8, "\n".join(b.out + b.err)
    finally:
        b.kill()
    # at most the one request each of its 8 streams may have sent before the renewal found
    # the claim taken; before, the cell went on for its window and the next cell after it
    assert seen <= 8, seen
    errors = [line for line in b.err if line.startswith("Error:")]
    assert len(errors) == 1, "\n".join(b.err)
    assert "node-0 (127.0.0.1): this orchestrator lost its claim on the node" in errors[0]
    assert "it is now claimed by round of cluster elsewhere by someone@" in errors[0], errors[0]
    assert "ledger sqlite:///x.db" in errors[0], errors[0]
    assert "the experiment left undecided" in errors[0], errors[0]
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        # nobody's verdict: no boot failed, nothing decided, the round left to resume
        assert ledger.unfinished_round(CLUSTER) is not None
        experiments = ledger.experiments(cluster=CLUSTER)
        assert [e.id for e in experiments if e.state == State.DECIDED] == []
        boots = [x for e in experiments for x in ledger.boots(e.id)]
        assert [x.id for x in boots if x.status == BootStatus.FAILED] == []
    # the engines it left are brought down, the claim on the head broken by force
    down = orchestrate(
        root,
        "cluster",
        "down",
        "--force",
        "-p",
        "profile.yaml",
        env={**env, "ORCHESTRATE_LEASE_TTL_S": ""},
    )
    assert down.returncode == 0, down.stderr


def _launchers(root: Path) -> dict[Path, int]:
    """Every launcher MLflow holds as an artifact, and when its file last changed."""
    return {p: p.stat().st_ctime_ns for p in (root / "mlartifacts").rglob("launchers/*.sh")}


def test_a_round_woken_after_a_takeover_writes_nothing_to_mlflow(root: Path) -> None:
    """A round suspended between its boot's record and that boot's launchers logged to MLflow,
    woken after another took the cluster over, writes nothing to MLflow (its launchers over
    the new owner's, on the experiment's run they share), as it writes nothing to the ledger."""
    _profile(root)
    env = _env(root)
    args = ("round", "--budget", "1", "-p", "profile.yaml")
    b = Watched(root, {**env, ENV: "smoke.passed", SIGNAL_ENV: "SIGSTOP"}, *args)
    c: Watched | None = None
    try:
        wait_until(
            "B suspended with its boot up",
            lambda: "crashpoint smoke.passed@1: SIGSTOP" in b.err and _suspended(b.proc),
            timeout=120,
        )
        wait_until("B's lease and claims expired", lambda: _expired(root), timeout=4 * TTL_S)
        c = Watched(root, env, *args)
        took = wait_until("C taking over", lambda: c.said("taking over a stale claim"), 60)
        wait_until("C measuring", lambda: c.said("cell ", since=took), timeout=120)
        before = _launchers(root)
        assert before, "C logged its boot's launchers"
        b.proc.send_signal(signal.SIGCONT)
        assert b.wait(timeout=120) == 8, "\n".join(b.out + b.err)
        # (C's own next boot logs its launchers on another experiment's run)
        assert {p: p.stat().st_ctime_ns for p in before} == before
        assert c.wait(timeout=240) == 0, "\n".join(c.out + c.err)
    finally:
        b.kill()
        if c is not None:
            c.kill()
