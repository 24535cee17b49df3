"""Where there is no ledger, a command that only reads it, or that fails before it writes (a
proposal, an experiment named by its ID), says so in one line and exit 4, and creates none: no
SQLite file, no tables in a PostgreSQL database. Only a command that records something (a
round) creates it."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

from ledger import Ledger
from orchestrator.cli import run

#: Every command that reads the ledger, or fails before it writes where there is none.
READERS = [
    ["status"],
    ["status", "--json"],
    ["experiments", "show", "1"],
    ["experiments", "veto", "1", "--reason", "x"],
    ["proposals", "list"],
    ["proposals", "show", "1"],
    ["proposals", "approve", "1"],
    ["proposals", "veto", "99", "--reason", "x"],
    ["known-bad", "list"],
    ["known-bad", "clear", "1", "--reason", "x"],
    ["export", "-"],
    ["export", "results.tsv"],
    ["report"],
]


def _tables(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        return inspect(engine).get_table_names()
    finally:
        engine.dispose()


@pytest.mark.parametrize("argv", READERS, ids=" ".join)
def test_a_reading_command_says_there_is_no_ledger_and_creates_none(
    argv: list[str],
    ledger_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATE_LEDGER", ledger_url)
    code = run(argv)
    out, err = capsys.readouterr()
    shown = make_url(ledger_url).render_as_string(hide_password=True)
    assert code == 4, (argv, out, err)
    assert err.strip().splitlines() == [
        f"Error: no ledger yet at {shown}: `orchestrate round` creates it (ORCHESTRATE_LEDGER "
        "or the profile's ledger_url names another)"
    ]
    assert out == ""
    assert not (tmp_path / "results.tsv").exists()
    # loading the profile chose the cluster's ports; only a deploy keeps them in a file
    assert not (tmp_path / ".orchestrate").exists(), "no node workdir created"
    if ledger_url.startswith("sqlite"):
        assert not (tmp_path / "ledger.db").exists(), "no SQLite file created"
    else:
        assert _tables(ledger_url) == [], "no tables created"


def test_a_round_still_creates_the_ledger_a_reader_then_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After the refusal, the ledger a command that writes creates is read as before: an
    empty one is no error (``proposals list`` says there is nothing pending)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCHESTRATE_LEDGER", raising=False)
    assert run(["proposals", "veto", "99", "--reason", "x"]) == 4
    assert not (tmp_path / "orchestrate.db").exists()
    capsys.readouterr()
    Ledger("sqlite:///orchestrate.db").close()  # what a round's first step does
    assert run(["proposals", "veto", "99", "--reason", "x"]) == 3
    assert run(["proposals", "list"]) == 0
    out, _ = capsys.readouterr()
    assert out.strip() == "no pending proposals"


def test_cluster_status_in_an_empty_folder_creates_nothing_and_says_nothing_was_deployed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cluster status`` reads the nodes, not the ledger: in a folder the embedded cluster
    was never deployed from, each node is stopped, the folder is said to hold no deployment,
    and nothing is written (it wrote the head's ``cluster.ports``)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCHESTRATE_LEDGER", raising=False)
    assert run(["cluster", "status"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        *(f"node-{rank} (127.0.0.1): stopped" for rank in range(4)),
        "nothing was deployed here (.orchestrate/twin/node-0 is not there): `orchestrate "
        "cluster up` deploys the champion, `orchestrate round` runs a round; a cluster "
        "deployed from another folder is seen from that folder",
    ], err
    assert list(tmp_path.iterdir()) == []
