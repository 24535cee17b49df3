"""A knob renamed under a ledger (``orchestrator.knob_renames``): the champion's value and the
knob's history carry over. Before, a rename read as a knob lost and one gained: the champion
kept at chunk=4096 deployed the new knob's default 7168 from the next round on, the words said
chunk's flag was no longer passed, and the values decided under chunk were booted again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agents import SweepProposer
from knobs.config import Config
from knobs.errors import KnobError, ProfileError
from knobs.names import rename_clash
from knobs.spec import Value
from knobs.vocabulary import Status
from ledger import Ledger
from orchestrator.known_bad import barred_regions
from orchestrator.profile import Profile, load_profile
from orchestrator.rendering import revised
from orchestrator.revision import Revision, differences
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import write_profile
from tests.test_profile_evolution import profile_data
from tests.test_profile_evolution_under_way import round_of

#: A knob of the profile's own on the flag the catalog's MNBT knob renders (that one untuned).
CHUNK = {
    "name": "chunk",
    "type": "int",
    "low": 1024,
    "high": 8192,
    "step": 1024,
    "default": 7168,
    "render": {"kind": "flag", "flag": "--max-num-batched-tokens"},
}


def data(**knob: Any) -> dict[str, Any]:
    """``profile_data`` with knob ``chunk`` (``knob`` on top: a rename), MNBT left untuned."""
    return {**profile_data({**CHUNK, **knob}), "untuned": ["max_num_batched_tokens"]}


def tokens(config: Config) -> Value | None:
    """The value of the knob, under either name."""
    return config.as_dict().get("chunk", config.as_dict().get("mnbt"))


def speed(config: Config) -> float | None:
    """4096 is the fastest; 8192 fails its boot (out of memory); 2048 is slower."""
    speeds: dict[Value | None, float | None] = {4096: 120.0, 8192: None, 2048: 80.0}
    return speeds.get(tokens(config), 100.0)


def measured(tmp_path: Path) -> None:
    """A round under chunk: 4096 kept, 8192 crashed (a barred region), 2048 discarded."""
    moves = [{"chunk": 4096}, {"chunk": 8192}, {"chunk": 2048}]
    round_of(tmp_path, data(), 3, SweepProposer(moves), speed=speed)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion("evolving")
        assert champion is not None and champion.config["chunk"] == 4096
        statuses = {e.value: e.status for e in ledger.experiments(cluster="evolving")}
    assert (statuses[8192], statuses[2048]) == (Status.CRASH, Status.DISCARD), statuses


def ledger_counts(tmp_path: Path) -> tuple[int, int, int]:
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        return (
            len(ledger.rounds("evolving")),
            len(ledger.experiments(cluster="evolving")),
            len(ledger.events("evolving")),
        )


def status(tmp_path: Path) -> Any:
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    done = orchestrate(tmp_path, "status", "--json", "-p", str(tmp_path / "profile.yaml"), env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_knob_declared_renamed_keeps_the_champions_value_and_its_history(
    tmp_path: Path,
) -> None:
    measured(tmp_path)
    moves = [{"mnbt": 4096}, {"mnbt": 8192}, {"mnbt": 2048}, {"mnbt": 3072}]
    shown, bed = round_of(
        tmp_path, data(name="mnbt", renamed_from="chunk"), 1, SweepProposer(moves), speed=speed
    )
    assert "knob chunk renamed mnbt" in shown, shown
    assert "dropped" not in shown and "gained knob mnbt" not in shown, shown
    # the champion runs at 4096 as it did; 4096 (no change), 8192 (barred by its crash) and
    # 2048 (decided) are not booted again: the one change is 3072
    assert {tokens(c) for c in bed.boots} <= {4096, 3072}, bed.boots
    assert [tokens(c) for c in bed.boots].count(3072) >= 1, bed.boots
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        first, *_ = ledger.experiments(cluster="evolving")
        assert "chunk" in first.config and "mnbt" not in first.config  # nothing rewritten
        profile = load_profile(str(tmp_path / "profile.yaml"), base_dir=tmp_path)
        [barred] = barred_regions(profile, ledger)
        assert barred.region.when.get("mnbt") == 8192 and "chunk" not in barred.region.when
    seen = status(tmp_path)
    assert seen["champion"]["config"]["mnbt"] == 4096, seen["champion"]
    assert "chunk" not in seen["champion"]["config"], seen["champion"]
    # the prior learns from the changes measured under either name: 4096 and 2048, then 3072
    assert seen["knob_priors"]["mnbt"]["n"] == 3, seen["knob_priors"]


def test_a_knob_renamed_unsaid_is_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    measured(tmp_path)
    before = ledger_counts(tmp_path)
    with pytest.raises(ProfileError) as raised:
        round_of(tmp_path, data(name="mnbt"), 1, speed=speed)
    line = (
        "profile p: knob mnbt renders --max-num-batched-tokens as the dropped knob chunk did: "
        "say `renamed_from: chunk` on mnbt to carry its value 4096 in the champion and its "
        "history, or `new: true` if mnbt is a new knob (the champion then takes its default "
        "7168)"
    )
    assert str(raised.value) == line
    assert ledger_counts(tmp_path) == before
    # the command line: exit 3, the one line, nothing written
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    done = orchestrate(tmp_path, "status", "-p", str(tmp_path / "profile.yaml"), env=env)
    assert done.returncode == 3 and line in " ".join(done.stderr.split()), done.stderr
    assert ledger_counts(tmp_path) == before
    # a new knob that says so starts at its default, as a knob gained does
    shown, bed = round_of(tmp_path, data(name="mnbt", new=True), 1, speed=speed)
    assert "profile gained knob mnbt: the champion takes its default 7168" in shown, shown
    assert tokens(bed.boots[0]) == 7168, bed.boots
    assert "knob chunk is no longer in the profile" in shown, shown


def test_renamed_from_naming_no_knob_of_the_ledger_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    measured(tmp_path)
    before = ledger_counts(tmp_path)
    with pytest.raises(ProfileError) as raised:
        round_of(tmp_path, data(name="mnbt", renamed_from="chunks"), 1, speed=speed)
    assert str(raised.value) == (
        "profile p: knob mnbt says renamed_from: chunks, a knob the ledger never knew on "
        "cluster evolving (its knobs: chunk, cuda_graphs, drafter_adapter_rank, "
        "gpu_memory_utilization, kv_cache_dtype, num_speculative_tokens): write the name its "
        "history was recorded under, or take renamed_from out to start mnbt as a new knob"
    )
    assert ledger_counts(tmp_path) == before


def test_renamed_from_a_knob_still_in_the_profile_is_refused_as_it_loads(tmp_path: Path) -> None:
    with pytest.raises(KnobError, match="renamed_from: chunk is its own name"):
        Profile.model_validate(data(renamed_from="chunk"))
    other = {**CHUNK, "name": "mnbt", "renamed_from": "cuda_graphs", "new": False}
    other["render"] = {"kind": "env", "env": "MNBT"}
    # a catalog's knob still declared: what to do (put it under untuned:)
    with pytest.raises(KnobError, match="cuda_graphs, which catalog vllm-dflash2 still declares"):
        Profile.model_validate({**data(), "knobs": [CHUNK, other]})
    # a knob of the profile's own still here
    with pytest.raises(KnobError, match="the name of knob chunk, still here"):
        Profile.model_validate({**data(), "knobs": [CHUNK, {**other, "renamed_from": "chunk"}]})
    path = write_profile(
        tmp_path, {**data(), "knobs": [{**other, "renamed_from": "x", "new": True}]}
    )
    with pytest.raises(ProfileError, match="says both new: true and renamed_from: x"):
        load_profile(str(path), base_dir=tmp_path)


def test_the_profiles_words_read_a_rename_as_neither_dropped_nor_gained() -> None:
    """How the profile changed (``revision.differences``) and how configs render now
    (``rendering.revised``, the words of a champion measured again) say a rename as one."""
    old = Revision.of(Profile.model_validate(data()))
    new = Profile.model_validate(data(name="mnbt", renamed_from="chunk"))
    assert differences(old, Revision.of(new)) == ["knob chunk renamed mnbt"]
    assert revised(new, old) == []
    narrowed = Profile.model_validate(
        data(name="mnbt", renamed_from="chunk", high=4096, default=4096)
    )
    assert differences(old, Revision.of(narrowed)) == [
        "knob chunk renamed mnbt",
        "knob mnbt's domain narrowed: an integer from 1024 to 8192 in steps of 1024 → an "
        "integer from 1024 to 4096 in steps of 1024",
        "knob mnbt's default 7168 → 4096",
    ]
    flag = {"kind": "flag", "flag": "--mnbt"}
    moved = Profile.model_validate(data(name="mnbt", renamed_from="chunk", render=flag))
    assert revised(moved, old) == ["knob mnbt renders otherwise"]


def test_a_knob_gained_whose_domain_lacks_the_champions_value_is_no_rename(
    tmp_path: Path,
) -> None:
    """Same flag, but the champion's 4096 is no value of the gained knob: another setting, not
    a rename; it starts at its default as a knob gained does, and nothing is refused."""
    measured(tmp_path)
    other = data(name="mnbt", low=5120, high=8192, step=1024)
    shown, bed = round_of(tmp_path, other, 1, speed=speed)
    assert "profile gained knob mnbt: the champion takes its default 7168" in shown, shown
    assert tokens(bed.boots[0]) == 7168, bed.boots


def test_one_rule_refuses_a_rename_naming_a_name_still_here_or_two_from_one() -> None:
    """Cells and knobs say ``renamed_from`` alike; one rule (``names.rename_clash``) reads it."""
    cells = ("readings call", "readings carry")
    assert rename_clash("cell", [("a", None), ("b", "c")], cells) is None
    assert rename_clash("cell", [("a", "a")], cells) == (
        "cell a: renamed_from: a is its own name; renamed_from names the cell as the ledger's "
        "readings call it before the rename"
    )
    assert rename_clash("knob", [("a", "c"), ("b", "c")], ("history calls", "history carries")) == (
        "knobs a and b are both renamed_from: c; one knob's history carries over to one knob"
    )


def test_a_catalog_knob_renamed_but_still_declared_by_the_catalog_says_what_to_do(
    tmp_path: Path,
) -> None:
    """The review's J4: `name: mnbt, renamed_from: max_num_batched_tokens` without taking the
    catalog's knob out said only `knobs max_num_batched_tokens and mnbt both render
    --max-num-batched-tokens`. It now says to put the catalog's under untuned:, and with it
    there the profile loads, the rename carrying the history over."""
    renamed = {**profile_data({"name": "mnbt", "renamed_from": "max_num_batched_tokens"})}
    path = write_profile(tmp_path, renamed)
    with pytest.raises(ProfileError) as refused:
        load_profile(str(path), base_dir=tmp_path)
    assert str(refused.value) == (
        f"profile {path}: knob mnbt is renamed_from: max_num_batched_tokens, which catalog "
        "vllm-dflash2 still declares: put max_num_batched_tokens under untuned: (its history "
        "carries over to mnbt)"
    )
    fixed = write_profile(tmp_path, {**renamed, "untuned": ["max_num_batched_tokens"]})
    assert "mnbt" in load_profile(str(fixed), base_dir=tmp_path).space.names
