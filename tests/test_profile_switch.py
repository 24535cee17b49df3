"""A profile switched or edited between a kill and its resume, or between rounds: the resume
says what changed in the profile's own terms (``orchestrator.revision``), and a knob dropped
and put back is recorded both ways (``evolution.knob_changes`` against the last profile
recorded, not the champion's row)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents import SweepProposer
from knobs.vocabulary import EventKind
from ledger import Ledger
from tests.test_profile_evolution import CELL, FOO, profile_data, run_round
from tests.test_profile_evolution_under_way import MNBT, killed_as_it_boots, round_of

K = "num_speculative_tokens"


def switched(**changes: Any) -> dict[str, Any]:
    """``profile_data()`` switched to another profile (``q``) with foo added, K narrowed to
    1–4, a forbidden combination and the cell redefined (``changes`` on top)."""
    data = profile_data({**FOO, "new": True}, {"name": K, "high": 4, "default": 2})
    data.update(
        name="q",
        forbidden=[{"when": {K: 3, "cuda_graphs": True}, "reason": "wedges the engine"}],
        cells=[{**CELL.model_dump(), "concurrency": 4}],
        **changes,
    )
    return data


def test_a_resume_under_another_profile_says_what_changed_not_two_digests(
    tmp_path: Path,
) -> None:
    """Killed as its change boots; resumed with ``--profile`` of another profile. Before, the
    resume said `the profile changed since round 1 started (p 1a2b… → q 3c4d…)`, two digests
    that say nothing of what changed. Now the line names the knob added, the domain narrowed,
    the forbidden combination, the cell redefined and the section changed; no digest."""
    killed_as_it_boots(tmp_path, {MNBT: 6144})
    shown, _ = round_of(
        tmp_path, switched(verdict={"policy": "threshold", "threshold_pct": 3.0}), 1
    )
    assert "the profile changed since round 1 started (p → q): " in shown, shown
    for words in (
        "knob foo added (an integer from 1 to 5, default 3)",
        f"knob {K}'s domain narrowed: an integer from 1 to ",
        f"→ an integer from 1 to 4; knob {K}'s default ",
        f"forbidden combination added: {K}=3, cuda_graphs=true: wedges the engine",
        "cell code-c1 redefined (concurrency 1 → 4)",
        "verdict.threshold_pct 2.0 → 3.0: the round goes on under the profile as it is now",
    ):
        assert words in shown, (words, shown)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        [_, now] = ledger.events("evolving", EventKind.PROFILE_REVISED)
        assert now.detail["name"] == "q"
    assert now.subject[:12] not in shown


def test_a_new_round_under_an_edited_profile_says_what_changed_since_the_last_run(
    tmp_path: Path,
) -> None:
    run_round(tmp_path, 1)
    edited = {**profile_data(), "cells": [{**CELL.model_dump(), "warmup_s": 0.5}]}
    shown, _ = round_of(tmp_path, edited, 1)
    assert (
        "the profile changed since evolving last ran (p): cell code-c1 redefined (warmup_s "
        "1.0 → 0.5)"
    ) in shown, shown
    shown, _ = round_of(tmp_path, edited, 1)  # said once
    assert "the profile changed" not in shown


def test_the_settings_an_edit_changed_are_named_by_their_keys_not_their_section(
    tmp_path: Path,
) -> None:
    """The verdict's noise and a gate edited between two rounds: the line said `verdict,
    gates changed`, which names no setting. Now it names each (``verdict.noise.run_to_run
    0.02 → 0.03``) with the cell added, on one line; a launcher's text is named, not shown."""
    run_round(tmp_path, 1)
    added = {**CELL.model_dump(), "name": "prose-c2", "category": "prose"}
    edited = {
        **profile_data(),
        "verdict": {
            "policy": "threshold",
            "threshold_pct": 2.0,
            "noise": {"run_to_run": 0.03, "boot_to_boot": 0.05},
        },
        "gates": {"min_matmul_rate": 0.8},
        "launcher": {"argv": ["true"], "env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx"}},
        "cells": [CELL.model_dump(), added],
    }
    shown, _ = round_of(tmp_path, edited, 1)
    assert (
        "the profile changed since evolving last ran (p): cell prose-c2 added; "
        "gates.min_matmul_rate 0.9 → 0.8; launcher.env.HF_TOKEN changed; "
        "verdict.noise.run_to_run 0.02 → 0.03 re-measuring the champion"
    ) in shown, shown
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        events = ledger.events("evolving", EventKind.PROFILE_REVISED)
    assert "hf_abcdefghijklmnopqrstuvwx" not in str([e.detail for e in events])


def knob_events(tmp_path: Path) -> list[tuple[str, str, object]]:
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        return [
            (e.kind, e.subject, e.detail.get("value", e.detail.get("default")))
            for kind in (EventKind.KNOB_ADDED, EventKind.KNOB_REMOVED)
            for e in ledger.events("evolving", kind)
        ]


def test_a_knob_dropped_and_put_back_is_recorded_both_ways_each_time(tmp_path: Path) -> None:
    """foo in the profile (the champion runs foo=3), dropped, put back by switching to
    another profile, dropped again. Before, putting it back recorded and said nothing (the
    champion's row still carried foo, so nothing looked added), and dropping it again said
    nothing either (a ``knob-removed`` was on record for the champion already): the ledger
    told of one drop. Now each change is said and recorded, against the profile the cluster
    last ran under."""
    foo = {**FOO, "new": True}
    run_round(tmp_path, 1, foo)
    shown, _ = run_round(tmp_path, 1)
    assert "knob foo is no longer in the profile: dropped from the champion (was 3)" in shown
    back = {**profile_data(foo), "name": "q"}
    shown, testbed = round_of(tmp_path, back, 1, SweepProposer([{K: 5}]))
    assert (
        "profile gained knob foo back: the champion takes 3 again, as it ran it (experiment #1)"
    ) in shown, shown
    assert testbed.boots and all(b["foo"] == 3 for b in testbed.boots)
    shown, _ = run_round(tmp_path, 1)
    assert "knob foo is no longer in the profile: dropped from the champion (was 3)" in shown
    assert knob_events(tmp_path) == [
        (EventKind.KNOB_ADDED, "foo", 3),
        (EventKind.KNOB_REMOVED, "foo", 3),
        (EventKind.KNOB_REMOVED, "foo", 3),
    ]
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        [added] = ledger.events("evolving", EventKind.KNOB_ADDED)
        assert added.detail["from_experiment"] == added.detail["champion_experiment"] == 1
        assert (
            added.reason == "the profile gained the knob back; the champion takes it as it ran it"
        )
    shown, _ = run_round(tmp_path, 1)  # nothing changed since: nothing said or recorded
    assert "foo" not in shown and len(knob_events(tmp_path)) == 3


def test_a_profile_a_later_release_recorded_is_read_as_far_as_it_can_be(
    tmp_path: Path,
) -> None:
    """A later release ran the cluster and recorded its profile with knob fields this release
    does not know (a new field on K's spec and on its render, a knob of a type this release
    lacks, a new cell field). Before, the whole record was skipped: the round compared its
    profile with the one before it, said nothing had changed, and did not record that the
    cluster ran under its profile again. Now what can be read is kept, the line says in words
    what could not, and no knob is said added or removed for what was not read."""
    run_round(tmp_path, 1)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        [ours] = ledger.events("evolving", EventKind.PROFILE_REVISED)
        detail: dict[str, Any] = dict(ours.detail)
        knobs = [dict(k) for k in detail["knobs"]]
        [i] = [n for n, k in enumerate(knobs) if k["name"] == K]
        knobs[i] = {**knobs[i], "log_scale": True, "render": {**knobs[i]["render"], "shape": 2}}
        knobs.append({**knobs[i], "name": "bar", "type": "float_log"})
        cells = [{**c, "warmup_policy": "adaptive"} for c in detail["cells"]]
        later = {**detail, "knobs": knobs, "cells": cells, "digest": "f" * 64, "future": 1}
        ledger.add_event(
            "evolving", EventKind.PROFILE_REVISED, subject="f" * 64, detail=later, reason="later"
        )
    shown, _ = run_round(tmp_path, 1)
    said = " ".join(shown.split())
    assert (
        "the profile changed since evolving last ran (p): not read, as a later release recorded "
        f"it: knob {K}'s render.shape and log_scale, knob bar, cell code-c1's warmup_policy (the "
        "ledger keeps it as written)"
    ) in said, said
    assert (
        " added" not in said and " removed" not in said and "no longer in the profile" not in (said)
    )
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        recorded = ledger.events("evolving", EventKind.PROFILE_REVISED)
        assert [e.detail["digest"] for e in recorded] == [ours.subject, "f" * 64, ours.subject]
        assert recorded[1].detail == later, "the later release's record is kept as written"
        assert knob_events(tmp_path) == []
