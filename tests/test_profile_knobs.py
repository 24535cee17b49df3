"""A profile's knob named like one of its catalog's sets only what it changes; the rest (render,
description, effect prior, draft role, monotone failures) comes from the catalog's spec."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from knobs.catalog import catalog
from knobs.errors import KnobError, ProfileError
from knobs.spec import KnobSpec
from orchestrator.profile import Profile, load_profile
from tests.fixtures.cli import orchestrate
from tests.test_migrations import LEDGERS, _upgraded_release

CATALOG = {k.name: k for k in catalog("vllm-dflash2")}


def profile(*knobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "p",
        "model": "m",
        "cluster": {"name": "c", "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": "/w"}]},
        "launcher": {"argv": ["true"]},
        "knob_catalog": "vllm-dflash2",
        "knobs": list(knobs),
        "cells": [{"name": "code-c1", "category": "code", "concurrency": 1}],
    }


def test_a_knob_that_sets_only_its_default_keeps_everything_else_of_the_catalogs() -> None:
    space = Profile.model_validate(profile({"name": "num_speculative_tokens", "default": 3})).space
    k = space.spec("num_speculative_tokens")
    assert k.default == 3
    assert k == CATALOG["num_speculative_tokens"].model_copy(update={"default": 3})
    assert k.role == "draft_tokens" and k.effect_prior is not None


def test_a_narrower_domain_keeps_the_catalogs_type_step_and_meaning() -> None:
    narrowed = {"name": "num_speculative_tokens", "low": 1, "high": 4, "default": 2}
    k = Profile.model_validate(profile(narrowed)).space.spec("num_speculative_tokens")
    assert (k.type, k.low, k.high, k.default) == ("int", 1, 4, 2)
    assert k.role == "draft_tokens"
    assert k.effect_prior == CATALOG["num_speculative_tokens"].effect_prior
    assert k.render == CATALOG["num_speculative_tokens"].render
    mnbt = {"name": "max_num_batched_tokens", "low": 4096, "high": 8192, "default": 8192}
    m = Profile.model_validate(profile(mnbt)).space.spec("max_num_batched_tokens")
    assert m.step == CATALOG["max_num_batched_tokens"].step
    assert list(m.domain()) == list(range(4096, 8193, 512))
    # narrowed past the catalog's default without a default of its own: said, with the value
    with pytest.raises(KnobError, match="7 is not an integer from 1 to 4"):
        Profile.model_validate(profile({"name": "num_speculative_tokens", "high": 4}))


def test_a_profiles_space_is_built_once_and_a_copy_with_other_knobs_has_its_own() -> None:
    """``Profile.space`` is built once a profile (a loop asks for it hundreds of times an
    experiment); a copy of the profile with other knobs, or with a knob left untuned, is
    another profile and has its own space, never the first's."""
    first = Profile.model_validate(profile({"name": "num_speculative_tokens", "default": 3}))
    assert first.space is first.space
    narrowed = KnobSpec.model_validate(
        {**CATALOG["num_speculative_tokens"].model_dump(), "high": 4, "default": 2}
    )
    other = first.model_copy(update={"knobs": (narrowed,)})
    assert other.space.spec("num_speculative_tokens").default == 2
    assert first.space.spec("num_speculative_tokens").default == 3
    untuned = first.model_copy(update={"untuned": ("max_num_batched_tokens",)})
    assert "max_num_batched_tokens" not in {k.name for k in untuned.space.knobs}
    assert "max_num_batched_tokens" in {k.name for k in first.space.knobs}
    # many profiles later, the first still has its own
    for default in range(1, 40):
        knob = {"name": "num_speculative_tokens", "default": 1 + default % 7}
        assert (
            Profile.model_validate(profile(knob)).space.spec("num_speculative_tokens").default
            == 1 + default % 7
        )
    assert first.space.spec("num_speculative_tokens").default == 3


def test_a_choice_replaces_the_catalogs_range_and_a_null_prior_drops_the_catalogs() -> None:
    fixed = {"name": "num_speculative_tokens", "type": "choice", "choices": [7], "default": 7}
    k = Profile.model_validate(profile(fixed)).space.spec("num_speculative_tokens")
    assert (k.type, k.choices, k.low, k.high) == ("choice", (7,), None, None)
    assert k.role == "draft_tokens"
    unknown = {"name": "max_num_batched_tokens", "effect_prior": None}
    m = Profile.model_validate(profile(unknown)).space.spec("max_num_batched_tokens")
    assert m.effect_prior is None
    assert m.render == CATALOG["max_num_batched_tokens"].render


def test_a_knob_the_catalog_lacks_is_given_whole() -> None:
    data = profile({"name": "moe_backend", "default": "triton"})
    with pytest.raises(ValueError, match=r"knobs\.0\.type"):
        Profile.model_validate(data)


def test_the_shipped_profiles_inherit_the_catalogs_priors(tmp_path: Path) -> None:
    rank = CATALOG["drafter_adapter_rank"].effect_prior
    for name in ("twin", "vllm-dflash2-tp4", "exl3-tp4", "sm121-2node"):
        space = load_profile(name, base_dir=tmp_path).space
        assert space.spec("drafter_adapter_rank").effect_prior == rank, name
        assert space.spec("num_speculative_tokens").role == "draft_tokens", name
    # card 000's K stays fixed at 7 (its own domain), with the catalog's meaning
    k = load_profile("sm121-2node", base_dir=tmp_path).space.spec("num_speculative_tokens")
    assert k.choices == (7,)


def test_a_bad_inherited_knob_is_one_line(tmp_path: Path) -> None:
    data = profile({"name": "num_speculative_tokens", "type": "choice", "choices": ["seven"]})
    data["knobs"][0]["default"] = "seven"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    assert "\n" not in str(caught.value)
    assert "role draft_tokens needs a count of draft tokens" in str(caught.value)


STARTS_ONLY = "champion: starts only a cluster the ledger has no champion for: give"
KEEPS = (
    "a cluster the ledger has a champion for keeps its value, measured, whatever champion: "
    "says, and its rounds move"
)
AFRESH = (
    "to start inside the domain at once, run under a new ledger (ORCHESTRATE_LEDGER, "
    "ledger_url:) or another cluster.name;"
)


def test_a_domain_narrowed_under_a_ledgers_champion_says_what_works_not_to_edit_champion(
    tmp_path: Path,
) -> None:
    """The twin's ledger has a champion at K=7 and the profile narrows K to 1–5. The line said
    to give ``champion:`` a value the knob allows, and a user who did so found the ledger's
    champion still at 7: ``champion:`` starts only a ledger without one. Now the line says so,
    and what does move it (a kept change of K, a new ledger or cluster name, or a wider
    domain); done as it says, the ledger's champion keeps its 7, as the line said."""
    url, _ = _upgraded_release("schema7", tmp_path)
    env = {**os.environ, "ORCHESTRATE_LEDGER": url}
    data = yaml.safe_load((LEDGERS / "schema7.profile.yaml").read_text())
    data["knobs"].append({"name": "num_speculative_tokens", "high": 5, "default": 4})
    path = tmp_path / "narrowed.yaml"
    path.write_text(yaml.safe_dump(data))
    done = orchestrate(tmp_path, "status", "--profile", str(path), env=env)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip() == (
        f"Error: profile {path}: champion: knob num_speculative_tokens: 7 is not an integer "
        f"from 1 to 5: {STARTS_ONLY} it a value the knob allows, or leave "
        f"num_speculative_tokens out (its default 4); {KEEPS} num_speculative_tokens into the "
        f"domain only by a change a verdict keeps; {AFRESH} to keep 7 in reach, widen the "
        "domain again"
    ), done.stderr
    del data["champion"]["num_speculative_tokens"]
    path.write_text(yaml.safe_dump(data))
    done = orchestrate(tmp_path, "status", "--profile", str(path), env=env)
    said = " ".join(done.stdout.split())
    assert "num_speculative_tokens=7" in said, said
    assert "the champion's num_speculative_tokens 7 is outside the profile's domain now" in said


def test_a_domain_narrowed_under_the_profiles_own_champion_names_the_champion_block(
    tmp_path: Path,
) -> None:
    """The README's narrowing (K from 1 to 4) under a profile whose ``champion:`` says K=7:
    the one line says where the 7 is, and what to do. Before, it named the knob and the
    domain only, and the profile's ``knobs:`` entry looked like the fault."""
    data = {
        **profile({"name": "num_speculative_tokens", "low": 1, "high": 4, "default": 2}),
        "champion": {"num_speculative_tokens": 7},
    }
    path = tmp_path / "narrowed.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    assert str(caught.value) == (
        f"profile {path}: champion: knob num_speculative_tokens: 7 is not an integer from 1 to "
        f"4: {STARTS_ONLY} it a value the knob allows, or leave num_speculative_tokens out (its "
        f"default 2); {KEEPS} num_speculative_tokens into the domain only by a change a verdict "
        f"keeps; {AFRESH} to keep 7 in reach, widen the domain again"
    )
    data["champion"] = {}
    data["proposer"] = {"kind": "sweep", "sweep": [{"num_speculative_tokens": 6}]}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r": proposer\.sweep: knob num_speculative_tokens: 6 "):
        load_profile(str(path))


@pytest.mark.parametrize(
    ("knob", "typed", "said"),
    [
        (
            "max_num_batched_tokens",
            "7168x",
            "'7168x' is not an integer from 2048 to 16384 in steps of 512",
        ),
        (
            "kv_cache_dtype",
            "fp8_e4m",
            "'fp8_e4m' is not one of auto, fp8_e4m3, fp8_e5m2; did you mean fp8_e4m3?",
        ),
    ],
)
def test_a_typo_in_a_champion_value_is_said_as_one_not_as_a_narrowed_domain(
    tmp_path: Path, knob: str, typed: str, said: str
) -> None:
    """A champion's value that is no value of its knob's type (``7168x``), or a near miss of
    one (``fp8_e4m``), is a typo: the line says what was meant. It had the advice for a value a
    narrowed domain left outside (widen the domain again, or start a new ledger)."""
    data = {**profile({"name": knob}), "champion": {knob: typed}}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    assert f"champion: knob {knob}: {said}" in str(caught.value), caught.value
    assert "widen the domain" not in str(caught.value)


MOE: dict[str, Any] = {
    "name": "moe_backend",
    "new": True,
    "type": "choice",
    "choices": ["triton", "cutlass", "flashinfer"],
    "default": "triton",
    "render": {"kind": "flag", "flag": "--moe-backend", "values": {"triton": "triton"}},
}


def test_a_rendering_that_cannot_deploy_is_refused_as_the_profile_loads(tmp_path: Path) -> None:
    """A value the proposer may pick mid-round whose rendering does not fill on a node (a
    placeholder no node has) is refused at load, naming the key it comes from, not left to
    stop a round; a partial ``values`` map is no such rendering (unlisted values render as
    themselves)."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile(MOE)))
    load_profile(str(path))  # flashinfer and cutlass render as themselves
    mapped = {**MOE, "render": {**MOE["render"], "values": {"cutlass": "{nope}/cutlass"}}}
    path.write_text(yaml.safe_dump(profile(mapped)))
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    said = str(caught.value)
    assert "\n" not in said
    assert said.startswith(f"profile {path}: knobs.moe_backend.render.values: moe_backend cutlass")
    assert "unknown placeholder {nope}" in said and "add the name to the nodes' vars" in said
    chosen = {**MOE, "choices": ["triton", "{nope}"], "render": {"kind": "env", "env": "MOE"}}
    path.write_text(yaml.safe_dump(profile(chosen)))
    with pytest.raises(ProfileError, match=r"knobs\.moe_backend\.choices: moe_backend \{nope\}"):
        load_profile(str(path))


@pytest.mark.parametrize(
    ("render", "said"),
    [
        (
            {**MOE["render"], "values": {"triton": "triton", "cutlass": "cut lass"}},
            "knobs.moe_backend.render.values.cutlass: rendered value 'cut lass' has characters "
            "a launcher cannot take",
        ),
        (
            {**MOE["render"], "flag": "--moe backend"},
            "knobs.moe_backend.render: render token '--moe backend' has characters a launcher "
            "cannot take",
        ),
        ({"kind": "flag"}, "knobs.moe_backend.render: render kind 'flag' needs 'flag'"),
    ],
)
def test_a_bad_rendering_is_placed_at_its_knob_and_value(
    tmp_path: Path, render: dict[str, Any], said: str
) -> None:
    """A rendering a launcher cannot take is said at the knob's name (and, for a ``values``
    entry, at the value it maps), as every other profile check names a knob, never at the
    entry's index under ``knobs:``."""
    path = tmp_path / "p.yaml"
    path.write_text(
        yaml.safe_dump(profile({"name": "num_speculative_tokens"}, {**MOE, "render": render}))
    )
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    assert str(caught.value) == f"profile {path}: {said}"


@pytest.mark.parametrize(
    ("when", "said"),
    [
        (
            {"nope": 1},
            "forbidden[0].when: unknown knob 'nope'; known knobs: num_speculative_tokens, ",
        ),
        (
            {"num_speculativ_tokens": 3},
            "forbidden[0].when: unknown knob 'num_speculativ_tokens'; did you mean "
            "num_speculative_tokens? (known knobs: ",
        ),
        (
            {"num_speculative_tokens": 99},
            "forbidden[0].when: knob num_speculative_tokens: 99 is not an integer from 1 to 7; "
            "a rule names values the knob takes: fix the value, or drop the rule",
        ),
        (
            {"moe_backend": "rocm"},
            "forbidden[0].when: knob moe_backend: 'rocm' is not one of triton, cutlass, "
            "flashinfer; a rule names values",
        ),
    ],
)
def test_a_bad_forbidden_rule_is_said_at_its_own_key_not_the_champions(
    tmp_path: Path, when: dict[str, object], said: str
) -> None:
    """A ``forbidden`` rule naming a knob the profile lacks, or a value outside its domain, is
    refused at ``forbidden[i].when``, with what to do; not as a mistake in ``champion``."""
    data = profile(MOE)
    data["forbidden"] = [{"when": {"cuda_graphs": True}, "reason": "fine"}]
    data["forbidden"].insert(0, {"when": when, "reason": "x"})
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    text = str(caught.value)
    assert text.startswith(f"profile {path}: {said}"), text
    assert "champion" not in text and "\n" not in text
    assert "fix the " in text and "or drop the rule" in text


def test_a_bad_engine_path_in_the_environment_does_not_stop_a_profile_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renderings checked as the profile loads need this machine's placeholders; an
    engine's path set wrong in the environment is said by a boot's testbed, not by every
    command that loads the profile and boots nothing."""
    monkeypatch.setenv("ORCHESTRATE_LLAMA_SERVER", "relative/llama-server")
    assert load_profile("twin", base_dir=tmp_path).name == "twin"


def _written(tmp_path: Path, knob: str, champion: str = "") -> Path:
    """A profile written as a person writes one: YAML text, the knob ``knob`` in it as given."""
    base = {k: v for k, v in profile().items() if k != "knobs"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False) + "knobs:\n" + knob + champion)
    return path


def test_an_engines_on_off_choices_are_the_words_written_not_yaml_booleans(
    tmp_path: Path,
) -> None:
    """YAML 1.1 reads on/off/yes/no as booleans: ``choices: [on, off]`` was True and False, the
    launcher got ``--flash-attn true``, and ``--set flash_attn=off`` was refused as "not one of
    True, False". Only true and false are booleans now; a bool knob still takes on and off."""
    path = _written(
        tmp_path,
        "  - {name: flash_attn, type: choice, choices: [on, off, auto], default: on,\n"
        "     render: {kind: flag, flag: --flash-attn}}\n"
        "  - {name: graphs, type: bool, default: off, render: {kind: switch, flag: --graphs}}\n",
        "champion: {flash_attn: off, graphs: yes}\n",
    )
    space = load_profile(str(path)).space
    fa = space.spec("flash_attn")
    assert fa.choices == ("on", "off", "auto") and fa.default == "on"
    assert fa.parse("off") == "off"
    assert space.spec("graphs").default is False
    champion = load_profile(str(path)).initial_champion()
    assert (champion["flash_attn"], champion["graphs"]) == ("off", True)


def test_choices_the_engine_gets_alike_are_refused_at_the_knob() -> None:
    """``choices: [1.0, 1]`` both render ``1``: a change between them deploys nothing."""
    knob = {
        "name": "x",
        "type": "choice",
        "choices": [1.0, 1, 2],
        "default": 2,
        "render": {"kind": "flag", "flag": "--x"},
    }
    with pytest.raises(ValueError, match=r"choices 1\.0 and 1 are the same value to the engine"):
        Profile.model_validate(profile(knob))


def test_a_default_off_the_knobs_steps_names_its_key_and_the_nearest_steps(tmp_path: Path) -> None:
    knob = "  - {name: max_num_seqs, type: int, low: 64, high: 512, step: 100, default: 256,\n"
    knob += "     render: {kind: flag, flag: --max-num-seqs}}\n"
    got = orchestrate(
        tmp_path, "cluster", "up", "--dry-run", "--profile", str(_written(tmp_path, knob))
    )
    assert got.returncode == 3, got.stderr
    said = " ".join(got.stderr.split())
    assert (
        "knobs.max_num_seqs.default: 256 is not an integer from 64 to 512 in steps of 100" in said
    )
    assert "the nearest are 164 and 264): give one of them, or change low or step" in said
