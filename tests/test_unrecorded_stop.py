"""A round whose ledger's filesystem goes read-only mid-cell, end to end on the twin: the command
stops at once with one line (exit 4), the stop and the cell it measured and could not write are
kept outside the ledger, ``status`` shows them, and once the filesystem takes writes again the
next round writes them to the ledger and resumes. The ledger is on a real tmpfs in a mount
namespace of the test's own, made read-only under the running round (a read-only bind mount of
itself: a remount of the tmpfs is refused while SQLite holds its file open for writing) while a
crash point holds the round after its first cell (SIGSTOP)."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from knobs.records import CellResultRecord, CellSpec
from knobs.vocabulary import EventKind, RoundStatus
from ledger import Ledger, LedgerError
from orchestrator.outages import through_ledger_outages
from orchestrator.round import RoundReport
from orchestrator.unrecorded import Stopping, found, kept_on_stop
from tests.fixtures.mounts import in_tmpfs
from tests.fixtures.profiles import small_twin_profile_data, twin_profile_data, write_profile
from tests.test_ledger import FILL_DISK
from tests.test_ledger_outage import _round, bring_back, take_away
from tests.test_round_policy import ScriptedTestbed

#: Run in the tmpfs (its cwd): the round held after its first cell, the filesystem made read-only,
#: the round let go; ``status`` then; the filesystem writable; ``status``, the round again.
_DRIVER = r"""
import json, os, signal, sqlite3, subprocess, sys
work, cache = sys.argv[1], sys.argv[2]
disk = os.getcwd()
orchestrate = [sys.executable, "-m", "orchestrator"]
env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{disk}/orchestrate.db",
       "ORCHESTRATE_CACHE": cache}
def run(*args):
    done = subprocess.run([*orchestrate, *args, "--profile", "profile.yaml"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}
def stopped(pid):
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rindex(")") + 2] == "T"
said = {}
held = subprocess.Popen(
    [*orchestrate, "round", "--budget", "1", "--profile", "profile.yaml"], cwd=work,
    env={**env, "ORCHESTRATE_CRASHPOINT": "cell.recorded@1",
         "ORCHESTRATE_CRASHPOINT_SIGNAL": "SIGSTOP"},
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
err = []
for line in held.stderr:
    err.append(line)
    if "crashpoint cell.recorded@1: SIGSTOP" in line:
        break
while not stopped(held.pid):
    pass
subprocess.run(["mount", "--bind", disk, disk], check=True)
subprocess.run(["mount", "-o", "remount,bind,ro", disk], check=True)
held.send_signal(signal.SIGCONT)
try:  # at once: a filesystem gone read-only is not waited for as a ledger away
    out, rest = held.communicate(timeout=150)
except subprocess.TimeoutExpired:
    held.kill()
    out, rest = held.communicate()
said["first"] = {"rc": held.returncode, "out": out, "err": "".join(err) + rest}
said["status_read_only"] = run("status")
def kept():
    folder = os.path.join(cache, "unrecorded")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []
said["kept"] = [json.load(open(os.path.join(cache, "unrecorded", f))) for f in kept()]
subprocess.run(["umount", disk], check=True)
said["status_writable"] = run("status", "--json")
said["second"] = run("round")
said["status_after"] = run("status", "--json")
said["kept_after"] = kept()
with sqlite3.connect(os.path.join(disk, "orchestrate.db")) as db:
    said["cells"] = db.execute(
        "SELECT experiment_id, boot_id, cell, output_throughput FROM cell_result ORDER BY id"
    ).fetchall()
    said["stops"] = db.execute(
        "SELECT subject, detail, reason FROM event WHERE kind = 'round-stopped'").fetchall()
said["down"] = run("cluster", "down")
print(json.dumps(said))
"""


def test_a_ledger_gone_read_only_mid_round_stops_it_keeps_the_cell_and_the_next_round_records_both(
    tmp_path: Path,
) -> None:
    """Before: the round waited half an hour on "unable to open database file", then ended in
    SQLite's words; the cell it had measured was gone, and neither ``status`` nor the resume
    said why the night had stopped."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    data = small_twin_profile_data()
    data["cells"] = twin_profile_data(2)["cells"][:2]  # the second is measured read-only
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0, "champion_boots": 1}
    write_profile(work, data)
    disk = tmp_path / "disk"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = in_tmpfs(
        disk, sys.executable, "-c", _DRIVER, str(work), str(cache), env=env, timeout=480
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["down"]["rc"] == 0, said["down"]

    # at once, one line: what, where, what to do; the stop kept, with the cell not written
    first = said["first"]
    assert first["rc"] == 4, first["err"][-3000:]
    last = first["err"].strip().splitlines()[-1]
    assert last.startswith("Error: ledger sqlite:///"), last
    assert f"the filesystem at {disk} went read-only" in last, last
    assert f"mount -o remount,rw {disk}" in last, last
    assert "the same command then resumes the round" in last, last
    assert "did not answer" not in first["err"], first["err"][-3000:]  # not waited for as away
    (kept,) = said["kept"]
    assert f"this stop is kept in {cache}" in last, last
    assert kept["round"] == 1 and kept["exit_code"] == 4, kept
    (cell,) = kept["cells"]
    assert cell["result"]["cell"] == data["cells"][1]["name"], cell

    # the morning, the disk still read-only: status says the stop, and what it could not write
    morning = said["status_read_only"]
    assert morning["rc"] == 0, morning["err"]  # the ledger read as it is
    shown = " ".join(morning["out"].split())
    assert "round 1" in shown, shown
    assert "the last `orchestrate round` stopped round 1 at" in shown, shown
    assert "its ledger could not record it" in shown, shown
    assert f"({data['cells'][1]['name']} of experiment #1, boot 1)" in shown, shown
    assert f"no round can write to it until then: ledger sqlite:///{disk}" in shown, shown

    # writable again: status's JSON has it; the next round writes both, then resumes
    unrecorded = json.loads(said["status_writable"]["out"])["unrecorded_stop"]
    assert unrecorded["round"] == 1 and unrecorded["exit_code"] == 4, unrecorded
    assert json.loads(said["status_writable"]["out"])["ledger_read_only"] is None
    second = said["second"]
    assert second["rc"] == 0, second["err"][-3000:]
    assert "the ledger records now the stop it could not take" in second["out"], second["out"]
    assert said["kept_after"] == [], said["kept_after"]
    assert json.loads(said["status_after"]["out"])["unrecorded_stop"] is None
    # the cell kept is in the ledger, its reading the one measured that night, and the resume
    # did not measure it again on the baseline
    written = [
        c for c in said["cells"] if c[1] == cell["boot_id"] and c[2] == cell["result"]["cell"]
    ]
    assert written == [
        [
            cell["experiment_id"],
            cell["boot_id"],
            cell["result"]["cell"],
            cell["result"]["output_throughput"],
        ]
    ], said["cells"]
    baseline = [c for c in said["cells"] if c[0] == cell["experiment_id"]]
    assert len(baseline) == 2, baseline
    (stop,) = [s for s in said["stops"] if json.loads(s[1]).get("recorded_late")]
    assert stop[0] == "1" and "went read-only" in stop[2], stop


class AwayInCell(ScriptedTestbed):
    """The ledger's server goes away as boot ``at``'s cell is measured: its write finds it gone."""

    def __init__(self, url: str, at: int) -> None:
        super().__init__(lambda c, n: 130.0 if c["num_speculative_tokens"] == 5 else 100.0)
        self.url = url
        self.at = at

    def bench(self, cell: CellSpec) -> CellResultRecord:
        measured = super().bench(cell)
        if len(self.boots) == self.at:
            take_away(self.url)
        return measured


def _resumed(
    ledger: Ledger, stopping: Stopping, testbed: ScriptedTestbed, said: io.StringIO
) -> RoundReport:
    """The round as a round's command runs it: the last stop folded, then resumed."""
    return through_ledger_outages(
        lambda: stopping.attempt(
            ledger, lambda: _round(ledger, testbed, said), lambda line: print(line, file=said)
        ),
        note=lambda line: print(line, file=said),
        sleep=lambda _s: None,
        waits=(1.0, 2.0),
    )


def test_a_postgresql_ledger_away_past_the_last_wait_keeps_the_stop_and_the_cell(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server still away after the last wait: the stop and the cell measured were lost
    with the command's last line. They are kept, and folded in once the server answers."""
    monkeypatch.setenv("ORCHESTRATE_CACHE", str(tmp_path / "cache"))
    cluster = "scripted"
    said = io.StringIO()
    with Ledger(pg_url) as ledger:
        try:
            with (
                pytest.raises(LedgerError) as away,
                kept_on_stop(pg_url, cluster) as stopping,
            ):
                stopping.keeps = True
                stopping.round_id = 1  # the command's, from its round (a new ledger: round 1)
                _resumed(ledger, stopping, AwayInCell(pg_url, at=2), said)
        finally:
            bring_back(pg_url)
        assert away.value.unreachable
        assert "this stop is kept in" in away.value.message, away.value.message
        (kept,) = found(pg_url, cluster)
        assert kept.round_id == 1, kept
        (cell,) = kept.cells
        assert "its ledger could not record it" in kept.said()
        # the ledger lacks that cell, and any record of the stop
        assert not [c for c in ledger.cell_results(cell.experiment_id) if c.boot_id == cell.boot_id]
        assert not ledger.events(cluster, EventKind.ROUND_STOPPED)

        # the next command: folded in, then resumed to its budget, the cell not measured again
        again = Stopping(pg_url, cluster, keeps=True)
        again.resuming([kept])
        report = _resumed(ledger, again, ScriptedTestbed(lambda c, n: 100.0), said)
        assert report.resumed and ledger.round(report.round.id).status == RoundStatus.DONE
        assert found(pg_url, cluster) == []
        readings = [c for c in ledger.cell_results(cell.experiment_id) if c.boot_id == cell.boot_id]
        assert [r.result for r in readings] == [cell.result], readings
        (stop,) = ledger.events(cluster, EventKind.ROUND_STOPPED)
        assert stop.subject == "1" and stop.detail["recorded_late"] is True, stop
        assert "the ledger records now the stop it could not take" in said.getvalue()


#: A script's ledger, in the folder it runs in, and how it creates a round (the scripts below
#: and ``test_unrecorded_kept``'s).
LEDGER_HERE = """
url = "sqlite:///" + os.path.abspath("orchestrate.db")
def create(ledger, cluster, name="p"):
    return ledger.create_round(cluster=cluster, profile_name=name, profile_digest="d", budget=1,
                               proposer="optuna", approve="auto", seed=0)
"""
#: A script's night that needs a page more than the full disk has (after ``FILL_DISK``).
NIGHT = """    def night():  # until a page more is needed than the disk has
        for i in range(64):
            create(ledger, f"other{i}", "p" * 4000)
"""

#: In a tmpfs of 1 MiB: a round; the disk filled; a round's command whose writes find it full
#: past the last wait; the disk freed; the next command's fold.
_STILL_FULL = (
    """
import json, os, sys
from ledger import Ledger, LedgerError
from knobs.vocabulary import EventKind
from orchestrator.outages import through_ledger_outages
from orchestrator.unrecorded import Stopping, found, kept_on_stop
said = {}"""
    + LEDGER_HERE
    + """with Ledger(url) as ledger:
    create(ledger, "c")"""
    + FILL_DISK
    + NIGHT
    + """    waits = []
    try:
        with kept_on_stop(url, "c") as stopping:
            stopping.keeps, stopping.round_id = True, 1
            through_ledger_outages(night, note=lambda _l: None, sleep=waits.append,
                                   waits=(1.0, 2.0))
    except LedgerError as e:
        said["message"] = e.message
    said["waits"] = waits
    kept = found(url, "c")
    said["kept"] = [k.as_json() for k in kept]
    os.remove("filler")
    again = Stopping(url, "c", keeps=True)
    again.resuming(kept)
    again.attempt(ledger, lambda: None, note=lambda _l: None)
    said["after"] = found(url, "c") == []
    said["stops"] = [(e.subject, e.detail) for e in ledger.events("c", EventKind.ROUND_STOPPED)]
print(json.dumps(said))
"""
)


def test_a_ledger_whose_disk_is_still_full_after_the_last_wait_keeps_the_stop_for_the_morning(
    tmp_path: Path,
) -> None:
    """The round waited out a full disk, and it was still full: the stop ended the command and
    was recorded nowhere. It is kept outside the ledger's disk, and folded in once it has room."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "ORCHESTRATE_CACHE": str(cache)}
    done = in_tmpfs(tmp_path / "disk", sys.executable, "-c", _STILL_FULL, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)
    assert said["waits"] == [1.0, 2.0], said
    assert "the disk of the ledger's file is full" in said["message"], said
    assert f"this stop is kept in {cache}" in said["message"], said
    (kept,) = said["kept"]
    assert kept["round"] == 1 and kept["exit_code"] == 4, said
    assert "the disk of the ledger's file is full" in kept["reason"], kept
    assert said["after"] is True, said
    ((subject, detail),) = said["stops"]
    assert subject == "1" and detail["recorded_late"] is True, said
