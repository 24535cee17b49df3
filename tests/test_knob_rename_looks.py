"""Looks recorded under a knob's old name count under its new one (``renamed_from``). Before,
the verdict counted a change's earlier looks by the keys the ledger recorded them under: a look
at ``chunk=2048`` was no look at ``mnbt=2048``, so the knob's second look read as its first
(``second look after #2`` missing from its record) and, stopped again for want of boots, it
was said open for yet another second look; the knob's prior counted the two looks at one
change as two changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents import Proposal, ProposalContext, ProposalExhausted
from knobs import Change
from knobs.spec import Value
from knobs.vocabulary import Kind, Status
from ledger import Ledger
from orchestrator.priors import learned_prior
from orchestrator.profile import load_profile
from tests.test_knob_renames import data
from tests.test_profile_evolution_under_way import round_of

#: the sequential verdict, one boot a look, one second look: a change of +5 % is stopped at its
#: boot cap while it still promises a gain
VERDICT = {"policy": "sequential", "max_boots": 1, "second_looks": 1}
#: a knob that matters more often than not (the profile's prior would discard +5 % at once)
PRIOR = {"effect_prior": {"p_null": 0.2, "effect_pct": 10}}


class Once:
    """Proposes ``knob=value`` once, whatever the history says of it (a person's own pick)."""

    name = "once"

    def __init__(self, knob: str, value: Value) -> None:
        self.knob, self.value, self.done = knob, value, False

    def propose(self, context: ProposalContext) -> Proposal:
        if self.done:
            raise ProposalExhausted("none", proposer=self.name, considered=0)
        self.done = True
        change = Change(knob=self.knob, old=context.champion[self.knob], new=self.value)
        return Proposal(
            change=change,
            source=self.name,
            hypothesis="a second look",
            expected_effect="+5%",
            risk="none",
            estimated_cost="1 boot",
        )


def speed(config: Any) -> float:
    """2048 tokens is 5 % faster, under either name."""
    values = config.as_dict()
    return 105.0 if values.get("chunk", values.get("mnbt")) == 2048 else 100.0


def test_looks_under_a_knobs_old_name_count_for_its_new_one(tmp_path: Path) -> None:
    round_of(tmp_path, {**data(**PRIOR), "verdict": VERDICT}, 1, Once("chunk", 2048), speed=speed)
    renamed = {**data(**PRIOR, name="mnbt", renamed_from="chunk"), "verdict": VERDICT}
    round_of(tmp_path, renamed, 1, Once("mnbt", 2048), speed=speed)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        first, second = [e for e in ledger.experiments() if e.kind == Kind.CANDIDATE]
        assert (first.knob, second.knob) == ("chunk", "mnbt")
        # the first look: stopped at its boot cap, open for its one second look
        assert first.status == Status.INCONCLUSIVE, first
        assert "open for a second look" in (first.description or ""), first.description
        # the look at mnbt=2048 is chunk=2048's second: its record names the first, and,
        # stopped again, it is open for no further second look (second_looks: 1)
        said = second.description or ""
        assert f"second look after #{first.id}" in said, said
        assert "open for a second look" not in said, said
        # the knob's prior: two looks at one change
        profile = load_profile(str(tmp_path / "profile.yaml"), base_dir=tmp_path)
        prior = learned_prior(profile, ledger, "mnbt")
        assert prior is not None and "2 look(s) at 1 measured change(s)" in prior.source, prior
