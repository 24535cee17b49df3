"""A round whose proposer has nothing left untried under the champion: the changes the verdict
stopped for want of boots are looked at again, the most promising first, while their
posteriors promise a gain; once every one-knob change is decided or barred, the round ends,
says what would give the next one something to try, and the next one ends at once. The real
loop, ledger, verdict and Optuna proposer run on a scripted testbed."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from agents import OptunaProposer
from knobs.config import Config
from knobs.vocabulary import RoundStatus, Status
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import Profile
from orchestrator.round import RoundOptions, RoundReport, RoundRunner
from orchestrator.testbed import NullSink
from tests.test_round_policy import CELL, ScriptedTestbed

#: Two knobs of a made-up engine: three one-knob changes from the champion (graphs on,
#: depth 1, depth 3).
KNOBS = [
    {
        "name": "graphs",
        "type": "bool",
        "default": False,
        "render": {"kind": "switch", "when_false": ["--eager"]},
    },
    {
        "name": "depth",
        "type": "int",
        "low": 1,
        "high": 3,
        "default": 2,
        "render": {"kind": "flag", "flag": "--depth"},
    },
]


def profile(**verdict: object) -> Profile:
    return Profile.model_validate(
        {
            "name": "small",
            "model": "m",
            "cluster": {
                "name": "small",
                "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": "/tmp/x"}],
            },
            "launcher": {"argv": ["true"]},
            "knobs": KNOBS,
            "cells": [CELL.model_dump()],
            "verdict": {"noise": {"boot_to_boot": 0.02, "run_to_run": 0.01}, **verdict},
        }
    )


def speed(graphs: float) -> Callable[[Config, int], float | None]:
    """depth 3 does not boot, depth 1 is 10 % slower, graphs on reads ``graphs`` on every
    boot; the champion's boots read 98 and 102 in turn."""

    def measure(config: Config, boot: int) -> float | None:
        if config["depth"] == 3:
            return None
        wobble = 0.98 if boot % 2 else 1.02
        if config["depth"] == 1:
            return 90.0 * wobble
        return graphs if config["graphs"] is True else 100.0 * wobble

    return measure


def a_round(
    ledger: Ledger, prof: Profile, budget: int, graphs: float = 104.0
) -> tuple[RoundReport, str]:
    said = io.StringIO()
    report = RoundRunner(
        prof,
        ledger,
        NullSink(),
        ScriptedTestbed(speed(graphs)),
        OptunaProposer(seed=0),
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=said, width=400)),
    ).run(RoundOptions(budget=budget, proposer="optuna", approve="auto"))
    return report, said.getvalue()


def test_with_nothing_left_untried_a_change_stopped_for_want_of_boots_is_looked_at_again(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    first, said = a_round(ledger, profile(), budget=10)
    looked = [(e.knob, e.value, e.status) for e in first.experiments[1:]]
    assert looked == [
        ("graphs", True, Status.DISCARD),  # +4 % on one boot: a keep out of reach in three
        # barred, once the champion booted after its second failure (the cluster still boots)
        ("depth", 3, Status.CRASH),
        ("depth", 1, Status.DISCARD),  # worse: settled by its boot
        # nothing is left untried: the change stopped for want of boots, again, its earlier
        # boots counted, until its boots settle it
        ("graphs", True, Status.INCONCLUSIVE),
        ("graphs", True, Status.KEEP),
        # under the new champion: the one value left of depth, and graphs back off
        ("depth", 1, Status.DISCARD),
        ("graphs", False, Status.DISCARD),
    ]
    # the champion's boot between the crash's second failure and its verdict
    crashed = ledger.experiment(first.experiments[2].id)
    failed = ledger.boots(crashed.id)[-1].started_at
    assert crashed.decided_at is not None
    assert [
        b.role
        for b in ledger.boots(first.experiments[0].id)
        if failed < b.started_at <= crashed.decided_at
    ] == ["remeasure"]
    notes = [p.notes for p in ledger.proposals(round_id=first.round.id)]
    assert [n["sampler"] for n in notes[3:5]] == ["further look", "second look"]
    assert notes[3]["second_look"].startswith(
        "nothing is left untried under this champion, and its boots did not settle it: it "
        "still promises "
    )
    # then nothing is left: the round ends with the budget not spent, and says what would
    # give the next round something to try
    assert first.stopped_by == "exhausted" and first.round.status == RoundStatus.DONE
    assert (
        "round 1 ended after 7 of 10 experiments, nothing left to try: optuna: no allowed "
        "one-knob change is left among 3 neighbours (2 decided, 1 known-bad). Every one-knob "
        "change of the champion is decided under it or barred (one its boots did not settle "
        "is looked at again while it promises a gain); the next round has something to try "
        "only if you give a knob more values, or add a knob, in the profile, "
        "or clear a known-bad region you know was not the config's doing (orchestrate "
        "known-bad list, then clear ID --reason)"
    ) in " ".join(said.split())

    again, said = a_round(ledger, profile(), budget=10)
    assert again.stopped_by == "exhausted" and again.round.status == RoundStatus.DONE
    assert not [e for e in again.experiments if e.round_id == again.round.id]
    assert "round 2 ended after 0 of 10 experiments, nothing left to try" in said


def test_a_change_discarded_as_not_worth_it_on_one_boot_is_looked_at_again_when_nothing_is_left(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    report, said = a_round(ledger, profile(), budget=6, graphs=103.0)
    looked = [(e.knob, e.value) for e in report.experiments[1:]]
    first = ledger.verdict(report.experiments[1].id)
    assert looked[0] == ("graphs", True) and first is not None
    # +3 % on one boot against two: not worth a change by the posterior, not clearly worse
    assert (report.experiments[1].status, first.rule) == (Status.DISCARD, "posterior")
    assert "not worth a change" in first.reason
    # the other two changes decided, it is the change looked at again
    assert looked[1:4] == [("depth", 3), ("depth", 1), ("graphs", True)], said
