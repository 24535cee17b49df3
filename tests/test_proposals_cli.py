"""``orchestrate proposals list | approve | veto`` on a real SQLite ledger, through the real
CLI: a change reads ``knob old → new`` with the arrow the rest of the CLI prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger
from orchestrator.cli import run


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
        f"{one}\tpending\tnum_speculative_tokens 7 → 5\tclaude\tK=5 drafts fewer rejected tokens.",
        f"{two}\tpending\tmax_num_batched_tokens 2048 → 8192 + enable_chunked_prefill "
        "false → true\tclaude\tMNBT 8192.",
    ], err
    assert run(["proposals", "approve", str(one)]) == 0
    assert capsys.readouterr().out == f"approved proposal {one}: num_speculative_tokens → 5\n"
    assert run(["proposals", "veto", str(two), "--reason", "too big"]) == 0
    assert capsys.readouterr().out == (
        f"vetoed proposal {two}: max_num_batched_tokens → 8192 + enable_chunked_prefill → true\n"
    )
