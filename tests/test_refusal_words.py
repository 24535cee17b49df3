"""What a person is told when an edit is refused (the fifty-second session's review, E): a
value already decided under this champion names the experiment that decided it, not a config
hash; a value inside a known-bad region says what lifts the region."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import HistoryEntry, KnownBad
from knobs.errors import KnobError
from knobs.vocabulary import Status
from ledger import Ledger
from orchestrator.approval import approve_edited
from tests.test_agents_context import CHAMPION, change, context

K = "num_speculative_tokens"


def test_a_value_already_decided_names_its_experiment() -> None:
    move = change(K, 5)
    entry = HistoryEntry(
        experiment=7,
        config=dict(CHAMPION.apply(move)),
        knob=K,
        value=5,
        status=Status.DISCARD,
        objective=90.0,
        delta_pct=-10.0,
        champion_key=CHAMPION.key,
    )
    ctx = context(decided=frozenset({CHAMPION.apply(move).key}), history=(entry,))
    assert ctx.allowed(move) == (
        f"{K} 7 → 5 was already decided under this champion (experiment #7, discard)"
    )


def test_an_edit_into_a_known_bad_region_says_what_lifts_it(tmp_path: Path) -> None:
    region = KnownBad(when={K: 3}, reason="TTFT p90 grew +80%", source="guardrail")
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        rnd = ledger.create_round(
            cluster="c", profile_name="p", profile_digest="d", budget=1, proposer="claude",
            approve="queue", seed=0,
        )  # fmt: skip
        proposal = ledger.add_proposal(
            round_id=rnd.id, source="claude", knob=K, old_value=7, new_value=5,
            champion_key=CHAMPION.key,
        )  # fmt: skip
        with pytest.raises(KnobError) as refused:
            approve_edited(ledger, proposal, context(known_bad=(region,)), 3, cluster="c")
        assert ledger.proposal(proposal.id).status == "pending"
    assert refused.value.message == (
        f"{K} 7 → 3 enters a known-bad region: {K}=3 (guardrail: TTFT p90 grew +80%); "
        "`orchestrate known-bad list` names the experiment that barred it, and "
        "`orchestrate known-bad clear N --reason TEXT` lets it run again"
    )
