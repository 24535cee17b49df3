"""One owner per node (issue #17): claims on the nodes themselves, whatever the ledger; twin
ports and a rendezvous token per cluster. Real orchestrate processes, real twin engines, real
sshd hosts; a claim is changed behind a holder's back by writing its files, as another
orchestrator would."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.claim_holder import Holder
from cluster.claims import CLAIM_DIR, NodeClaims
from cluster.connect import open_transport
from cluster.errors import ClaimHeld, OwnershipLost, WorkdirUnwritable
from cluster.gates import DEFAULT_FAILURE_PATTERNS
from cluster.ports import PORTS_FILE
from knobs.vocabulary import EventKind, Kind, ProposalStatus
from ledger import Ledger
from orchestrator.profile import load_profile
from tests.fixtures.cli import ORCHESTRATE, orchestrate
from tests.fixtures.mounts import in_tmpfs
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.sshd import SshCluster
from tests.fixtures.wait import wait_until
from tests.twin_fixtures import (
    WORKER_READY_LINE,
    TwinNodes,
    free_port,
    running_nodes,
    serve_argv,
)


def env_for(directory: Path) -> dict[str, str]:
    """The environment of an orchestrate process whose ledger and MLflow live in ``directory``."""
    return {
        **os.environ,
        "ORCHESTRATE_LEDGER": f"sqlite:///{directory}/orchestrate.db",
        "MLFLOW_TRACKING_URI": f"sqlite:///{directory}/mlflow.db",
        "ORCHESTRATE_ARTIFACTS": str(directory / "mlartifacts"),
    }


def quick_profile(directory: Path, **cluster: Any) -> Path:
    """The twin test profile with one short cell, one boot a verdict and fast boots."""
    data = twin_profile_data()
    data["cells"] = data["cells"][:1]
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0}
    data["launcher"]["env"]["TWIN_BOOT_SCALE"] = "4000"
    data["cluster"].update(cluster)
    return write_profile(directory, data)


def write_claim(workdir: Path, *, what: str, pid: int, host: str, expires: int) -> str:
    """Another holder's claim, written as ``cluster.claims`` writes one; its id."""
    claim = workdir / CLAIM_DIR
    claim.mkdir(parents=True, exist_ok=True)
    holder_id = uuid.uuid4().hex
    holder: dict[str, object] = {"id": holder_id, "what": what, "cluster": "elsewhere"}
    holder.update(ledger="sqlite:///x.db", user="someone", hostname=host, pid=pid)
    (claim / "holder.json").write_text(json.dumps(holder) + "\n")
    (claim / "expires").write_text(f"{expires}\n")
    (claim / "id").write_text(f"{holder_id}\n")
    return holder_id


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Path]:
    """A folder with its own ledger; whatever the test left running is brought down."""
    yield tmp_path
    for profile in tmp_path.glob("*/profile.yaml"):
        orchestrate(profile.parent, "cluster", "down", "--force", "-p", str(profile), timeout=60)
    if (tmp_path / "profile.yaml").exists():
        orchestrate(tmp_path, "cluster", "down", "--force", "-p", "profile.yaml", timeout=60)


def test_another_ledger_is_refused_a_lost_claim_stops_the_round_and_force_is_recorded(
    demo: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    profile = quick_profile(demo)
    ledger_a = env_for(demo)["ORCHESTRATE_LEDGER"]
    other = env_for(tmp_path_factory.mktemp("other-ledger"))
    round_a = [*ORCHESTRATE, "round", "--budget", "1", "--approve", "queue", "-p", str(profile)]
    proc = subprocess.Popen(
        round_a,
        cwd=demo,
        env=env_for(demo),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the baseline is measured, then the candidate waits in the queue: the round holds
        # every node and boots nothing until it is approved
        def pending() -> int | None:
            assert proc.poll() is None, "the round ended early"
            with Ledger(ledger_a) as ledger:
                waiting = ledger.proposals(status=ProposalStatus.PENDING)
            return waiting[0].id if waiting else None

        proposal = wait_until("a pending proposal", pending, timeout=90, interval=0.2)

        refused = orchestrate(demo, "round", "--budget", "1", "-p", str(profile), env=other)
        assert refused.returncode == 8, refused.stderr
        assert len(error_lines(refused.stderr)) == 1, refused.stderr
        assert "node-0 (127.0.0.1) is claimed by another orchestrator: round of cluster " in (
            refused.stderr
        )
        assert f"ledger {ledger_a}" in refused.stderr

        down = orchestrate(demo, "cluster", "down", "-p", str(profile), env=other)
        assert down.returncode == 8 and "is claimed by another orchestrator" in down.stderr

        # another orchestrator takes node-1 behind the round's back
        write_claim(
            demo / "nodes" / "node-1",
            what="test",
            pid=os.getpid(),
            host=socket.gethostname(),
            expires=int(time.time()) + 3600,
        )
        approved = orchestrate(demo, "proposals", "approve", str(proposal), env=env_for(demo))
        assert approved.returncode == 0, approved.stderr
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 8, err
    assert len(error_lines(err)) == 1, err
    assert "node-1 (127.0.0.1): this orchestrator lost its claim on the node" in err
    assert "the experiment left undecided: run the same command to resume" in err
    with Ledger(ledger_a) as ledger:
        candidate = next(e for e in ledger.experiments() if e.kind == "candidate")
        assert candidate.state != "decided"
        assert ledger.open_boots() == []
        assert ledger.unfinished_round("twin-local") is not None

    # the round's own claims are gone; the other holder's is not
    assert not (demo / "nodes" / "node-0" / CLAIM_DIR).exists()
    resumed = orchestrate(demo, "round", "--budget", "1", "-p", str(profile), env=env_for(demo))
    assert resumed.returncode == 8 and "claimed by another orchestrator: test of" in resumed.stderr

    broken = orchestrate(demo, "cluster", "down", "--force", "-p", str(profile), env=env_for(demo))
    assert broken.returncode == 0, broken.stderr
    assert "node-1: broke the claim of test of cluster elsewhere" in broken.stdout
    with Ledger(ledger_a) as ledger:
        (event,) = ledger.events("twin-local", EventKind.CLAIM_BROKEN)
    assert event.subject == "node 1 127.0.0.1"
    assert event.detail["holder"]["what"] == "test"  # type: ignore[index]
    assert event.reason == "broken by --force while live"

    final = orchestrate(
        demo, "round", "--budget", "1", "--approve", "queue", "-p", str(profile), "--json",
        env=env_for(demo),
    )  # fmt: skip
    assert final.returncode == 0, final.stderr
    report = json.loads(final.stdout)
    assert report["resumed"] is True
    assert report["experiments"][1]["experiment"] == candidate.id
    assert report["experiments"][1]["state"] == "decided"


def test_a_stale_claim_is_taken_over_with_a_line(demo: Path) -> None:
    profile = quick_profile(demo)
    node = demo / "nodes" / "node-2"
    write_claim(node, what="round", pid=1, host="gone-host", expires=int(time.time()) - 30)
    down = orchestrate(demo, "cluster", "down", "-p", str(profile), env=env_for(demo))
    assert down.returncode == 0, down.stderr
    taken = r"node-2: taking over a stale claim \(round of cluster elsewhere by someone@gone-host"
    assert re.search(taken + r" \(pid 1\).*\): it expired \d+s ago", down.stdout), down.stdout
    assert not (node / CLAIM_DIR).exists(), "taken over, then released when the command ended"
    assert not (demo / "orchestrate.db").exists(), "nothing to record: no ledger opened"


def test_one_holders_stale_claims_are_taken_over_in_one_line(demo: Path) -> None:
    """A round killed -9 leaves a claim on every node, its process gone: taking them over is
    said once, naming every node (the review: four lines alike but for their seconds left)."""
    profile = quick_profile(demo)
    probe = subprocess.Popen(["true"])
    probe.wait()
    nodes = load_profile(str(profile)).cluster.nodes
    assert len(nodes) >= 2, nodes
    for node in nodes:
        write_claim(
            demo / "nodes" / node.name,
            what="round",
            pid=probe.pid,
            host=socket.gethostname(),
            expires=int(time.time()) + 600,
        )
    down = orchestrate(demo, "cluster", "down", "-p", str(profile), env=env_for(demo))
    assert down.returncode == 0, down.stderr
    lines = [line for line in down.stdout.splitlines() if "taking over a stale claim" in line]
    names = ", ".join(node.name for node in nodes)
    assert len(lines) == 1, down.stdout
    assert lines[0].startswith(f"{names}: taking over a stale claim (round of cluster elsewhere"), (
        lines
    )
    assert lines[0].endswith(f"its process {probe.pid} on this machine is gone"), lines


def test_two_twin_demos_side_by_side(demo: Path) -> None:
    dirs = [demo / "a", demo / "b"]
    procs = []
    for d in dirs:
        d.mkdir()
        profile = quick_profile(d, port="auto")
        procs.append(
            subprocess.Popen(
                [*ORCHESTRATE, "round", "--budget", "1", "-p", str(profile), "--json"],
                cwd=d,
                env=env_for(d),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outs = [p.communicate(timeout=150) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert [e["state"] for e in json.loads(out)["experiments"]] == ["decided", "decided"]
    ports = [(d / "nodes" / "node-0" / PORTS_FILE).read_text() for d in dirs]
    assert ports[0] != ports[1]
    clusters = [load_profile(str(d / "profile.yaml"), base_dir=d).cluster for d in dirs]
    assert [f"{c.port} {c.master_port}\n" for c in clusters] == ports
    assert clusters[0].token != clusters[1].token
    for d, c in zip(dirs, clusters, strict=True):
        launcher = (d / "nodes" / "node-1" / "launcher.sh").read_text()
        assert f"export TWIN_RENDEZVOUS_TOKEN={c.token}" in launcher
        assert f"--master-port {c.master_port}" in launcher.replace(" \\\n  ", " ")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[TwinNodes]:
    with running_nodes(tmp_path) as started:
        yield started


def test_a_worker_of_another_cluster_never_joins(nodes: TwinNodes) -> None:
    master = free_port()
    group = (
        *("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(master)),
        *("--tensor-parallel-size", "2"),
    )
    worker_argv = serve_argv(extra=(*group, "--node-rank", "1", "--headless"))
    # the same ports and the same command line: only the cluster's token tells them apart
    foreign = nodes.start(worker_argv, name="foreign", TWIN_RENDEZVOUS_TOKEN="b" * 16)
    foreign.wait_for(WORKER_READY_LINE)
    head = nodes.start(
        serve_argv(port=free_port(), extra=(*group, "--node-rank", "0")),
        name="head",
        TWIN_RENDEZVOUS_TOKEN="a" * 16,
    )
    assert foreign.wait_exit() == 1
    line = foreign.wait_for(r"ERROR .*rejected this rank: rendezvous token does not match")
    assert any(re.search(p, line.string) for p in DEFAULT_FAILURE_PATTERNS["worker_missing"])
    head.wait_for(r"WARNING .*Refused node rank 1 from 127\.0\.0\.1:\d+: its rendezvous token")
    # the head was not failed by it: it waited for its own worker, which never came
    assert head.wait_exit() == 1
    head.wait_for(r"ERROR .*timed out .*waiting for node rank\(s\) 1 to join")
    assert "joined" not in head.log


def test_claims_over_ssh_refuse_a_second_holder_and_a_broken_one_is_lost(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    cluster = load_profile(str(write_profile(tmp_path, ssh_cluster.profile_data()))).cluster

    def transports() -> dict[int, Any]:
        return {n.rank: open_transport(n, cluster.ssh) for n in cluster.nodes}

    first = Holder.this_process("round", cluster.name, "sqlite:///a.db")
    second = Holder.this_process("round", cluster.name, "postgresql://u:***@db/b")
    noted: list[str] = []
    broken: list[str] = []
    with NodeClaims(cluster, transports(), first) as held:
        held.check()
        refused = pytest.raises(ClaimHeld, match=r"node-0 \(.*\) is claimed by another")
        with refused, NodeClaims(cluster, transports(), second):
            pass
        forced = NodeClaims(
            cluster,
            transports(),
            second,
            force=True,
            note=noted.append,
            broken=lambda node, seen, why: broken.append(f"{node.name} {seen.describe()}"),
        )
        with forced, pytest.raises(OwnershipLost, match="this orchestrator lost its claim"):
            held.check()
        assert len(broken) == len(cluster.nodes)
        assert all("ledger sqlite:///a.db" in b for b in broken)
    for node in cluster.nodes:
        assert not (Path(node.workdir) / CLAIM_DIR).exists()


def test_cluster_down_closes_the_boots_a_killed_run_left_open_unless_a_round_holds_them(
    demo: Path,
) -> None:
    """``status`` after a killed round says its boot is open and that ``cluster down`` stops
    it. Before, ``cluster down`` stopped the engines and left the boot open, so ``status``
    said the same after it (and the boot's GPU-hours ran on until the next round). Now the
    boot is closed once every node is stopped; not while a live round holds the lease (its
    boots are its own), and the lease of a round killed a moment ago is not live."""
    profile = quick_profile(demo)
    env = env_for(demo)
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        rnd = ledger.create_round(
            cluster="twin-local",
            profile_name="twin",
            profile_digest="",
            budget=1,
            proposer="sweep",
            approve="auto",
            seed=0,
        )
        config = load_profile(str(profile)).initial_champion()
        e = ledger.add_experiment(
            cluster="twin-local",
            round_id=rnd.id,
            kind=Kind.BASELINE,
            config=config,
            champion_key=None,
            champion_objective=None,
        )
        boot = ledger.start_boot(e.id, config)
        ledger.acquire_lease(
            "twin-local",
            holder="a live round",
            hostname=socket.gethostname(),
            pid=os.getpid(),
            ttl_s=600,
            stale=lambda lease: False,
        )
    down = orchestrate(demo, "cluster", "down", "-p", str(profile), env=env)
    assert down.returncode == 0, down.stderr
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        assert [b.id for b in ledger.open_boots("twin-local")] == [boot.id]
        # the round is killed: its process gone, its lease not expired yet
        gone = subprocess.Popen(["true"])
        gone.wait()
        ledger.release_lease("twin-local", holder="a live round")
        ledger.acquire_lease(
            "twin-local",
            holder="a killed round",
            hostname=socket.gethostname(),
            pid=gone.pid,
            ttl_s=600,
            stale=lambda lease: False,
        )
    said = orchestrate(demo, "status", "-p", str(profile), env=env)
    assert "lease: a killed round until" in said.stdout
    # when its command was last heard of, and what that means (the review's D: a kill
    # outside a boot left no line of when or how the last command ended)
    assert "(not held: its process is gone, last heard from at " in said.stdout, said.stdout
    assert " UTC: killed, or its machine went down)" in said.stdout, said.stdout
    down = orchestrate(demo, "cluster", "down", "-p", str(profile), env=env)
    assert down.returncode == 0, down.stderr
    assert "closed 1 boot(s) a killed run had left open in the ledger" in down.stdout
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        assert ledger.open_boots("twin-local") == []
        [closed] = ledger.boots(e.id)
        assert (closed.status, closed.failure_detail) == ("down", "cluster down")
    status = orchestrate(demo, "status", "-p", str(profile), env=env)
    assert status.returncode == 0, status.stderr
    assert "boot(s) open" not in status.stdout


def test_a_claim_that_fails_says_what_the_node_said(tmp_path: Path) -> None:
    """A claim the node's shell could not make is said with the node's own words (here a
    workdir under a file), not only with an exit code, and as the setup's: no waiting for
    the node fixes a file in its workdir's path."""
    (tmp_path / "a-file").write_text("")
    data = twin_profile_data()
    data["cluster"]["nodes"] = [
        {"rank": 0, "host": "127.0.0.1", "workdir": str(tmp_path / "a-file" / "node-0")}
    ]
    cluster = load_profile(str(write_profile(tmp_path, data))).cluster
    (node,) = cluster.nodes
    holder = Holder.this_process("round", cluster.name, "sqlite:///a.db")
    with pytest.raises(WorkdirUnwritable) as caught:
        NodeClaims(cluster, {0: open_transport(node, cluster.ssh)}, holder).__enter__()
    said = caught.value.message
    assert said.startswith(
        f"node-0 (127.0.0.1): its workdir {tmp_path}/a-file/node-0 cannot be written (a "
        f"regular file is in its path: mkdir: cannot create directory '{tmp_path}/a-file': "
        "Not a directory)"
    ), said
    assert "waiting will not fix it: move that file aside on the node" in said, said
    assert caught.value.returncode == 3 and "Not a directory" in caught.value.stderr_tail


def read_only(folder: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``folder`` with a read-only file system mounted on it."""
    return in_tmpfs(folder, *argv, env=env, read_only=True)


def test_a_read_only_working_folder_is_said_as_such_not_as_a_node_away(tmp_path: Path) -> None:
    """The twin's nodes' workdirs are under the folder the command runs in: a read-only one
    is said as the node's file system refusing writes, with what to do (exit 6), not as a
    node away to wait for (exit 5)."""
    elsewhere = {**env_for(tmp_path), "COLUMNS": "400"}
    done = read_only(tmp_path / "ro", *ORCHESTRATE, "round", "--budget", "1", env=elsewhere)
    said = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 6, done.stderr[-2000:]
    assert said.startswith(
        f"Error: node-0 (127.0.0.1): its workdir {tmp_path}/ro/.orchestrate/twin/node-0 cannot "
        "be written (a read-only file system: mkdir: cannot create directory "
        f"'{tmp_path}/ro/.orchestrate': Read-only file system)"
    ), said
    assert "make the folder writable on the node, or point the node's workdir" in said
    assert "once the node is back" not in said


def test_a_ledger_in_a_read_only_folder_says_the_folder_and_what_to_set(tmp_path: Path) -> None:
    """The default ledger (``orchestrate.db`` in the folder the command runs in) where that
    folder is read-only: the folder, why, and where else to put the ledger (exit 4)."""
    default = {k: v for k, v in env_for(tmp_path).items() if k != "ORCHESTRATE_LEDGER"}
    done = read_only(tmp_path / "ro2", *ORCHESTRATE, "round", "--budget", "1", env=default)
    said = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 4, done.stderr[-2000:]
    assert said == (
        f"Error: ledger sqlite:///orchestrate.db: the folder {tmp_path}/ro2 cannot be written "
        "(a read-only file system), and SQLite writes the ledger and its journal there: make "
        "the folder writable, or set ORCHESTRATE_LEDGER (or the profile's ledger_url) to a "
        "file in a writable folder (sqlite:////abs/path/orchestrate.db)"
    ), said
