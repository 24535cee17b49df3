"""``orchestrate proposals list | approve | veto`` on a real SQLite ledger, through the real
CLI: a change reads ``knob old → new`` with the arrow the rest of the CLI prints."""

from __future__ import annotations

import getpass
import socket
from pathlib import Path

import pytest

from knobs.vocabulary import Kind, Status
from ledger import Ledger, VerdictRecord
from orchestrator.cli import run
from orchestrator.profile import load_profile
from tests.fixtures.profiles import twin_profile_data, write_profile

WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def _pending(url: str) -> tuple[int, int]:
    """A round with two pending proposals, one a coupled move; their IDs."""
    with Ledger(url) as ledger:
        rnd = ledger.create_round(
            cluster="twin-local",
            profile_name="twin",
            profile_digest="d",
            budget=2,
            proposer="claude",
            approve="queue",
            seed=0,
        )
        one = ledger.add_proposal(
            round_id=rnd.id,
            source="claude",
            knob="num_speculative_tokens",
            old_value=7,
            new_value=5,
            champion_key="c",
            hypothesis="K=5 drafts fewer rejected tokens.",
        )
        two = ledger.add_proposal(
            round_id=rnd.id,
            source="claude",
            knob="max_num_batched_tokens",
            old_value=2048,
            new_value=8192,
            champion_key="c",
            hypothesis="MNBT 8192.",
            coupled=("enable_chunked_prefill", False, True),
        )
        return one.id, two.id


def test_proposals_are_listed_approved_and_vetoed_with_the_clis_arrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'orchestrate.db'}"
    monkeypatch.setenv("ORCHESTRATE_LEDGER", url)
    one, two = _pending(url)
    assert run(["proposals", "list"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "proposal\tstatus\tdecided by\texperiment\tchange\tsource\treason\thypothesis",
        f"{one}\tpending\t-\t-\tnum_speculative_tokens 7 → 5\tclaude\t-\t"
        "K=5 drafts fewer rejected tokens.",
        f"{two}\tpending\t-\t-\tmax_num_batched_tokens 2048 → 8192 + enable_chunked_prefill "
        "false → true\tclaude\t-\tMNBT 8192.",
    ], err
    assert run(["proposals", "approve", str(one)]) == 0
    assert capsys.readouterr().out == f"approved proposal {one}: num_speculative_tokens 7 → 5\n"
    assert run(["proposals", "veto", str(two), "--reason", "too big"]) == 0
    assert capsys.readouterr().out == (
        f"vetoed proposal {two}: max_num_batched_tokens 2048 → 8192 + enable_chunked_prefill "
        "false → true\n"
    )


def test_proposals_are_the_profiles_clusters_on_a_shared_ledger(
    tmp_path: Path,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two clusters on one PostgreSQL ledger: the profile's cluster (twin-local) lists only
    its own proposals, and approving or vetoing the other's is refused in one line naming
    its cluster, exit 3 (as an unknown ID is); the other's profile decides it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATE_LEDGER", pg_url)
    mine, _ = _pending(pg_url)
    data = twin_profile_data()
    data["cluster"]["name"] = "rack-b"
    other_profile = str(write_profile(tmp_path, data, "b.yaml"))
    with Ledger(pg_url) as ledger:
        rnd = ledger.create_round(
            cluster="rack-b", profile_name="b", profile_digest="d", budget=2,
            proposer="claude", approve="queue", seed=0,
        )  # fmt: skip
        theirs = ledger.add_proposal(
            round_id=rnd.id, source="claude", knob="num_speculative_tokens", old_value=7,
            new_value=3, champion_key="c", hypothesis="K=3.",
        ).id  # fmt: skip
    assert run(["proposals", "list"]) == 0
    listed = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert str(theirs) not in listed and str(mine) in listed, listed
    for verb in (["approve"], ["veto", "--reason", "no"]):
        assert run(["proposals", verb[0], str(theirs), *verb[1:]]) == 3
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"Error: proposal {theirs} is cluster rack-b's, not twin-local's: decide it with "
            "rack-b's profile (`orchestrate proposals list -p …`)"
        ], err
    with Ledger(pg_url) as ledger:
        assert ledger.proposal(theirs).status == "pending"
    assert run(["proposals", "veto", str(theirs), "--reason", "no", "-p", other_profile]) == 0
    assert run(["proposals", "list", "-p", other_profile]) == 0
    assert capsys.readouterr().out.endswith("no pending proposals\n")


def test_a_proposal_is_approved_with_an_edited_value_checked_as_the_ask_prompts_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``proposals approve N --value V``: a value out of the knob's domain, the champion's own,
    one the profile forbids, or an edit of a coupled move is refused in one line (exit 3) and
    the proposal stays pending; an allowed one is approved as an edit, recorded as the ask
    prompt's edit is (``user@host (edited)``, the value proposed kept)."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'orchestrate.db'}"
    monkeypatch.setenv("ORCHESTRATE_LEDGER", url)
    data = twin_profile_data()
    data["forbidden"] = [{"when": {"num_speculative_tokens": 3}, "reason": "K=3 wedges rank 2"}]
    path = write_profile(tmp_path, data, "profile.yaml")
    one, two = _pending(url)
    with Ledger(url) as ledger:  # the round's baseline, its champion
        champion = load_profile(str(path)).initial_champion()
        base = ledger.add_experiment(
            cluster="twin-local", round_id=1, kind=Kind.BASELINE, config=champion,
            champion_key=None, champion_objective=None,
        )  # fmt: skip
        keep = VerdictRecord(status=Status.KEEP, rule="baseline", reason="baseline", stats={})
        ledger.decide(
            base.id, verdict=keep, objective=1000.0, delta_pct=None, accept_len=None, promote=True
        )
    refused = {
        "7; reboot": "knob num_speculative_tokens: '7; reboot' is not an integer from 1 to 7",
        "7": "knob num_speculative_tokens: 7 is already the champion's value",
        "3": "forbidden combination num_speculative_tokens=3: K=3 wedges rank 2",
    }
    for value, why in refused.items():
        assert run(["proposals", "approve", str(one), "--value", value, "-p", str(path)]) == 3
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"Error: {why}"), err
    assert run(["proposals", "approve", str(two), "--value", "4096", "-p", str(path)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "Error: a coupled move is approved or vetoed as proposed: its second knob's value is "
        "the one its failure asks for (veto it, and propose a one-knob change)"
    ], err
    with Ledger(url) as ledger:
        assert [ledger.proposal(i).status for i in (one, two)] == ["pending", "pending"]
    assert run(["proposals", "approve", str(one), "--value", "4", "-p", str(path)]) == 0
    assert capsys.readouterr().out == f"approved proposal {one}: num_speculative_tokens 7 → 4\n"
    with Ledger(url) as ledger:
        p = ledger.proposal(one)
    assert (p.status, p.decided_by, p.new_value, p.notes["edited_from"]) == (
        "approved",
        f"{getpass.getuser()}@{socket.gethostname()} (edited)",
        4,
        "5",
    )
    assert p.hypothesis.startswith("edited by a person from 5 to 4; the proposer's hypothesis")
    # approved while its round is stopped: status says the resume boots it first (review E1)
    assert run(["status", "-p", str(path)]) == 0
    said = capsys.readouterr().out
    assert (
        f"proposal {one} of round 1 approved by {WHO} (edited): num_speculative_tokens 7 → 4; "
        "the resume boots it first"
    ) in " ".join(said.split()), said
    # decided: a second approve is refused as a plain one is
    assert run(["proposals", "approve", str(one), "--value", "6", "-p", str(path)]) == 3
    assert "already approved" in capsys.readouterr().err
