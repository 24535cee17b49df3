"""The ledger's schema migrations: a ledger written by a released orchestrate is upgraded in
place on open, SQLite and PostgreSQL, and nothing is lost.

``fixtures/ledgers/schema1.sqlite`` was written by the release at c70919d, ``schema2.sqlite``
by the one at 8ccca75, ``schema3.sqlite`` by aaa0a6c, ``schema4.sqlite`` by 914026e,
``schema5.sqlite`` by 0093711, ``schema6.sqlite`` by ec2db7a, ``schema7.sqlite`` by fe44184
``schema9.sqlite`` by aab6a58 and ``schema9s.sqlite`` by 245e1f9 (their README says how;
``tests/test_profile_upgrade.py`` opens the last two);
``schemaN.results.tsv`` is that release's ``orchestrate export`` of it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from mlflow.tracking import MlflowClient
from sqlalchemy import Connection, create_engine, func, insert, inspect, select, text, update

from knobs.config import Config
from knobs.vocabulary import BootRole, BootStatus, EventKind, Kind, Status
from ledger import Ledger, LedgerError, LedgerNotReady, VerdictRecord, reading, tsv_text
from ledger.models import SCHEMA_VERSION, Base, SchemaRow
from ledger.schema import head, scripts
from orchestrator.champion_level import row_notes
from orchestrator.evolution import Lineage
from orchestrator.measurements import changed_cells, read_measurements
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.test_ledger import _race

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"
SCHEMA1 = LEDGERS / "schema1.sqlite"
# read-only: a test that wrote to the fixture would change what every later test compares to
SCHEMA1_URL = f"sqlite:///file:{SCHEMA1}?mode=ro&uri=true"
CLUSTER = "twin-local"  # the embedded twin profile's cluster, which wrote the fixture


@contextmanager
def _connect(url: str) -> Iterator[Connection]:
    """One connection in a transaction, committed at the end; the engine disposed."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def _schema1_columns() -> dict[str, list[str]]:
    """Every table of schema 1 and its columns, read from the fixture itself."""
    with _connect(SCHEMA1_URL) as conn:
        found = inspect(conn)
        return {t: [c["name"] for c in found.get_columns(t)] for t in found.get_table_names()}


def _plain(value: object) -> object:
    # SQLite hands back naive datetimes, PostgreSQL aware ones: both were written as UTC
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def _rows(conn: Connection, table: str, columns: list[str]) -> list[tuple[object, ...]]:
    """The table's rows, ``columns`` only, typed by the models, in primary-key order."""
    model = Base.metadata.tables[table]
    query = select(*(model.c[c] for c in columns)).order_by(*model.primary_key.columns)
    return [tuple(_plain(v) for v in row) for row in conn.execute(query)]


def _schema1_content(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every schema-1 table (but the version row, which an upgrade rewrites)."""
    columns = _schema1_columns()
    with _connect(url) as conn:
        return {t: _rows(conn, t, c) for t, c in columns.items() if t != "schema_version"}


def _sqlite_copy(tmp_path: Path) -> str:
    db = tmp_path / "orchestrate.db"
    shutil.copyfile(SCHEMA1, db)
    return f"sqlite:///{db}"


def _check_old_rows_kept(ledger: Ledger, url: str) -> None:
    """Everything the release wrote reads back the same through today's ledger."""
    assert _schema1_content(url) == _schema1_content(SCHEMA1_URL)
    _check_ledger_reads_schema1(ledger)


def _check_ledger_reads_schema1(ledger: Ledger) -> None:
    """What the release wrote, through today's ledger only: its export, champion and counts."""
    assert tsv_text(ledger.experiments(cluster=CLUSTER)) == (
        LEDGERS / "schema1.results.tsv"
    ).read_text(encoding="utf-8")
    status = json.loads((LEDGERS / "schema1.status.json").read_text(encoding="utf-8"))
    champion = ledger.champion(CLUSTER)
    assert champion is not None
    assert champion.experiment_id == status["champion"]["experiment"]
    assert champion.objective == status["champion"]["objective"]
    assert len(ledger.rounds(CLUSTER)) == status["rounds"]
    assert len(ledger.experiments(cluster=CLUSTER)) == status["experiments"]


def _check_new_schema_works(ledger: Ledger) -> None:
    """The new table and column take writes; ids continue after the old rows."""
    rounds = ledger.rounds(CLUSTER)
    assert [r.max_hours for r in rounds] == [None] * len(rounds)
    new = ledger.create_round(
        cluster=CLUSTER,
        profile_name="twin",
        profile_digest="d" * 64,
        budget=1,
        proposer="sweep",
        approve="auto",
        seed=0,
        max_hours=2.5,
        max_gpu_hours=40.0,
    )
    assert new.id == max(r.id for r in rounds) + 1
    assert ledger.round(new.id).max_hours == 2.5
    assert ledger.round(new.id).max_gpu_hours == 40.0
    assert [r.max_gpu_hours for r in rounds] == [None] * len(rounds)
    ledger.add_event(CLUSTER, EventKind.KNOB_ADDED, subject="k", detail={"default": 1})
    assert [e.subject for e in ledger.events(CLUSTER, EventKind.KNOB_ADDED)] == ["k"]


def _version_rows(url: str) -> tuple[str | None, int | None]:
    with _connect(url) as conn:
        revision = MigrationContext.configure(conn).get_current_revision()
        version = conn.execute(select(SchemaRow.version)).scalar()
    return revision, version


def test_a_schema1_sqlite_ledger_is_copied_aside_then_upgraded_in_place(tmp_path: Path) -> None:
    url = _sqlite_copy(tmp_path)
    with Ledger(url) as ledger:
        upgrade = ledger.upgraded
        assert upgrade is not None
        assert (upgrade.from_revision, upgrade.to_revision) == ("0001", head())
        assert upgrade.backup is not None
        assert upgrade.backup.name.startswith("orchestrate.db.schema-0001-")
        assert upgrade.backup.read_bytes() == SCHEMA1.read_bytes()
        assert "\n" not in upgrade.line() and str(upgrade.backup) in upgrade.line()
        [event] = ledger.events("*", EventKind.LEDGER_UPGRADED)
        assert event.subject == head()
        assert event.detail == {"from": "0001", "backup": str(upgrade.backup)}
        _check_old_rows_kept(ledger, url)
        _check_new_schema_works(ledger)
    assert _version_rows(url) == (head(), SCHEMA_VERSION)
    with Ledger(url) as again:
        assert again.upgraded is None
        assert len(again.events("*", EventKind.LEDGER_UPGRADED)) == 1
    assert list(tmp_path.glob("*.bak")) == [upgrade.backup]


# each release's fixture: its revision, cluster, and the statuses of its experiments
RELEASES = {
    "schema2": ("0002", CLUSTER, ["keep", "invalid", "crash"]),
    "schema3": ("0003", CLUSTER, ["keep", "invalid", "crash"]),
    "schema4": ("0004", "twin-2node", ["keep", "crash", "discard", "inconclusive"]),
    "schema5": ("0005", CLUSTER, ["keep", "invalid", "crash"]),
    "schema6": ("0006", CLUSTER, ["keep", "invalid", "vetoed", "discard", "discard"]),
    "schema7": ("0007", CLUSTER, ["keep", "invalid", "crash", "discard"]),
    "schema9": ("0009", CLUSTER, ["keep", "invalid"]),
    "schema9s": ("0009", CLUSTER, ["keep", "invalid"]),
}
#: the releases whose export adds the champion's level in force to its row (``row_notes``,
#: under the fixture's profile): their champion was measured again after its verdict
NOTED = {"schema9", "schema9s"}


def _upgraded_release(name: str, tmp_path: Path) -> tuple[str, str]:
    """A copy of release ``name``'s ledger opened (upgraded) by today's: every row the release
    wrote reads back as it was, its export byte-identical, its champion the same; the URLs of
    the copy and of the fixture (read-only)."""
    revision, cluster, statuses = RELEASES[name]
    fixture = LEDGERS / f"{name}.sqlite"
    db = tmp_path / "orchestrate.db"
    shutil.copyfile(fixture, db)
    url = f"sqlite:///{db}"
    old_url = f"sqlite:///file:{fixture}?mode=ro&uri=true"
    with _connect(old_url) as conn:
        found = inspect(conn)
        columns = {t: [c["name"] for c in found.get_columns(t)] for t in found.get_table_names()}
    columns.pop("schema_version"), columns.pop("alembic_version")  # rewritten by the upgrade

    def content(of: str) -> dict[str, list[tuple[object, ...]]]:
        with _connect(of) as conn:
            return {t: _rows(conn, t, c) for t, c in columns.items()}

    with Ledger(url) as ledger:
        now, before = content(url), content(old_url)
        added = now["event"][len(before["event"]) :]
        if revision == head():  # a ledger of today's schema opens as it is
            assert ledger.upgraded is None and added == []
        else:
            assert ledger.upgraded is not None
            assert (ledger.upgraded.from_revision, ledger.upgraded.to_revision) == (
                revision,
                head(),
            )
            # the upgrade's own event comes after every event the release wrote
            assert [row[2] for row in added] == [EventKind.LEDGER_UPGRADED]
        now["event"] = now["event"][: len(before["event"])]
        assert now == before
        experiments = ledger.experiments(cluster=cluster)
        notes = None
        if name in NOTED:
            profile = load_profile(str(LEDGERS / "schema9.profile.yaml"))  # both releases'
            notes = row_notes(profile, ledger)
        assert tsv_text(experiments, notes) == (LEDGERS / f"{name}.results.tsv").read_text()
        assert [e.status for e in experiments] == statuses
        # its readings, recorded before a measurement dropped for an engine found stopped was
        # counted apart, read as none so dropped (the count is the record's, no column's)
        readings = [r for e in experiments for r in ledger.cell_results(e.id)]
        assert readings and all(r.result.engine_found_stopped == 0 for r in readings)
        status = json.loads((LEDGERS / f"{name}.status.json").read_text())
        champion = ledger.champion(cluster)
        assert champion is not None and champion.objective == status["champion"]["objective"]
        assert len(ledger.rounds(cluster)) == status["rounds"]
    assert _version_rows(url) == (head(), SCHEMA_VERSION)
    return url, old_url


def test_a_schema2_sqlite_ledger_is_upgraded_and_keeps_its_rounds_caps(tmp_path: Path) -> None:
    """Schema 2 (the release at 8ccca75: a round with --max-hours 5, an invalid verdict, a
    crash) opens with schema 3, which adds the round's GPU-hours cap; nothing is lost."""
    url, _ = _upgraded_release("schema2", tmp_path)
    with Ledger(url) as ledger:
        [rnd] = ledger.rounds(CLUSTER)
        assert (rnd.max_hours, rnd.max_gpu_hours) == (5.0, None)
        ledger.set_round_max_gpu_hours(rnd.id, 12.5)
        assert ledger.round(rnd.id).max_gpu_hours == 12.5


def test_a_schema3_sqlite_ledger_is_upgraded_and_keeps_its_gpu_hours_cap(tmp_path: Path) -> None:
    """Schema 3 (the release at aaa0a6c: a round with --max-gpu-hours 3) opens with today's
    schema; its cap and every row are as it wrote them."""
    url, _ = _upgraded_release("schema3", tmp_path)
    with Ledger(url) as ledger:
        [rnd] = ledger.rounds(CLUSTER)
        assert (rnd.max_hours, rnd.max_gpu_hours) == (None, 3.0)


def test_a_schema4_sqlite_ledger_keeps_its_coupled_move_and_holds_texts(tmp_path: Path) -> None:
    """Schema 4 (the release at 914026e: a kv_capacity crash of the unquantised KV cache, then
    the coupled move with the next memory fraction) opens with schema 5, which holds the texts
    MLflow missed; the coupled move reads back with both knobs."""
    url, _ = _upgraded_release("schema4", tmp_path)
    with Ledger(url) as ledger:
        coupled = [e for e in ledger.experiments(cluster="twin-2node") if e.coupled_knob]
        assert [(e.knob, e.value, e.coupled_knob, e.coupled_value) for e in coupled] == [
            ("kv_cache_dtype", "auto", "gpu_memory_utilization", 0.86)
        ]
        assert ledger.holding("twin-2node") == []
        [e] = coupled
        ledger.hold_texts(e.id, {"logs/boot-9/node-0.log": "a log", "launchers/node-0.sh": "x"})
        ledger.hold_texts(e.id, {"logs/boot-9/node-0.log": "the log again"})
        assert ledger.holding("twin-2node") == [e.id]
        held = ledger.held_texts(e.id)
        assert {h.path: h.text for h in held} == {
            "launchers/node-0.sh": "x",
            "logs/boot-9/node-0.log": "the log again",
        }
        ledger.release_texts([h.id for h in held])
        assert ledger.holding("twin-2node") == [] and ledger.held_texts(e.id) == []


def test_a_schema5_ledger_whose_mlflow_is_gone_gives_its_held_texts_to_the_next_mlflow(
    tmp_path: Path,
) -> None:
    """Schema 5 (the release at 0093711: a round left open because its MLflow stopped
    answering, 20 launcher texts and engine logs held in the ledger) opens with schema 6, and the
    same command with ``--new-mlflow-store``, run against another MLflow (the old server is
    gone: a new one, or its store
    lost), boots nothing, gives the round and each experiment a run there, puts every held
    text on its experiment's run at its path, forgets it, and closes the round. Before, the
    round's run that MLflow no longer had was taken for MLflow not answering, and the round
    could never close."""
    url, _ = _upgraded_release("schema5", tmp_path)
    with Ledger(url) as ledger:
        [rnd] = ledger.rounds(CLUSTER)
        assert rnd.status == "running" and rnd.mlflow_run_id is not None
        assert ledger.holding(CLUSTER) == [1, 2, 3]
        held = {e: {h.path: h.text for h in ledger.held_texts(e)} for e in (1, 2, 3)}
    assert sum(map(len, held.values())) == 20
    assert held[3]["logs/boot-5/node-0.log"], "the crash's engine log is the one a user reads"
    mlflow_uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "ORCHESTRATE_LEDGER": url, "MLFLOW_TRACKING_URI": mlflow_uri}
    env["ORCHESTRATE_ARTIFACTS"] = str(tmp_path / "mlartifacts")
    # another store than the one the round began in is taken only when the person says so
    # (``orchestrator.mlflow_store``)
    done = orchestrate(tmp_path, "round", "--budget", "2", "--new-mlflow-store", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting node" not in done.stdout + done.stderr, "nothing is booted again"
    with Ledger(url) as ledger:
        [rnd] = ledger.rounds(CLUSTER)
        assert rnd.status == "done" and ledger.holding(CLUSTER) == []
        runs = {e.id: e.mlflow_run_id for e in ledger.experiments(cluster=CLUSTER)}
    client = MlflowClient(mlflow_uri)
    assert client.get_run(rnd.mlflow_run_id or "").info.status == "FINISHED"
    for experiment, texts in held.items():
        run_id = runs[experiment]
        assert run_id is not None
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == rnd.mlflow_run_id
        for path, body in texts.items():
            got = Path(client.download_artifacts(run_id, path, str(tmp_path / "got")))
            assert got.read_text() == body, (experiment, path)


def test_a_schema5_ledgers_failed_boots_name_no_node_and_a_new_one_does(tmp_path: Path) -> None:
    """Schema 6 records the node a failed boot failed on. The boots schema 5 wrote keep no node
    (their message names it, and a message is not parsed into a column after the fact); a boot
    that fails after the upgrade keeps its node's rank and host."""
    url, _ = _upgraded_release("schema5", tmp_path)
    with Ledger(url) as ledger:
        boots = [b for bs in ledger.cluster_boots(CLUSTER).values() for b in bs]
        failed = [b for b in boots if b.status == BootStatus.FAILED]
        assert failed, "the release's crash failed its boots"
        assert all((b.failed_rank, b.failed_host) == (None, None) for b in failed)
        e = ledger.experiments(cluster=CLUSTER)[-1]
        boot = ledger.start_boot(e.id, e.config, role=BootRole.REPEAT, measurement=9)
        ledger.end_boot(
            boot.id,
            status=BootStatus.FAILED,
            failure_class="unreachable",
            failure_detail="node-1: ssh: connection refused",
            rank=1,
            host="10.0.0.2",
        )
        [new] = [b for b in ledger.boots(e.id) if b.id == boot.id]
        assert (new.failure_class, new.failed_rank, new.failed_host) == (
            "unreachable",
            1,
            "10.0.0.2",
        )


def test_a_schema6_ledger_keeps_the_nodes_its_boots_failed_on_and_a_person_s_veto(
    tmp_path: Path,
) -> None:
    """Schema 6 (the release at ec2db7a: node-1's clocks stuck failed a champion re-measure and
    a change, which a person then vetoed while it was undecided; node-2's clocks stuck failed
    the resume's next boot) opens with today's code: each failed boot keeps the node it failed
    on, ``status`` counts them per node as the release did, and the veto keeps the person's
    words, the boots' failures and its barred value."""
    url, _ = _upgraded_release("schema6", tmp_path)
    with Ledger(url) as ledger:
        boots = [b for bs in ledger.cluster_boots(CLUSTER).values() for b in bs]
        failed = sorted(
            (b.experiment_id, b.failure_class, b.failed_rank, b.failed_host)
            for b in boots
            if b.status == BootStatus.FAILED
        )
        assert failed == [
            (1, "clocks_stuck", 1, "127.0.0.1"),
            (3, "clocks_stuck", 1, "127.0.0.1"),
            (4, "clocks_stuck", 2, "127.0.0.1"),
        ]
        verdict = ledger.verdict(3)
        assert verdict is not None and verdict.rule == "veto"
        assert verdict.reason == "fixture: node-1's clocks are stuck tonight; set the change aside"
        assert verdict.stats["undecided"] is True
        assert verdict.stats["failed"] == {"clocks_stuck": 1}
    shutil.copyfile(LEDGERS / "schema6.profile.yaml", tmp_path / "profile.yaml")
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    done = orchestrate(tmp_path, "status", "--json", "-p", "profile.yaml", env=env)
    assert done.returncode == 0, done.stderr
    now, then = json.loads(done.stdout), json.loads((LEDGERS / "schema6.status.json").read_text())
    counted = {n["name"]: n["infrastructure_failures"] for n in now["nodes"]}
    assert counted == {n["name"]: n["infrastructure_failures"] for n in then["nodes"]}
    assert counted["node-1"] == {"clocks_stuck": 2} and counted["node-2"] == {"clocks_stuck": 1}
    assert now["infrastructure_failures_without_node"] == 0
    done = orchestrate(tmp_path, "known-bad", "list", "--json", "-p", "profile.yaml", env=env)
    assert done.returncode == 0, done.stderr
    [veto] = [r for r in json.loads(done.stdout) if r["source"] == "veto"]
    assert (veto["id"], veto["region"]) == (3, "gpu_memory_utilization=0.71")
    assert veto["reason"] == "fixture: node-1's clocks are stuck tonight; set the change aside"


def test_a_schema7_ledger_keeps_each_readings_cell_definition_and_sets_the_old_aside(
    tmp_path: Path,
) -> None:
    """Schema 7 (the release at fe44184: a round under the embedded twin's cells, then one with
    cell code-c1 at concurrency 2) opens with today's code: each reading keeps the definition
    it was measured under, the champion's level is of its measurements as the profile defines
    the cells now (its readings at concurrency 1 kept in the ledger and set aside), and under
    that profile no cell is said to have changed; under the older cells, code-c1 is."""
    url, _ = _upgraded_release("schema7", tmp_path)
    now = load_profile(str(LEDGERS / "schema7.profile.yaml"))
    before = load_profile(None)  # the embedded twin: code-c1 at concurrency 1
    with Ledger(url) as ledger:
        readings = [r for r in ledger.cell_results(1) if r.result.cell == "code-c1"]
        assert [r.spec.concurrency for r in readings if r.spec is not None] == [1, 1, 2, 2]
        counted = read_measurements(ledger, 1, now.cells)
        # the baseline's two boots at concurrency 1 lack code-c1 as it is now: incomplete
        assert [m.complete for m in counted] == [False, False, True, True]
        assert changed_cells(ledger, CLUSTER, now.cells) == {}
        [line] = changed_cells(ledger, CLUSTER, before.cells).values()
        assert line.startswith(
            "cell code-c1 changed since it was last measured (concurrency 2 → 1)"
        )
    # and status says so, under each profile, before any round measures it again
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    under_fixture = str(LEDGERS / "schema7.profile.yaml")
    done = orchestrate(tmp_path, "status", "--json", "-p", under_fixture, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["changed_cells"] == []
    done = orchestrate(tmp_path, "status", "--json", env=env)  # the embedded twin's cells
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["changed_cells"] == ["code-c1"]
    done = orchestrate(tmp_path, "status", env=env)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "cell code-c1 changed since it was last measured (concurrency 2 → 1)" in said, said


def test_a_schema7_ledgers_changes_have_their_parents_inferred_and_a_new_one_stores_its_own(
    tmp_path: Path,
) -> None:
    """Schema 8 stores each change's parent (``experiment.parent_experiment_id``). A schema 7
    ledger's changes have none: each reads NULL, and its parent is inferred as before (the
    baseline, the only champion); a change recorded after the upgrade stores its own."""
    url, _ = _upgraded_release("schema7", tmp_path)
    profile = load_profile(str(LEDGERS / "schema7.profile.yaml"))
    with Ledger(url) as ledger:
        experiments = ledger.experiments(cluster=CLUSTER)
        assert [e.parent_experiment_id for e in experiments] == [None] * 4
        lineage = Lineage.read(profile.space, ledger, CLUSTER, experiments)
        parents = [lineage.parent(e) for e in experiments]
        assert [None if p is None else p.id for p in parents] == [None, 1, 1, 1]
        champion = ledger.champion(CLUSTER)
        assert champion is not None and champion.experiment_id == 1
        last = experiments[-1]
        new = ledger.add_experiment(
            cluster=CLUSTER,
            round_id=last.round_id,
            kind=Kind.CANDIDATE,
            config=last.config,
            champion_key=champion.config.key,
            champion_objective=champion.objective,
            knob=last.knob,
            value=last.value,
            parent=champion.experiment_id,
        )
        assert ledger.experiment(new.id).parent_experiment_id == 1
    # and the release's own reader, the export, is as it was
    with Ledger(url) as ledger:
        done = [e for e in ledger.experiments(cluster=CLUSTER) if e.id != new.id]
        assert tsv_text(done) == (LEDGERS / "schema7.results.tsv").read_text()


def test_an_upgraded_ledger_reads_its_one_knob_rows_as_before_and_records_a_coupled_move(
    tmp_path: Path,
) -> None:
    """Schema 4 adds a coupled move's second knob in columns of its own: the rows of schema 2
    read as one-knob changes exactly as before (same results.tsv), and a coupled move written
    after the upgrade reads back with both knobs (``a+b`` in results.tsv)."""
    db = tmp_path / "orchestrate.db"
    shutil.copyfile(LEDGERS / "schema2.sqlite", db)
    with Ledger(f"sqlite:///{db}") as ledger:
        before = ledger.experiments(cluster=CLUSTER)
        assert all(e.coupled_knob is None and e.coupled_value is None for e in before)
        assert all(p.coupled_knob is None for p in ledger.proposals())
        assert [e.label for e in before] == [e.knob for e in before]
        [rnd] = ledger.rounds(CLUSTER)
        champion = ledger.champion(CLUSTER)
        assert champion is not None
        config = Config(
            {**champion.config.as_dict(), "kv_cache_dtype": "auto", "gpu_memory_utilization": 0.86}
        )
        p = ledger.add_proposal(
            round_id=rnd.id,
            source="optuna",
            knob="kv_cache_dtype",
            old_value=champion.config["kv_cache_dtype"],
            new_value="auto",
            champion_key=champion.config.key,
            coupled=("gpu_memory_utilization", champion.config["gpu_memory_utilization"], 0.86),
        )
        assert p.change.label == "kv_cache_dtype+gpu_memory_utilization"
        e = ledger.add_experiment(
            cluster=CLUSTER,
            round_id=rnd.id,
            kind=Kind.CANDIDATE,
            config=config,
            champion_key=champion.config.key,
            champion_objective=champion.objective,
            proposal_id=p.id,
            knob="kv_cache_dtype",
            value="auto",
            description="kv_cache_dtype fp8_e4m3 → auto + gpu_memory_utilization 0.85 → 0.86",
            coupled=("gpu_memory_utilization", 0.86),
        )
        ledger.decide(
            e.id,
            verdict=VerdictRecord(status=Status.DISCARD, rule="test", reason="test", stats={}),
            objective=100.0,
            delta_pct=-1.0,
            accept_len=3.0,
        )
        text = tsv_text(ledger.experiments(cluster=CLUSTER))
    old = (LEDGERS / "schema2.results.tsv").read_text()
    assert text.startswith(old)
    row = text[len(old) :].rstrip("\n").split("\t")
    assert row[4:7] == ["discard", "kv_cache_dtype+gpu_memory_utilization", "auto+0.86"]


def test_processes_opening_an_old_sqlite_ledger_at_once_upgrade_it_once(tmp_path: Path) -> None:
    url = _sqlite_copy(tmp_path)
    assert _race([url], processes=4) == []
    assert len(list(tmp_path.glob("*.bak"))) == 1
    with Ledger(url) as ledger:
        assert len(ledger.events("*", EventKind.LEDGER_UPGRADED)) == 1
        _check_old_rows_kept(ledger, url)


def test_a_sqlite_ledger_in_wal_mode_is_copied_whole(tmp_path: Path) -> None:
    url = _sqlite_copy(tmp_path)
    with _connect(url) as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    with Ledger(url) as ledger:
        assert ledger.upgraded is not None and ledger.upgraded.backup is not None
        backup = ledger.upgraded.backup
    assert _schema1_content(f"sqlite:///{backup}") == _schema1_content(SCHEMA1_URL)


def _create_schema1(url: str) -> None:
    """Revision 0001 on an empty database, and the version row the first release wrote;
    no ``alembic_version`` table, as that release left it."""
    with _connect(url) as conn:
        with Operations.context(MigrationContext.configure(conn)):
            scripts().get_revision("0001").module.upgrade()
        conn.execute(insert(SchemaRow).values(id=1, version=1))


def _copy_fixture_rows(url: str) -> None:
    """Every row of the fixture into a schema-1 PostgreSQL database, ids kept, and each
    sequence moved past them as the release's own inserts would have left it."""
    columns = _schema1_columns()
    with _connect(SCHEMA1_URL) as source:
        tables = [t for t in Base.metadata.sorted_tables if t.name in columns]
        rows = {t.name: _rows(source, t.name, columns[t.name]) for t in tables}
    with _connect(url) as target:
        for table in tables:
            names = columns[table.name]
            if table.name == "schema_version" or not rows[table.name]:
                continue  # the version row is _create_schema1's
            values: list[dict[str, Any]] = [
                dict(zip(names, r, strict=True)) for r in rows[table.name]
            ]
            for row in values:
                for name, value in row.items():
                    if isinstance(value, datetime):
                        row[name] = value.replace(tzinfo=UTC)
            target.execute(insert(table), values)
            if "id" in names:
                top = target.execute(select(func.max(table.c.id))).scalar()
                target.execute(
                    text("SELECT setval(pg_get_serial_sequence(:t, 'id'), :top)"),
                    {"t": table.name, "top": top},
                )


def test_b_schema1_postgres_ledger_is_upgraded_in_place(pg_url: str) -> None:
    _create_schema1(pg_url)
    _copy_fixture_rows(pg_url)
    assert _version_rows(pg_url) == (None, 1)
    with Ledger(pg_url) as ledger:
        upgrade = ledger.upgraded
        assert upgrade is not None
        assert (upgrade.from_revision, upgrade.to_revision, upgrade.backup) == (
            "0001",
            head(),
            None,
        )
        _check_old_rows_kept(ledger, pg_url)
        _check_new_schema_works(ledger)
    assert _version_rows(pg_url) == (head(), SCHEMA_VERSION)
    with Ledger(pg_url) as again:
        assert again.upgraded is None


def test_b_schema1_postgres_ledger_is_read_as_upgraded_and_left_as_it_was(pg_url: str) -> None:
    """``reading`` (what ``cluster up --dry-run`` reads the champion with) an older PostgreSQL
    ledger: upgraded inside a transaction that is rolled back when the reading ends, so the
    release's rows read as the next command that writes will see them, and the database is
    left at schema 1 (no ``alembic_version``, no event, its rows as they were) for that command
    to upgrade."""
    _create_schema1(pg_url)
    _copy_fixture_rows(pg_url)
    with reading(pg_url) as ledger:
        assert ledger.upgraded is None
        # the ledger's view only: another connection would wait on the upgrade's table locks
        _check_ledger_reads_schema1(ledger)
        assert {r.max_gpu_hours for r in ledger.rounds(CLUSTER)} == {None}  # 0003's column
    assert _version_rows(pg_url) == (None, 1)
    assert _schema1_content(pg_url) == _schema1_content(SCHEMA1_URL)
    with _connect(pg_url) as conn:
        assert sorted(inspect(conn).get_table_names()) == sorted(_schema1_columns())
    with Ledger(pg_url) as ledger:
        assert ledger.upgraded is not None
        _check_old_rows_kept(ledger, pg_url)
        assert len(ledger.events("*", EventKind.LEDGER_UPGRADED)) == 1


def test_processes_opening_an_old_postgres_ledger_at_once_upgrade_it_once(pg_url: str) -> None:
    _create_schema1(pg_url)
    assert _race([pg_url], processes=4) == []
    with Ledger(pg_url) as ledger:
        assert len(ledger.events("*", EventKind.LEDGER_UPGRADED)) == 1


def test_c_the_revisions_build_the_schema_of_the_models(ledger_url: str) -> None:
    """A ledger upgraded from 0001 and a new one (``create_all``) have the same schema."""
    _create_schema1(ledger_url)
    Ledger(ledger_url).close()
    with _connect(ledger_url) as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    assert _version_rows(ledger_url) == (head(), SCHEMA_VERSION)
    assert int(head()) == SCHEMA_VERSION


def test_d_a_ledger_of_a_newer_orchestrate_is_refused_in_one_line(ledger_url: str) -> None:
    Ledger(ledger_url).close()
    with _connect(ledger_url) as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    with pytest.raises(LedgerError) as refused:
        Ledger(ledger_url)
    assert "is at schema revision 0099, newer than this orchestrate knows" in refused.value.message
    assert "upgrade orchestrate, or use a new ledger URL" in refused.value.message
    assert "\n" not in refused.value.message
    # written before the revisions, by an orchestrate that numbered it 7: refused too
    with _connect(ledger_url) as conn:
        conn.execute(text("DROP TABLE alembic_version"))
        conn.execute(update(SchemaRow).values(version=7))
    with pytest.raises(LedgerError, match="is at schema version 7, newer than"):
        Ledger(ledger_url)


def test_e_a_ledger_opened_to_read_is_neither_created_nor_upgraded(ledger_url: str) -> None:
    """``Ledger(url, read_only=True)`` (what ``cluster up --dry-run`` reads the champion with):
    an empty database is left empty, a schema-1 ledger is left at schema 1, both refused in one
    line that says what would make them ready; a current ledger opens and reads. ``reading``
    reads an old ledger as upgraded and leaves it as it was."""
    with pytest.raises(LedgerNotReady, match="no ledger yet at"):
        Ledger(ledger_url, read_only=True)
    _create_schema1(ledger_url)
    with pytest.raises(LedgerNotReady) as older:
        Ledger(ledger_url, read_only=True)
    assert "is at schema 0001, older than this orchestrate's" in older.value.message
    assert "the next command that writes to it upgrades it" in older.value.message
    assert "\n" not in older.value.message
    assert _version_rows(ledger_url) == (None, 1)
    # ``reading``: an old SQLite ledger through an upgraded copy, the file left at schema 1; a
    # PostgreSQL one upgraded in a transaction rolled back at the end
    with reading(ledger_url) as upgraded:
        assert upgraded.champion("any") is None
        assert (upgraded.url != ledger_url) == ledger_url.startswith("sqlite")
    assert _version_rows(ledger_url) == (None, 1)
    Ledger(ledger_url).close()
    with Ledger(ledger_url, read_only=True) as ledger:
        assert ledger.upgraded is None
        assert ledger.champion("any") is None
