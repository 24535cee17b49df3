"""The ledger's contract, run against every backend (SQLite file and a real PostgreSQL)."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from knobs import KnobSpace, catalog
from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import BootStatus, Kind, ProposalStatus, State
from ledger import (
    HEADER,
    LeaseHeld,
    LeaseLost,
    Ledger,
    LedgerError,
    RoundRecord,
    VerdictRecord,
    tsv_text,
)
from tests.fixtures.mounts import in_tmpfs

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))


def _cell(name: str, tok_s: float) -> CellResultRecord:
    return CellResultRecord(
        cell=name,
        category="code",
        concurrency=1,
        context_tokens=0,
        duration=2.0,
        completed=4,
        total_output_tokens=int(tok_s * 2),
        output_throughput=tok_s,
        per_request_throughput=tok_s,
        mean_ttft_ms=10,
        median_ttft_ms=10,
        p90_ttft_ms=12,
        p99_ttft_ms=13,
        median_itl_ms=5,
        effective_concurrency=1.0,
        accepted_per_step=3.5,
        fingerprints={"code-0": "abc"},
    )


def _spec(name: str) -> CellSpec:
    """The definition ``_cell`` measured."""
    return CellSpec(name=name, category="code", concurrency=1)


@pytest.fixture
def open_ledger() -> Iterator[Callable[[str], Ledger]]:
    """Opens ledgers and closes every one of them after the test."""
    opened: list[Ledger] = []

    def open_(url: str) -> Ledger:
        opened.append(Ledger(url))
        return opened[-1]

    yield open_
    for ledger in opened:
        ledger.close()


def _open_at_once(url: str, barrier: Any, errors: Any) -> None:
    """In a child process: wait for the others, then open (and create) the ledger."""
    barrier.wait()
    try:
        with Ledger(url):
            pass
    except LedgerError as e:
        errors.put(e.message)
    else:
        errors.put("")


def _race(urls: list[str], processes: int) -> list[str]:
    """``processes`` processes open each new ledger of ``urls`` at the same instant."""
    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for url in urls:
        barrier, errors = ctx.Barrier(processes), ctx.Queue()
        children = [
            ctx.Process(target=_open_at_once, args=(url, barrier, errors)) for _ in range(processes)
        ]
        for child in children:
            child.start()
        results = [errors.get(timeout=60) for _ in children]
        for child in children:
            child.join(timeout=60)
            assert child.exitcode == 0
        failures += [r for r in results if r]
    return failures


def test_processes_creating_a_new_sqlite_ledger_at_once_all_succeed(tmp_path: Path) -> None:
    """A round starting while ``orchestrate proposals`` opens its new ledger from another
    shell: both create the tables and the schema row; the loser must retry, not fail."""
    urls = [f"sqlite:///{tmp_path}/race-{i}.db" for i in range(6)]
    assert _race(urls, processes=6) == []
    with Ledger(urls[0]) as ledger:
        assert ledger.rounds("nothing") == []


def test_processes_creating_a_new_postgres_ledger_at_once_all_succeed(pg_url: str) -> None:
    assert _race([pg_url], processes=6) == []


def _new_round(
    ledger: Ledger, cluster: str = "c", *, budget: int = 1, proposer: str = "optuna", seed: int = 0
) -> RoundRecord:
    """A round of profile ``p`` on ``cluster``, approved automatically."""
    return ledger.create_round(
        cluster=cluster,
        profile_name="p",
        profile_digest="d",
        budget=budget,
        proposer=proposer,
        approve="auto",
        seed=seed,
    )


def _keep(reason: str = "r") -> VerdictRecord:
    return VerdictRecord(status="keep", rule="test", reason=reason, stats={"x": 1.5})


def test_round_experiment_champion_lifecycle(
    ledger_url: str, open_ledger: Callable[[str], Ledger]
) -> None:
    ledger = open_ledger(ledger_url)
    rnd = _new_round(ledger, budget=2, proposer="sweep", seed=3)
    assert ledger.unfinished_round("c") == rnd
    assert ledger.champion("c") is None
    base = SPACE.default_config()
    e0 = ledger.add_experiment(
        cluster="c",
        round_id=rnd.id,
        kind=Kind.BASELINE,
        config=base,
        champion_key=None,
        champion_objective=None,
    )
    for state in (State.DEPLOYING, State.BENCHING, State.MEASURED):
        ledger.set_state(e0.id, state)
    boot = ledger.start_boot(e0.id, base)
    ledger.add_cell_result(e0.id, boot.id, _cell("code-c1", 100.0), spec=_spec("code-c1"))
    ledger.end_boot(boot.id, status=BootStatus.DOWN)
    decided = ledger.decide(
        e0.id, verdict=_keep(), objective=100.0, delta_pct=0.0, accept_len=3.5, promote=True
    )
    assert decided.state == "decided" and decided.status == "keep"
    champion = ledger.champion("c")
    assert champion is not None and champion.config == base and champion.objective == 100.0

    p = ledger.add_proposal(
        round_id=rnd.id,
        source="sweep",
        knob="num_speculative_tokens",
        old_value=7,
        new_value=5,
        champion_key=base.key,
        hypothesis="h",
    )
    assert [x.id for x in ledger.proposals(status=ProposalStatus.PENDING)] == [p.id]
    approved = ledger.decide_proposal(p.id, status=ProposalStatus.APPROVED, by="auto")
    assert approved.status == "approved" and approved.new_value == 5
    with pytest.raises(LedgerError, match="already approved"):
        ledger.decide_proposal(p.id, status=ProposalStatus.VETOED, by="x")
    change = SPACE.change(base, "num_speculative_tokens", 5)
    e1 = ledger.add_experiment(
        cluster="c",
        round_id=rnd.id,
        kind=Kind.CANDIDATE,
        config=base.apply(change),
        champion_key=base.key,
        champion_objective=100.0,
        proposal_id=p.id,
        knob="num_speculative_tokens",
        value=5,
    )
    ledger.decide(
        e1.id, verdict=_keep(), objective=110.0, delta_pct=10.0, accept_len=3.0, promote=True
    )
    assert ledger.champion("c").config == base.apply(change)  # type: ignore[union-attr]
    assert [c.objective for c in ledger.champion_history("c")] == [100.0, 110.0]
    assert ledger.verdict(e1.id) == _keep()
    with pytest.raises(LedgerError, match="already decided"):
        ledger.set_state(e1.id, State.BENCHING)
    ledger.finish_round(rnd.id)
    assert ledger.unfinished_round("c") is None
    assert ledger.champion("other") is None


def test_cell_results_round_trip_and_are_unique(
    ledger_url: str, open_ledger: Callable[[str], Ledger]
) -> None:
    ledger = open_ledger(ledger_url)
    rnd = _new_round(ledger)
    e = ledger.add_experiment(
        cluster="c",
        round_id=rnd.id,
        kind=Kind.BASELINE,
        config=SPACE.default_config(),
        champion_key=None,
        champion_objective=None,
    )
    boot = ledger.start_boot(e.id, e.config)
    cell = _cell("code-c1", 42.5)
    ledger.add_cell_result(e.id, boot.id, cell, spec=_spec("code-c1"))
    assert ledger.cell_results(e.id) == [(boot.id, 0, cell, _spec("code-c1"))]
    with pytest.raises(LedgerError):
        ledger.add_cell_result(e.id, boot.id, cell, spec=_spec("code-c1"))
    assert ledger.cell_results(e.id) == [(boot.id, 0, cell, _spec("code-c1"))]
    assert [b.id for b in ledger.open_boots()] == [boot.id]
    ledger.end_boot(
        boot.id, status=BootStatus.FAILED, failure_class="oom", failure_detail="OOM on head"
    )
    assert ledger.open_boots() == []
    assert ledger.boots(e.id)[0].failure_class == "oom"


def test_a_clusters_boots_and_cells_read_at_once_are_each_experiments_and_verdicts_stay_fresh(
    ledger_url: str, open_ledger: Callable[[str], Ledger]
) -> None:
    """``cluster_boots`` and ``cluster_cell_results`` (the noise model reads every experiment's
    at each step, in two queries) are ``boots`` and ``cell_results`` of each experiment of the
    cluster, no other cluster's; a verdict another connection writes after this one found
    none is read (only a verdict found is kept: a verdict never changes)."""
    ledger = open_ledger(ledger_url)
    other = open_ledger(ledger_url)
    experiments = []
    for cluster, count in (("c", 3), ("elsewhere", 1)):
        rnd = _new_round(ledger, cluster=cluster, budget=count)
        for i in range(count):
            e = ledger.add_experiment(
                cluster=cluster,
                round_id=rnd.id,
                kind=Kind.BASELINE if i == 0 else Kind.CANDIDATE,
                config=SPACE.default_config(),
                champion_key=None,
                champion_objective=None,
            )
            experiments.append(e)
    # boots interleaved across experiments and clusters: experiment i has i + 1 of them
    for b in range(3):
        for i, e in enumerate(experiments):
            if b <= i % 3:
                boot = ledger.start_boot(e.id, e.config, measurement=b)
                for name, tok_s in (("code-c1", 40.0), ("chat-c1", 50.0)):
                    ledger.add_cell_result(
                        e.id, boot.id, _cell(name, tok_s + i + b), spec=_spec(name)
                    )
    mine = [e for e in experiments if e.cluster == "c"]
    assert ledger.cluster_boots("c") == {e.id: ledger.boots(e.id) for e in mine}
    assert ledger.cluster_cell_results("c") == {e.id: ledger.cell_results(e.id) for e in mine}
    assert set(ledger.cluster_boots("elsewhere")) == {experiments[-1].id}
    assert ledger.cluster_boots("none") == {} and ledger.cluster_cell_results("none") == {}

    first = mine[0]
    assert ledger.verdict(first.id) is None
    other.decide(first.id, verdict=_keep(), objective=1.0, delta_pct=0.0, accept_len=None)
    assert ledger.verdict(first.id) == _keep()


def test_texts_held_for_mlflow_round_trip_redacted_and_are_released(
    ledger_url: str, open_ledger: Callable[[str], Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Texts held for an experiment's MLflow run (``ledger.held``): redacted before they are
    stored, a text at the same path replaced, listed by cluster, released by id; a 2 MB log
    goes in and comes back whole."""
    monkeypatch.setenv("HF_TOKEN", "hf_HeldButNeverStored9")
    ledger = open_ledger(ledger_url)
    rnd = _new_round(ledger)
    first, other = (
        ledger.add_experiment(
            cluster=cluster,
            round_id=rnd.id,
            kind=Kind.BASELINE,
            config=SPACE.default_config(),
            champion_key=None,
            champion_objective=None,
        )
        for cluster in ("c", "elsewhere")
    )
    big = "".join(f"line {i} of the engine log\n" for i in range(80_000))
    assert len(big) > 2_000_000
    ledger.hold_texts(first.id, {"logs/boot-1/node-0.log": "token hf_HeldButNeverStored9"})
    ledger.hold_texts(first.id, {"logs/boot-1/node-0.log": big, "launchers/node-0.sh": "#!"})
    ledger.hold_texts(other.id, {"launchers/node-0.sh": "elsewhere"})
    assert ledger.holding("c") == [first.id]
    held = ledger.held_texts(first.id)
    assert {h.path: h.text for h in held} == {
        "logs/boot-1/node-0.log": big,
        "launchers/node-0.sh": "#!",
    }
    ledger.hold_texts(first.id, {"logs/boot-2/node-0.log": "token hf_HeldButNeverStored9"})
    [secret] = [h for h in ledger.held_texts(first.id) if h.path.startswith("logs/boot-2")]
    assert "hf_HeldButNeverStored9" not in secret.text and "***" in secret.text
    ledger.release_texts([h.id for h in held])
    assert [h.path for h in ledger.held_texts(first.id)] == ["logs/boot-2/node-0.log"]
    ledger.release_texts([secret.id])
    assert ledger.holding("c") == [] and ledger.holding("elsewhere") == [other.id]


def test_lease_excludes_a_live_holder_and_replaces_a_dead_one(
    ledger_url: str, open_ledger: Callable[[str], Ledger]
) -> None:
    ledger = open_ledger(ledger_url)
    host = socket.gethostname()
    ledger.acquire_lease(
        "c", holder="a", hostname=host, pid=os.getpid(), ttl_s=60, stale=lambda _l: False
    )
    with pytest.raises(LeaseHeld, match="cluster c is leased to a"):
        ledger.acquire_lease(
            "c", holder="b", hostname=host, pid=1, ttl_s=60, stale=lambda _l: False
        )
    taken = ledger.acquire_lease(
        "c", holder="b", hostname=host, pid=1, ttl_s=60, stale=lambda _l: True
    )
    assert taken.holder == "b"
    with pytest.raises(LeaseLost, match=r"this orchestrator \(a\) lost cluster c to b "):
        ledger.renew_lease("c", holder="a", ttl_s=60)
    ledger.renew_lease("c", holder="b", ttl_s=60)
    lease = ledger.lease("c")
    assert lease is not None and lease.expires_at > datetime.now(UTC)
    ledger.release_lease("c", holder="b")
    assert ledger.lease("c") is None


def test_export_is_stable_and_has_the_design_header(
    ledger_url: str, open_ledger: Callable[[str], Ledger]
) -> None:
    ledger = open_ledger(ledger_url)
    rnd = _new_round(ledger, budget=3, proposer="sweep")
    base = SPACE.default_config()
    e0 = ledger.add_experiment(
        cluster="c",
        round_id=rnd.id,
        kind=Kind.BASELINE,
        config=base,
        champion_key=None,
        champion_objective=None,
        description="baseline",
    )
    ledger.decide(
        e0.id, verdict=_keep(), objective=123.456, delta_pct=0.0, accept_len=3.21, promote=True
    )
    change = SPACE.change(base, "gpu_memory_utilization", 0.9)
    e1 = ledger.add_experiment(
        cluster="c",
        round_id=rnd.id,
        kind=Kind.CANDIDATE,
        config=base.apply(change),
        champion_key=base.key,
        champion_objective=123.456,
        knob=change.knob,
        value=change.new,
        description="gpu\tmem\n0.9",
    )
    crash = VerdictRecord(status="crash", rule="boot", reason="oom", stats={})
    ledger.decide(
        e1.id, verdict=crash, objective=None, delta_pct=None, accept_len=None, failure_class="oom"
    )
    ledger.add_experiment(  # undecided: not in the file
        cluster="c",
        round_id=rnd.id,
        kind=Kind.CANDIDATE,
        config=base,
        champion_key=base.key,
        champion_objective=1.0,
    )
    text = tsv_text(ledger.experiments(cluster="c"))
    lines = text.splitlines()
    assert lines[0].split("\t") == list(HEADER)
    assert (
        lines[0] == "experiment\tobjective\tdelta_pct\taccept_len\tstatus\tknob\tvalue\tdescription"
    )
    assert lines[1].split("\t") == [
        str(e0.id),
        "123.46",
        "+0.00",
        "3.210",
        "keep",
        "-",
        "-",
        "baseline",
    ]
    assert lines[2].split("\t") == [
        str(e1.id),
        "0.00",
        "+0.00",
        "0.000",
        "crash",
        "gpu_memory_utilization",
        "0.9",
        "gpu mem 0.9",
    ]
    assert len(lines) == 3
    assert tsv_text(open_ledger(ledger_url).experiments(cluster="c")) == text


def test_bad_urls_are_one_clear_error(tmp_path: object) -> None:
    with pytest.raises(LedgerError, match="is not a database URL"):
        Ledger("not a url at all")
    with pytest.raises(LedgerError, match=r"cannot open ledger|ledger postgresql"):
        Ledger("postgresql+psycopg://nobody@127.0.0.1:1/nothing")
    # SQLite says only "unable to open database file"; the line says which folder is missing
    with pytest.raises(LedgerError, match=r"the folder .*/no/such/folder does not exist; create"):
        Ledger(f"sqlite:///{tmp_path}/no/such/folder/orchestrate.db")
    # a ledger in memory would take the whole night's record with it when the command ends
    for memory in ("sqlite://", "sqlite:///:memory:"):
        with pytest.raises(LedgerError, match="in memory, lost when the command ends: name a"):
            Ledger(memory)


#: Python that fills the disk of the current folder but for a file ``filler`` (``os``
#: imported; indented for a ``with`` block): a script's "the disk filled" step.
FILL_DISK = """
    fd = os.open("filler", os.O_WRONLY | os.O_CREAT)
    for block in (65536, 512):
        try:
            while True:
                os.write(fd, b"x" * block)
        except OSError:
            pass
    os.close(fd)
"""

#: In a tmpfs of 1 MiB: a ledger, the disk filled, a write, the disk freed, the write again.
_FULL_DISK = (
    """
import json, os
from ledger import Ledger, LedgerError
said = {}
with Ledger("sqlite:///" + os.path.abspath("orchestrate.db")) as ledger:"""
    + FILL_DISK
    + """    try:
        for i in range(64):  # until a page more is needed than the disk has
            ledger.create_round(cluster=f"c{i}", profile_name="p" * 4000, profile_digest="d",
                                budget=1, proposer="optuna", approve="auto", seed=0)
    except LedgerError as e:
        said = {"unreachable": e.unreachable, "message": e.message}
    os.remove("filler")
    ledger.create_round(cluster="after", profile_name="p", profile_digest="d", budget=1,
                        proposer="optuna", approve="auto", seed=0)
    said["after"] = ledger.unfinished_round("after") is not None
print(json.dumps(said))
"""
)


def test_a_ledger_whose_disk_is_full_waits_for_room_it_is_not_refused(tmp_path: Path) -> None:
    """SQLite's ``database or disk is full`` (a night's logs filled the disk; a rotation frees
    it) is a ledger away for now, as ``database is locked`` is: a round waits it out with its
    ledger waits (``policy.LEDGER_WAITS``). It ended the night at once, in SQLite's words."""
    done = in_tmpfs(tmp_path / "disk", sys.executable, "-c", _FULL_DISK, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["unreachable"] is True, said
    assert "the disk of the ledger's file is full: free space there" in said["message"], said
    assert said["after"] is True, said
