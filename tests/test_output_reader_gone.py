"""A command whose output's reader went away (``orchestrate status | head -1``; the ``tee`` of
``orchestrate round | tee night.log`` killed) sends the rest of its output to /dev/null
(``interrupts.outliving_readers``). Before, the first line written after the reader left ended
it with exit code 1 and nothing said: ``status | head -1`` failed a script under ``pipefail``,
and a round ended mid-boot with its boot left "interrupted or killed". ``status`` goes on to
its end; a round stops at its next safe point, before its next boot, as a SIGHUP stops it
(``interrupts.stop_if_unread``): ``round --budget 6 | head -3`` paid every boot of its budget
for nobody."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from knobs.vocabulary import EventKind, Kind
from ledger import Ledger
from tests.fixtures.cli import ORCHESTRATE, orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile


def _without_a_reader(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``orchestrate *args`` with its stdout a pipe whose reader is gone before the first
    line: every line it writes there meets a broken pipe. Its stderr is kept."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [*ORCHESTRATE, *args],
            cwd=cwd,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        os.close(write)


def _twin(tmp_path: Path) -> None:
    """A two-node twin whose one cell measures for half a second."""
    data: dict[str, Any] = twin_profile_data(nodes=2)
    argv = data["launcher"]["argv"]
    argv[argv.index("--tensor-parallel-size") + 1] = "2"
    data["cells"] = [c for c in data["cells"] if c["name"] == "code-c1"]
    for cell in data["cells"]:
        cell["warmup_s"] = 0.1
        cell["duration_s"] = 0.5
    write_profile(tmp_path, data)


def _stopped_unread(ledger: Ledger) -> None:
    """The round stopped for its reader, between boots: open for the resume, nothing open."""
    [rnd] = ledger.rounds("twin-local")
    assert ledger.unfinished_round("twin-local") == rnd
    assert ledger.open_boots() == []
    [stop] = ledger.events("twin-local", EventKind.ROUND_STOPPED)
    assert stop.detail["error"] == "SIGPIPE", stop.detail
    assert stop.reason == (
        "interrupted by SIGPIPE (the reader of its output went away: `| head`, a `tee` that "
        "ended; it stopped before its next boot); run the same command again to resume"
    ), stop.reason


def test_a_round_piped_into_head_stops_before_its_next_boot(tmp_path: Path) -> None:
    """``orchestrate round --budget 6 | head -3`` through a real ``head``: once head has its
    three lines and exits, the round stops at its next safe point, before the next boot (the
    boot under way finished and recorded, its engines stopped), and exits 130 with one line,
    as a SIGHUP ends it. Before, it booted on until its budget was spent and exited 0."""
    _twin(tmp_path)
    try:
        round_ = subprocess.Popen(
            [*ORCHESTRATE, "round", "--budget", "6", "-p", "profile.yaml"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert round_.stdout is not None
        head = subprocess.run(
            ["head", "-3"], stdin=round_.stdout, capture_output=True, text=True, timeout=300
        )
        round_.stdout.close()  # head is the pipe's only reader, and it is gone
        _, stderr = round_.communicate(timeout=600)
        assert len(head.stdout.splitlines()) == 3, head.stdout
        assert round_.returncode == 130, stderr
        assert "Traceback" not in stderr, stderr
        assert stderr.splitlines()[-1] == (
            "Error: interrupted; run the same command again to resume"
        ), stderr
        with Ledger(f"sqlite:///{tmp_path / 'orchestrate.db'}") as ledger:
            _stopped_unread(ledger)
            decided = [e for e in ledger.experiments() if e.decided_at is not None]
            candidates = [e for e in decided if e.kind == Kind.CANDIDATE]
            assert len(candidates) < 6, "it booted on for nobody"
    finally:
        orchestrate(tmp_path, "cluster", "down", "-p", "profile.yaml")


def test_a_round_whose_reader_is_gone_at_once_boots_nothing_and_status_goes_on(
    tmp_path: Path,
) -> None:
    """A reader gone before the first line: the round stops before its first boot (it had
    written its first line, meeting the broken pipe, before it); ``status`` goes on to its
    end and exits 0, as ``status | head -1`` must under ``pipefail``."""
    _twin(tmp_path)
    try:
        done = _without_a_reader(tmp_path, "round", "--budget", "1", "-p", "profile.yaml")
        assert done.returncode == 130, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        with Ledger(f"sqlite:///{tmp_path / 'orchestrate.db'}") as ledger:
            _stopped_unread(ledger)
            assert all(ledger.boots(e.id) == [] for e in ledger.experiments())
        status = _without_a_reader(tmp_path, "status", "-p", "profile.yaml")
        assert (status.returncode, status.stderr) == (0, "")
    finally:
        orchestrate(tmp_path, "cluster", "down", "-p", "profile.yaml")
