"""A command given no ``--profile`` reads the embedded twin's cluster. On a ledger that holds
another stack's rounds and none of the twin's, its confident answers were about nothing: an
empty veto queue while a proposal waited, an empty results.tsv written over the real one, exit
0. It now says so in one line and writes nothing; ``$ORCHESTRATE_PROFILE`` names the shell's
profile once for every command."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger
from orchestrator.cli import run
from tests.fixtures.profiles import twin_profile_data, write_profile

#: Commands a person on call runs, none of which writes a round.
READERS = [
    ["status"],
    ["proposals", "list"],
    ["known-bad", "list"],
    ["export", "results.tsv"],
]


def _another_stack(tmp_path: Path) -> Path:
    """A ledger with one round of cluster ``mystack`` and none of the twin's; its profile."""
    data = twin_profile_data()
    data["cluster"] = {**data["cluster"], "name": "mystack"}
    path = write_profile(tmp_path, data, "mystack.yaml")
    with Ledger("sqlite:///orchestrate.db") as ledger:
        ledger.create_round(
            cluster="mystack", profile_name="mystack", profile_digest="", budget=1,
            proposer="sweep", approve="auto", seed=0,
        )  # fmt: skip
    return path


@pytest.mark.parametrize("argv", READERS, ids=" ".join)
def test_no_profile_on_a_ledger_of_another_stack_says_so_and_writes_nothing(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCHESTRATE_LEDGER", raising=False)
    monkeypatch.delenv("ORCHESTRATE_PROFILE", raising=False)
    path = _another_stack(tmp_path)
    (tmp_path / "results.tsv").write_text("the real one\n")
    assert run(argv) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        "Error: no --profile given, and the ledger sqlite:///orchestrate.db holds no cluster "
        "twin-local (the default profile's); it holds mystack: pass --profile FILE (or set "
        "ORCHESTRATE_PROFILE=FILE for this shell)"
    ], err
    assert out == ""
    assert (tmp_path / "results.tsv").read_text() == "the real one\n"
    # the shell's profile, named once, is every command's
    monkeypatch.setenv("ORCHESTRATE_PROFILE", str(path))
    assert run(argv) == 0, capsys.readouterr()


def test_no_profile_on_the_twins_own_or_an_empty_ledger_is_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCHESTRATE_LEDGER", raising=False)
    monkeypatch.delenv("ORCHESTRATE_PROFILE", raising=False)
    Ledger("sqlite:///orchestrate.db").close()
    assert run(["proposals", "list"]) == 0
    assert capsys.readouterr().out.strip() == "no pending proposals"
    _another_stack(tmp_path)
    with Ledger("sqlite:///orchestrate.db") as ledger:
        ledger.create_round(
            cluster="twin-local", profile_name="twin", profile_digest="", budget=1,
            proposer="sweep", approve="auto", seed=0,
        )  # fmt: skip
    assert run(["proposals", "list"]) == 0
    assert capsys.readouterr().out.strip() == "no pending proposals"
