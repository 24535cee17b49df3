"""The stops kept outside a ledger that took no write (``orchestrator.unrecorded``) find their
ledger wherever it is, and none is lost: a ledger copied to another path (as the read-only line
says to) gets its stop, and another ledger never does; a second command that finds the ledger
still away keeps its own stop beside the first, and the next writes both in order; a stop of
another kind (a node away, an interrupt) whose own record the ledger took no write of is kept
as well. Real SQLite files (a full disk in a tmpfs of the test's own) and a real PostgreSQL
server taken away."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
from rich.console import Console

from cluster.errors import NodeError
from knobs.vocabulary import EventKind
from ledger import Ledger, LedgerError
from orchestrator.away import record_away_at_start
from orchestrator.cli.round_report import report_stop
from orchestrator.display import RoundDisplay
from orchestrator.errors import INTERRUPTED
from orchestrator.profile import load_profile
from orchestrator.stops import record_stop
from orchestrator.unrecorded import Stopping, found, kept_on_stop, owed
from tests.fixtures.cli import orchestrate
from tests.fixtures.mounts import in_tmpfs
from tests.fixtures.profiles import small_twin_profile_data, write_profile
from tests.test_ledger import FILL_DISK
from tests.test_ledger_outage import bring_back, take_away
from tests.test_round_policy import ScriptedTestbed
from tests.test_unrecorded_stop import LEDGER_HERE, NIGHT, AwayInCell, _resumed

if TYPE_CHECKING:
    from ledger.mlflow_sink import MlflowSink

#: In a tmpfs of 1 MiB: a round of cluster argv[2], the disk filled, a round's command whose
#: writes find it full past the last wait (its stop kept); then the ledger copied out to
#: argv[1], as the read-only line says to.
_COPIED_OUT = (
    """
import json, os, shutil, sys
from ledger import Ledger, LedgerError
from orchestrator.outages import through_ledger_outages
from orchestrator.unrecorded import kept_on_stop
copy, cluster = sys.argv[1], sys.argv[2]
said = {}"""
    + LEDGER_HERE
    + """with Ledger(url) as ledger:
    create(ledger, cluster)"""
    + FILL_DISK
    + NIGHT
    + """    try:
        with kept_on_stop(url, cluster) as stopping:
            stopping.keeps = True
            stopping.opened(ledger)  # as the round's command does, once the ledger opened
            stopping.round_id = 1
            through_ledger_outages(night, note=lambda _l: None, sleep=lambda _s: None,
                                   waits=(1.0,))
    except LedgerError as e:
        said["message"] = e.message
os.remove("filler")
shutil.copyfile("orchestrate.db", copy)
print(json.dumps(said))
"""
)


def _create(ledger: Ledger, cluster: str) -> int:
    return ledger.create_round(
        cluster=cluster,
        profile_name="p",
        profile_digest="d",
        budget=1,
        proposer="optuna",
        approve="auto",
        seed=0,
    ).id


def _fold(url: str, cluster: str, ledger: Ledger) -> list[str]:
    """The next round's command on the ledger at ``url``: its kept stops folded; what it said."""
    said: list[str] = []
    stopping = Stopping(url, cluster, keeps=True)
    stopping.resuming(found(url, cluster))
    stopping.attempt(ledger, lambda: None, said.append)
    return said


def test_a_ledger_copied_to_another_path_gets_its_kept_stop_and_another_ledger_never_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the stop was kept under the ledger's path; the ledger copied to a writable disk
    (as the read-only and disk-full lines say to) never got it, and ``status`` on the copy did
    not show it: it stayed in the cache, unwritten, with nothing said."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(cache))
    work = tmp_path / "work"
    work.mkdir()
    profile = write_profile(work, small_twin_profile_data())
    cluster = str(small_twin_profile_data()["cluster"]["name"])
    copy = tmp_path / "writable" / "orchestrate.db"
    copy.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "ORCHESTRATE_CACHE": str(cache)}
    done = in_tmpfs(
        tmp_path / "disk", sys.executable, "-c", _COPIED_OUT, str(copy), cluster, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    message = json.loads(done.stdout)["message"]
    assert "the disk of the ledger's file is full" in message, message
    assert f"this stop is kept in {cache}" in message, message
    copy_url = f"sqlite:///{copy}"

    # another ledger of the same cluster, with a round 1 of its own: never written there
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    with Ledger(other_url) as other:
        _create(other, cluster)
        assert _fold(other_url, cluster, other) == []
        assert not other.events(cluster, EventKind.ROUND_STOPPED)

    # `status` on the copy shows it, though the ledger's path is not the one it was kept for
    shown = orchestrate(
        work, "status", "--json", "-p", str(profile), env={**env, "ORCHESTRATE_LEDGER": copy_url}
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    unrecorded = json.loads(shown.stdout)["unrecorded_stop"]
    assert unrecorded is not None and unrecorded["round"] == 1, shown.stdout
    assert "the disk of the ledger's file is full" in unrecorded["reason"], unrecorded

    # the next round's command on the copy writes it there, and it is kept no more
    with Ledger(copy_url) as ledger:
        said = _fold(copy_url, cluster, ledger)
        assert any("the ledger records now the stop it could not take" in s for s in said), said
        (stop,) = ledger.events(cluster, EventKind.ROUND_STOPPED)
        assert stop.subject == "1" and stop.detail["recorded_late"] is True, stop
    assert found(copy_url, cluster) == []


def test_a_second_command_with_the_ledger_still_away_keeps_its_stop_beside_the_first(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the second command's stop was kept over the first's (one file per ledger and
    cluster): the first stop's line was lost, and the next round recorded only the second."""
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(tmp_path / "cache"))
    cluster = "scripted"
    said = io.StringIO()
    with Ledger(pg_url) as ledger:
        try:
            # the first command: the server goes away as it measures, past the last wait
            with pytest.raises(LedgerError), kept_on_stop(pg_url, cluster) as stopping:
                stopping.keeps = True
                stopping.opened(ledger)
                stopping.round_id = 1
                _resumed(ledger, stopping, AwayInCell(pg_url, at=2), said)
            (first,) = found(pg_url, cluster)
            (cell,) = first.cells
            # the second, the server still away: its fold fails, and so does it
            with pytest.raises(LedgerError), kept_on_stop(pg_url, cluster) as again:
                again.keeps = True
                again.round_id = 1
                again.resuming(found(pg_url, cluster))
                _resumed(ledger, again, ScriptedTestbed(lambda c, n: 100.0), said)
        finally:
            bring_back(pg_url)
        kept = found(pg_url, cluster)
        assert [k.path for k in kept][:1] == [first.path], kept
        assert len(kept) == 2 and kept[0].cells == [cell] and kept[1].cells == [], kept
        assert kept[0].stopped_at < kept[1].stopped_at

        # the next: both written, in the order they stopped, the cell once
        after = Stopping(pg_url, cluster, keeps=True)
        after.resuming(found(pg_url, cluster))
        _resumed(ledger, after, ScriptedTestbed(lambda c, n: 100.0), said)
        stops = [e for e in ledger.events(cluster, EventKind.ROUND_STOPPED)]
        late = [e.detail["stopped_at"] for e in stops if e.detail.get("recorded_late")]
        assert late == [k.stopped_at.isoformat() for k in kept], stops
        readings = [c for c in ledger.cell_results(cell.experiment_id) if c.boot_id == cell.boot_id]
        assert [r.result for r in readings] == [cell.result], readings
        assert found(pg_url, cluster) == []


def test_a_node_stop_whose_record_finds_the_ledger_away_is_kept_and_written_later(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a round stopped by a node away, as its ledger's server went away too, lost its
    stop: ``record_stop`` found no ledger and the stop was not a ledger's, so not kept."""
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(tmp_path / "cache"))
    cluster = "scripted"
    away = NodeError("node-1 on 10.0.0.2 did not answer", failure_class="unreachable", rank=1)
    with Ledger(pg_url) as ledger:
        round_id = _create(ledger, cluster)
        try:
            with pytest.raises(NodeError) as stopped, kept_on_stop(pg_url, cluster) as stopping:
                stopping.keeps = True
                stopping.opened(ledger)
                stopping.round_id = round_id
                take_away(pg_url)
                record_stop(ledger, cluster, round_id, away)  # as the round's loop unwinds
                raise away
        finally:
            bring_back(pg_url)
        assert "this stop is kept in" in stopped.value.message, stopped.value.message
        assert not ledger.events(cluster, EventKind.ROUND_STOPPED)
        kept = found(pg_url, cluster)
        assert kept, "the node's stop was not kept"
        assert kept[0].round_id == round_id and kept[0].exit_code == away.exit_code, kept
        assert "did not answer" in kept[0].said(), kept[0].said()

        said = _fold(pg_url, cluster, ledger)
        assert any("the ledger records now" in s for s in said), said
        (stop,) = ledger.events(cluster, EventKind.ROUND_STOPPED)
        assert stop.subject == str(round_id) and stop.detail["recorded_late"] is True, stop
        assert (stop.detail["error"], stop.detail["node"]) == ("NodeError", "node-1"), stop
        assert stop.reason.startswith("node-1 on 10.0.0.2 did not answer"), stop
        assert found(pg_url, cluster) == []


def test_an_interrupt_as_the_ledger_is_waited_for_owes_its_stop_to_the_kept_ones(
    pg_url: str, tmp_path: Path
) -> None:
    """Before: Ctrl-C while the round's command waited out its ledger's server (the round's own
    record never ran) found the stop unread (``last_stop`` failed) and never tried to record
    it: the interrupt was kept nowhere. Its record is tried, and owed to the kept stops."""
    prof = load_profile(str(write_profile(tmp_path, small_twin_profile_data())))
    interrupt = KeyboardInterrupt()
    with Ledger(pg_url) as ledger:
        round_id = _create(ledger, prof.cluster.name)
        take_away(pg_url)
        try:
            shown = io.StringIO()
            # the sink is never reached: the report needs the ledger first
            sink = cast("MlflowSink", None)
            display = RoundDisplay(Console(file=shown))
            report_stop(prof, ledger, sink, round_id, interrupt, display)
        finally:
            bring_back(pg_url)
    record = owed(interrupt)
    assert record is not None, shown.getvalue()
    assert (record.round_id, record.exit_code) == (round_id, INTERRUPTED), record
    assert record.line.startswith("interrupted by Ctrl-C"), record


def test_a_node_away_at_the_start_with_the_ledger_away_owes_its_stop_to_the_kept_ones(
    pg_url: str,
) -> None:
    """Before: a node away as the command claimed the nodes, with the ledger's server away
    too, found the last stop unread and never tried to record its own: kept nowhere."""
    away = NodeError("node-0 did not answer", failure_class="unreachable", rank=0)
    with Ledger(pg_url) as ledger:
        take_away(pg_url)
        try:
            assert record_away_at_start(ledger, "scripted", None, away) is None
        finally:
            bring_back(pg_url)
    record = owed(away)
    assert record is not None and record.round_id is None, record
    assert record.detail["node"] == "node-0" and record.exit_code == away.exit_code, record


def test_a_stop_kept_by_the_release_before_is_still_read_and_written_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop the release before kept (one file per ledger path and cluster, no round naming
    its ledger, no detail) is the ledger's at that path: read, shown and written in, as then."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(cache))
    url = f"sqlite:///{tmp_path / 'orchestrate.db'}"
    (cache / "unrecorded").mkdir(parents=True)
    body = {
        "ledger": f"sqlite:///{tmp_path / 'orchestrate.db'}",
        "cluster": "c",
        "round": 1,
        "stopped_at": "2026-12-06T03:12:00+00:00",
        "exit_code": 4,
        "line": "ledger …: the filesystem at /srv went read-only under it",
        "cells": [],
    }
    (cache / "unrecorded" / "c-0123456789abcdef.json").write_text(json.dumps(body))
    with Ledger(url) as ledger:
        _create(ledger, "c")
        (kept,) = found(url, "c")
        assert kept.belongs(url, ledger.rounds("c")), kept
        assert _fold(url, "c", ledger), "not written in"
        (stop,) = ledger.events("c", EventKind.ROUND_STOPPED)
        assert stop.detail["error"] == "LedgerError" and stop.detail["recorded_late"], stop
        assert stop.detail["stopped_at"] == body["stopped_at"], stop
    assert found(url, "c") == []
