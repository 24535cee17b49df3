"""Issue #17 item 5: the record outlives the code. A profile may gain or lose a knob under an
existing ledger: the champion takes the new knob's default (or drops the lost one), the ledger
records it once as an event, a round carries on without proposing again what was decided, and
``cluster up`` deploys it. A ``knobs:`` entry a typo away from a catalog knob is refused."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agents import SweepProposer
from knobs.catalog import catalog
from knobs.config import Config
from knobs.errors import ProfileError
from knobs.records import CellResultRecord, CellSpec
from knobs.space import KnobSpace, render_clash
from knobs.spec import KnobSpec, RenderSpec
from knobs.vocabulary import BootStatus, EventKind, Kind, ProposalStatus, State, Status
from ledger import ExperimentRecord, Ledger, ProposalRecord, RoundRecord, VerdictRecord
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.evolution import refit_blame
from orchestrator.known_bad import barred_regions
from orchestrator.measurements import changed_cells
from orchestrator.profile import Profile, load_profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_round_policy import ScriptedTestbed

MOE = {
    "name": "moe_backend",
    "type": "choice",
    "choices": ["triton", "cutlass"],
    "default": "triton",
    "render": {"kind": "flag", "flag": "--moe-backend"},
}
FOO = {
    "name": "foo",
    "type": "int",
    "low": 1,
    "high": 5,
    "default": 3,
    "render": {"kind": "flag", "flag": "--foo"},
}
CELL = CellSpec(name="code-c1", category="code", concurrency=1)


# ---- reconcile ----------------------------------------------------------------------------
def test_reconcile_gives_an_added_knob_its_default_and_drops_a_removed_one() -> None:
    space = KnobSpace(knobs=(*catalog("vllm-dflash2"), KnobSpec.model_validate(MOE)))
    old = KnobSpace(knobs=catalog("vllm-dflash2")).default_config()
    fitted = space.reconcile({**old, "foo": 3})
    assert fitted.added == ["moe_backend"] and fitted.removed == ["foo"]
    assert fitted.config == Config({**old, "moe_backend": "triton"})
    assert set(fitted.config) == set(space.names)


def test_reconcile_of_a_config_that_fits_keeps_it_and_its_key() -> None:
    space = KnobSpace(knobs=catalog("vllm-dflash2"))
    config = space.config({"num_speculative_tokens": 3}, partial=True)
    fitted = space.reconcile(config)
    assert (fitted.added, fitted.removed) == ([], [])
    assert fitted.config.key == config.key
    # the values both have are kept as recorded, even one the space's domain no longer has
    narrowed = KnobSpace(
        knobs=tuple(
            k.model_copy(update={"high": 4, "default": 2})
            if k.name == "num_speculative_tokens"
            else k
            for k in catalog("vllm-dflash2")
        )
    )
    assert (
        narrowed.reconcile({**config, "num_speculative_tokens": 7}).config["num_speculative_tokens"]
        == 7
    )


def test_two_knobs_that_render_the_same_field_are_refused() -> None:
    rank = next(k for k in catalog("vllm-dflash2") if k.name == "drafter_adapter_rank")
    twin = rank.model_copy(update={"name": "drafter_adaptor_rank"})
    assert render_clash((rank, twin)) == (
        "knobs drafter_adapter_rank and drafter_adaptor_rank both render "
        "--speculative-config field model"
    )
    flag = KnobSpec(
        name="spec", type="bool", default=False, render=RenderSpec(kind="flag", flag="--x")
    )
    assert render_clash((flag, flag.model_copy(update={"name": "other"}))) == (
        "knobs spec and other both render --x"
    )
    with pytest.raises(ValueError, match="both render"):
        KnobSpace(knobs=(rank, twin))


def test_a_knob_declared_twice_or_two_switches_of_one_flag_are_refused(tmp_path: Path) -> None:
    """A copied entry not renamed kept only the later one's default; two switches both adding
    --enforce-eager passed, so one's change deployed nothing whenever the other held it."""
    eager = {
        "name": "eager2",
        "type": "bool",
        "default": True,
        "new": True,
        "render": {"kind": "switch", "when_true": ["--enforce-eager"]},
    }
    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([MOE, {**MOE, "default": "cutlass"}], "knobs: moe_backend declared twice"),
        ([eager], "knobs cuda_graphs and eager2 both render --enforce-eager"),
    ]
    for knobs, message in cases:
        path = write_profile(tmp_path, profile_data(*knobs))
        with pytest.raises(ProfileError, match="^profile .*: " + re.escape(message)):
            load_profile(str(path), base_dir=tmp_path)
    other = {**eager, "render": {"kind": "switch", "when_true": ["--eager-prefill=1"]}}
    assert (
        "eager2"
        in load_profile(
            str(write_profile(tmp_path, profile_data(other))), base_dir=tmp_path
        ).space.names
    )


def test_an_auto_port_the_launcher_never_passes_is_refused(tmp_path: Path) -> None:
    """The engine listened on its own default port while the gates polled the chosen one:
    the baseline was recorded as the configuration's crash (boot wedged, twice)."""
    data = profile_data()
    data["cluster"] = {**data["cluster"], "port": "auto"}
    data["launcher"] = {"argv": ["vllm", "serve"], "head_argv": ["--host", "{host}"]}
    with pytest.raises(ProfileError, match=re.escape("no launcher token holds {port}")):
        load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    data["launcher"]["head_argv"] = ["--host", "{host}", "--port={port}"]
    assert load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path).cluster.auto_ports


@pytest.mark.parametrize(
    ("launcher", "knobs", "message"),
    [
        (
            {"argv": ["vllm", "serve", "--max-num-batched-tokens=4096"]},
            [],
            "knob max_num_batched_tokens renders --max-num-batched-tokens, which launcher.argv "
            "sets for every config too: take it out of the argv",
        ),
        (
            {"argv": ["vllm"], "head_argv": ["--enforce-eager"]},
            [],
            "knob cuda_graphs renders --enforce-eager, which launcher.argv sets",
        ),
        (
            {"argv": ["vllm", "--speculative-config", "{}"]},
            [],
            "knob num_speculative_tokens renders --speculative-config, which launcher.argv",
        ),
        (
            {"argv": ["vllm"], "json_flags": {"--moe-backend": {"a": 1}}},
            [MOE],
            "knob moe_backend renders --moe-backend, which launcher.json_flags fills as JSON",
        ),
        (
            {"argv": ["vllm"], "env": {"MOE_BACKEND": "triton"}},
            [{**MOE, "render": {"kind": "env", "env": "MOE_BACKEND"}}],
            "knob moe_backend sets $MOE_BACKEND, which launcher.env sets for every config too",
        ),
        (
            {"argv": ["vllm"], "json_flags": {"--speculative-config": {"model": "/m/r0"}}},
            [],
            "knob drafter_adapter_rank writes --speculative-config field model, which "
            "launcher.json_flags sets for every config too: take the field out",
        ),
    ],
)
def test_a_knob_that_renders_what_the_launcher_fixes_is_refused(
    tmp_path: Path, launcher: dict[str, Any], knobs: list[dict[str, Any]], message: str
) -> None:
    """The engine would get the flag (or variable) twice, one of them silently winning: a
    change of the knob might deploy nothing all night. Refused when the profile loads."""
    path = write_profile(tmp_path, {**profile_data(*knobs), "launcher": launcher})
    with pytest.raises(ProfileError, match="^profile .*: " + re.escape(message)):
        load_profile(str(path), base_dir=tmp_path)
    # a flag that only begins like a knob's is the launcher's own
    fine = {"argv": ["vllm", "--max-num-batched-tokens-per-step", "1", "--moe"]}
    assert load_profile(
        str(write_profile(tmp_path, {**profile_data(*knobs), "launcher": fine})),
        base_dir=tmp_path,
    )


# ---- the typo rule ------------------------------------------------------------------------
def profile_data(*knobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "p",
        "model": "m",
        "cluster": {
            "name": "evolving",
            "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": "/tmp/evolving"}],
        },
        "launcher": {"argv": ["true"]},
        "knob_catalog": "vllm-dflash2",
        "knobs": list(knobs),
        "cells": [CELL.model_dump()],
        "verdict": {"policy": "threshold", "threshold_pct": 2.0},
    }


TYPO = {**MOE, "name": "drafter_adaptor_rank", "render": {"kind": "env", "env": "RANK"}}


def test_a_knob_a_typo_away_from_the_catalogs_is_an_error_unless_it_says_new(
    tmp_path: Path,
) -> None:
    path = write_profile(tmp_path, profile_data(TYPO))
    with pytest.raises(ProfileError) as raised:
        load_profile(str(path), base_dir=tmp_path)
    assert str(raised.value) == (
        f"profile {path}: knob 'drafter_adaptor_rank' is not in catalog vllm-dflash2; "
        "did you mean drafter_adapter_rank? (a new knob says new: true)"
    )
    path = write_profile(tmp_path, profile_data({**TYPO, "new": True}))
    space = load_profile(str(path), base_dir=tmp_path).space
    assert "drafter_adaptor_rank" in space.names and "drafter_adapter_rank" in space.names
    # a knob far from every catalog name needs no word; new: true on a catalog knob says only
    # that it is no knob the profile dropped, renamed (``knob_renames``)
    assert "moe_backend" in Profile.model_validate(profile_data(MOE)).space.names
    space = Profile.model_validate(profile_data({"name": "cuda_graphs", "new": True})).space
    assert space.spec("cuda_graphs").new and space.spec("cuda_graphs").render.kind == "switch"


def test_the_typo_line_and_exit_code_3_through_the_cli(tmp_path: Path) -> None:
    write_profile(tmp_path, profile_data(TYPO))
    done = orchestrate(tmp_path, "status", "--profile", "profile.yaml", timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: profile profile.yaml: knob 'drafter_adaptor_rank' is not in catalog "
        "vllm-dflash2; did you mean drafter_adapter_rank? (a new knob says new: true)"
    ]


# ---- a round under a profile that changed -------------------------------------------------
class RenderingTestbed(ScriptedTestbed):
    """Renders every config it deploys with the profile's space (as a launcher does) and
    measures 100 tok/s whatever it is."""

    def __init__(self, space: KnobSpace) -> None:
        super().__init__(lambda config, n: 100.0)
        self.space = space

    def deploy(self, config: Config) -> dict[int, str]:
        self.space.render(config)  # a config lacking a knob of the space fails here
        return super().deploy(config)


class InterruptedTestbed(RenderingTestbed):
    """Ctrl-C as a config with foo=2 deploys (the night's operator stopping the round)."""

    def deploy(self, config: Config) -> dict[int, str]:
        if config.get("foo") == 2:
            self.boots.append(config)
            raise KeyboardInterrupt
        return super().deploy(config)


def run_round(
    tmp_path: Path,
    budget: int,
    *knobs: dict[str, Any],
    proposer: SweepProposer | None = None,
    interrupt: bool = False,
) -> tuple[str, RenderingTestbed]:
    """A round of the neighbour sweep (or ``proposer``) under a profile of ``knobs``; what it
    showed. ``interrupt``: Ctrl-C as a config with foo=2 deploys."""
    path = write_profile(tmp_path, profile_data(*knobs))
    profile = load_profile(str(path), base_dir=tmp_path)
    testbed = (InterruptedTestbed if interrupt else RenderingTestbed)(profile.space)
    shown = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        runner = RoundRunner(
            profile,
            ledger,
            NullSink(),
            testbed,
            proposer or SweepProposer(),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=shown, width=200)),
        )
        runner.run(RoundOptions(budget=budget, proposer="sweep", approve="auto"))
    return shown.getvalue(), testbed


def changes(ledger: Ledger) -> list[tuple[str | None, object]]:
    return [(e.knob, e.value) for e in ledger.experiments(cluster="evolving")]


def test_a_knob_added_under_a_champion_takes_its_default_once_and_the_round_goes_on(
    tmp_path: Path,
) -> None:
    run_round(tmp_path, 2)
    shown, testbed = run_round(tmp_path, 1, MOE)
    line = "profile gained knob moe_backend: the champion takes its default 'triton'"
    assert line in shown
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        # K=1 and K=2 were decided under the champion before the knob: not proposed again
        assert changes(ledger) == [
            (None, None),
            ("num_speculative_tokens", 1),
            ("num_speculative_tokens", 2),
            ("num_speculative_tokens", 3),
        ]
        [event] = ledger.events("evolving", EventKind.KNOB_ADDED)
        champion = ledger.champion("evolving")
        assert champion is not None
        assert event.subject == "moe_backend"
        assert event.detail == {"default": "triton", "champion_experiment": champion.experiment_id}
        assert event.reason == "the profile gained the knob; the champion takes its default"
        assert ledger.experiments(cluster="evolving")[-1].config["moe_backend"] == "triton"
    assert testbed.boots and all(b["moe_backend"] == "triton" for b in testbed.boots)
    # a later round neither records it again nor says it again
    shown, _ = run_round(tmp_path, 1, MOE)
    assert "gained" not in shown
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        assert len(ledger.events("evolving", EventKind.KNOB_ADDED)) == 1
        assert changes(ledger)[-1] == ("num_speculative_tokens", 4)


def test_a_boolean_knob_gained_or_dropped_is_said_as_the_profile_spells_it(
    tmp_path: Path,
) -> None:
    """``false`` as a profile writes it, never Python's ``False``."""
    fast = {
        "name": "fast_path",
        "type": "bool",
        "default": False,
        "new": True,
        "render": {"kind": "switch", "when_true": ["--fast-path"]},
    }
    (tmp_path / "gains").mkdir()
    (tmp_path / "drops").mkdir()
    run_round(tmp_path / "gains", 1)
    gained, _ = run_round(tmp_path / "gains", 1, fast)
    assert "profile gained knob fast_path: the champion takes its default false" in gained
    run_round(tmp_path / "drops", 1, fast)
    dropped, _ = run_round(tmp_path / "drops", 1)
    assert "knob fast_path is no longer in the profile: dropped from the champion (was false)" in (
        dropped
    )
    assert "False" not in gained + dropped and "True" not in gained + dropped


def test_a_knob_removed_is_dropped_from_the_champion_with_a_line_and_one_event(
    tmp_path: Path,
) -> None:
    foo = {**FOO, "new": True}
    run_round(tmp_path, 1, foo)
    shown, testbed = run_round(tmp_path, 1)
    assert "knob foo is no longer in the profile: dropped from the champion (was 3)" in shown
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        [event] = ledger.events("evolving", EventKind.KNOB_REMOVED)
        assert (event.subject, event.detail["value"]) == ("foo", 3)
        assert changes(ledger)[1:] == [("num_speculative_tokens", 1), ("num_speculative_tokens", 2)]
        assert "foo" not in ledger.experiments(cluster="evolving")[-1].config
    assert testbed.boots and all("foo" not in b for b in testbed.boots)
    shown, _ = run_round(tmp_path, 1)
    assert "foo" not in shown


CLOSED = (
    "knob foo is no longer in the profile: the change is closed without a verdict and not "
    "booted; nothing is barred"
)


def test_a_change_of_a_knob_the_profile_lost_under_way_is_closed_unbooted_on_resume(
    tmp_path: Path,
) -> None:
    """Ctrl-C as the change foo 3→2 boots; the profile then loses foo. Before, the resume
    booted the change as the profile renders it (the champion's own config, foo dropped) and
    judged that as foo=2. Now it is decided vetoed by the profile, its boot kept, with a line
    saying why; it bars nothing (not foo=2, should foo come back) and does not count against
    the budget: the round goes on with the next change."""
    foo = {**FOO, "new": True}
    with pytest.raises(KeyboardInterrupt):
        run_round(tmp_path, 1, foo, proposer=SweepProposer([{"foo": 2}]), interrupt=True)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _, change = ledger.experiments(cluster="evolving")
        assert (change.knob, change.value, change.state) == ("foo", 2, State.DEPLOYING)
        assert len(ledger.boots(change.id)) == 1
    shown, testbed = run_round(tmp_path, 1)
    said = " ".join(shown.split())
    # its one boot before the kill kept, and said: never "not booted" beside it
    booted_once = CLOSED.replace(" and not booted;", ", its 1 boot(s) kept and no boot more;")
    assert f"#{change.id} foo 3 → 2 (sweep): vetoed {booted_once}" in said
    # the next change, never foo=2, and the champion: foo's --foo is no longer rendered, so
    # it is measured again before the change is judged against it (``rendering``)
    assert [b["num_speculative_tokens"] for b in testbed.boots] == [1, 7]
    assert all("foo" not in b for b in testbed.boots)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        closed = ledger.experiment(change.id)
        assert (closed.state, closed.status) == (State.DECIDED, Status.VETOED)
        assert closed.description == (
            "foo 3 → 2 (sweep); closed: knob foo is no longer in the profile"
        )
        verdict = ledger.verdict(change.id)
        assert verdict is not None and verdict.rule == "knob-removed"
        assert verdict.stats == {
            "by": "profile",
            "knob": "foo",
            "undecided": True,
            "boots": 1,
            "failed": {},
        }
        assert len(ledger.boots(change.id)) == 1  # kept, and none more
        # the round went on to its budget with a change the profile has
        assert changes(ledger)[2:] == [("num_speculative_tokens", 1)]
        assert ledger.unfinished_round("evolving") is None
        # nothing barred, even with foo back in the profile
        back = load_profile(str(write_profile(tmp_path, profile_data(foo))), base_dir=tmp_path)
        assert barred_regions(back, ledger) == []


def left_pending(
    tmp_path: Path, approved: bool = False, **move: Any
) -> tuple[RoundRecord, ProposalRecord]:
    """A round of cluster evolving (ledger ``ledger.db``) that a kill stopped after it
    recorded the proposal ``move`` (``add_proposal``'s change fields) against the champion:
    pending, or ``approved`` (the kill before its experiment). The round and the proposal."""
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion("evolving")
        assert champion is not None
        rnd = ledger.create_round(
            cluster="evolving",
            profile_name="p",
            profile_digest="",
            budget=1,
            proposer="sweep",
            approve="auto",
            seed=0,
        )
        proposal = ledger.add_proposal(
            round_id=rnd.id, source="sweep", champion_key=champion.config.key, **move
        )
        if approved:
            proposal = ledger.decide_proposal(
                proposal.id, status=ProposalStatus.APPROVED, by="auto"
            )
    return rnd, proposal


@pytest.mark.parametrize("decided", [True, False])
def test_a_proposal_of_a_knob_the_profile_lost_is_closed_not_booted(
    tmp_path: Path, decided: bool
) -> None:
    """A round killed after it recorded the proposal foo 3→2 (pending, or approved: the kill
    before its experiment); the profile then loses foo. Before, the resume stopped with
    "unknown knob foo" at every run (exit 3) until the knob came back. Now the change is
    recorded and decided vetoed by the profile without a boot, with the line, and the round
    goes on with the next change."""
    foo = {**FOO, "new": True}
    run_round(tmp_path, 1, foo)
    rnd, proposal = left_pending(tmp_path, decided, knob="foo", old_value=3, new_value=2)
    shown, _ = run_round(tmp_path, 1)
    assert CLOSED in " ".join(shown.split())
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        assert changes(ledger)[-2:] == [("foo", 2), ("num_speculative_tokens", 2)]
        closed = ledger.experiments(round_id=rnd.id)[0]
        assert (closed.status, closed.proposal_id, ledger.boots(closed.id)) == (
            Status.VETOED,
            proposal.id,
            [],
        )
        verdict = ledger.verdict(closed.id)
        assert verdict is not None and verdict.rule == "knob-removed"
        # a pending one is decided by the profile: no person is asked about it
        decider = ledger.proposal(proposal.id).decided_by
        assert decider == ("auto" if decided else "profile")
        assert ledger.unfinished_round("evolving") is None


NARROWED = {"name": "max_num_batched_tokens", "low": 2048, "high": 4096, "default": 4096}
OUTSIDE = (
    "the champion's max_num_batched_tokens 7168 is outside the profile's domain now (an integer "
    "from 2048 to 4096 in steps of 512): the champion keeps it (it was measured there); a "
    "change of max_num_batched_tokens moves it into the domain, the other knobs' changes keep it"
)


def test_a_champion_value_outside_a_narrowed_domain_is_kept_and_said(tmp_path: Path) -> None:
    """The champion ran MNBT 7168; the profile then narrows MNBT to 2048..4096. The champion
    keeps its value (it was measured), and before, nothing said so: the round went on with a
    value the profile no longer allows. Now each round says it as it starts, and `status` says
    it (and names the knob in --json); the changes tried keep the value, or move MNBT inside."""
    run_round(tmp_path, 1)
    shown, testbed = run_round(tmp_path, 2, NARROWED)
    assert OUTSIDE in " ".join(shown.split())
    assert testbed.boots
    for booted in testbed.boots:
        mnbt = booted["max_num_batched_tokens"]
        assert mnbt == 7168 or mnbt in range(2048, 4097, 512)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion("evolving")
        assert champion is not None and champion.config["max_num_batched_tokens"] == 7168
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    status = orchestrate(tmp_path, "status", "--profile", "profile.yaml", timeout=60, env=env)
    assert status.returncode == 0, status.stderr
    assert OUTSIDE in " ".join(status.stdout.split())
    data = orchestrate(
        tmp_path, "status", "--profile", "profile.yaml", "--json", timeout=60, env=env
    )
    assert json.loads(data.stdout)["champion"]["outside_domain"] == ["max_num_batched_tokens"]
    # the profile as it was: nothing to say
    write_profile(tmp_path, profile_data())
    status = orchestrate(tmp_path, "status", "--profile", "profile.yaml", timeout=60, env=env)
    assert "outside the profile's domain" not in status.stdout


def baseline_kept(workdir: Path, profile: Profile) -> ExperimentRecord:
    """A ledger in ``workdir`` (``orchestrate.db``) whose cluster's champion is ``profile``'s
    initial config, kept at 100 tok/s as a round's baseline: a champion measured under the
    profile as it was, for the tests that then change the profile under it."""
    with Ledger(f"sqlite:///{workdir}/orchestrate.db") as ledger:
        rnd = ledger.create_round(
            cluster=profile.cluster.name,
            profile_name=profile.name,
            profile_digest=profile.digest,
            budget=1,
            proposer="sweep",
            approve="auto",
            seed=0,
        )
        baseline = ledger.add_experiment(
            cluster=profile.cluster.name,
            round_id=rnd.id,
            kind=Kind.BASELINE,
            config=profile.initial_champion(),
            champion_key=None,
            champion_objective=None,
        )
        return ledger.decide(
            baseline.id,
            verdict=VerdictRecord(status=Status.KEEP, rule="baseline", reason="", stats={}),
            objective=100.0,
            delta_pct=None,
            accept_len=None,
            promote=True,
        )


# ---- cluster up ---------------------------------------------------------------------------
def test_cluster_up_deploys_a_champion_that_predates_a_knob(cli_workdir: Path) -> None:
    data = twin_profile_data()
    profile = Profile.model_validate(data)
    baseline_kept(cli_workdir, profile)
    # the twin takes no --moe-backend: the new knob reaches it as an environment variable
    data["knobs"].append({**MOE, "render": {"kind": "env", "env": "MOE_BACKEND"}})
    write_profile(cli_workdir, data)
    line = "profile gained knob moe_backend: the champion takes its default 'triton'"
    # status reads, and records nothing: it says so, with the champion as the profile sees it
    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml", timeout=60)
    assert status.returncode == 0, status.stderr
    assert (
        f"{line}, where its engine ran the launcher's own $MOE_BACKEND (or the engine's default) "
        "until now; to start from another value, give it as the knob's default under knobs: "
        "({name: moe_backend, default: VALUE}) (recorded by the next round or cluster up)"
    ) in " ".join(status.stdout.split())  # status wraps at the terminal's width
    assert "moe_backend=triton" in status.stdout
    up = orchestrate(cli_workdir, "cluster", "up", "--profile", "profile.yaml")
    assert up.returncode == 0, up.stderr
    assert line in up.stdout
    launcher = (cli_workdir / "nodes" / "node-0" / "launcher.sh").read_text()
    assert "export MOE_BACKEND=triton" in launcher
    with Ledger(f"sqlite:///{cli_workdir}/orchestrate.db") as ledger:
        # the knob, once, and the profile it was deployed under (``revision``)
        events = ledger.events(profile.cluster.name)
        assert [e.kind for e in events] == [EventKind.KNOB_ADDED, EventKind.PROFILE_REVISED]
        assert events[0].subject == "moe_backend"
    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml", timeout=60)
    assert status.returncode == 0 and "gained" not in status.stdout, status.stderr


# ---- a knob dropped whose engine default fails --------------------------------------------
def test_a_refit_champion_is_blamed_only_until_it_came_up_as_the_profile_renders_it(
    tmp_path: Path,
) -> None:
    """``refit_blame``: the champion measured with max_num_batched_tokens 4096, a profile that
    no longer tunes it (and gained moe_backend) boots it otherwise; until a boot of it so came
    up, its failures are the profile's change, with the knob's flag from the catalog; once one
    came up, a later failure is the cluster's again (``None``)."""
    before = Profile.model_validate(profile_data())
    config = before.space.config({"max_num_batched_tokens": 4096}, partial=True)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        rnd = ledger.create_round(
            cluster="evolving",
            profile_name="p",
            profile_digest=before.digest,
            budget=1,
            proposer="sweep",
            approve="auto",
            seed=0,
        )
        champion = ledger.add_experiment(
            cluster="evolving",
            round_id=rnd.id,
            kind=Kind.BASELINE,
            config=config,
            champion_key=None,
            champion_objective=None,
        )
        boot = ledger.start_boot(champion.id, config)
        ledger.end_boot(boot.id, status=BootStatus.DOWN)
        after = Profile.model_validate({**profile_data(MOE), "untuned": ["max_num_batched_tokens"]})
        fitted = after.space.reconcile(config).config
        boot = ledger.start_boot(champion.id, fitted)
        ledger.end_boot(boot.id, status=BootStatus.FAILED, failure_class="oom")
        blame = refit_blame(after, ledger, champion)
        assert blame is not None
        assert (blame.removed, blame.added) == (
            {"max_num_batched_tokens": 4096},
            {"moe_backend": "triton"},
        )
        assert blame.what == (
            "knob max_num_batched_tokens, which the profile no longer has, was 4096 in it, and "
            "without it the engine runs at its own default; knob moe_backend, which the profile "
            "gained, sets the champion's moe_backend='triton'"
        )
        assert blame.todo == (
            "put max_num_batched_tokens back in profile p (take it out of untuned:), or set "
            "--max-num-batched-tokens 4096 in its launcher; give moe_backend the default the "
            "champion's engine ran at, or take it out of profile p"
        )
        # the same profile it was measured under: nothing of the profile's to blame
        assert refit_blame(before, ledger, champion) is None
        boot = ledger.start_boot(champion.id, fitted)
        ledger.end_boot(boot.id, status=BootStatus.DOWN)
        assert refit_blame(after, ledger, champion) is None


@pytest.mark.timeout(600)
def test_a_dropped_knob_whose_engine_default_fails_is_named_exit_3_not_the_cluster(
    cli_workdir: Path,
) -> None:
    """The champion ran at gpu_memory_utilization 0.85; a profile that stops tuning the knob
    boots it without the flag, and the twin's engine takes vLLM's default, 0.9, which runs out
    of memory. Before, the champion's two failed boots stopped the round with exit 5 and the
    cluster's line ("the cluster is failing"). Now the line names the dropped knob, its value
    and the two ways back, with the profile's exit code; nothing is barred, the round stays open."""
    data = twin_profile_data()
    data["cells"] = data["cells"][:1]
    data["verdict"] = {"policy": "threshold", "threshold_pct": 2.0}
    write_profile(cli_workdir, data)
    first = orchestrate(cli_workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert first.returncode == 0, first.stderr
    data["untuned"] = ["gpu_memory_utilization"]
    del data["champion"]["gpu_memory_utilization"]
    write_profile(cli_workdir, data)
    second = orchestrate(cli_workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert second.returncode == 3, second.stderr
    [line] = [x for x in second.stderr.splitlines() if x.startswith("Error: ")]
    assert line.startswith("Error: the champion (experiment #1) failed 2 times in a row (oom, oom")
    assert line.endswith(
        "): knob gpu_memory_utilization, which the profile no longer has, was 0.85 in it, and "
        "without it the engine runs at its own default; no change is left undecided and nothing "
        "was barred: put gpu_memory_utilization back in profile twin-test (take it out of "
        "untuned:), or set --gpu-memory-utilization 0.85 in its launcher, and run the same "
        "command again"
    ), line
    assert "the cluster is failing" not in second.stderr
    status = orchestrate(cli_workdir, "status", "--profile", "profile.yaml", timeout=60)
    assert status.returncode == 0, status.stderr
    assert "(exit 3): the champion (experiment #1) failed 2 times" in status.stdout
    with Ledger(f"sqlite:///{cli_workdir}/orchestrate.db") as ledger:
        [event] = ledger.events("twin-local", EventKind.KNOB_REMOVED)
        assert (event.subject, event.detail["value"]) == ("gpu_memory_utilization", 0.85)
        rnd = ledger.unfinished_round("twin-local")
        assert rnd is not None and rnd.id == 2
        # nothing decided since the first round: no crash, no region barred
        assert [e.round_id for e in ledger.experiments(cluster="twin-local")] == [1, 1]


# ---- a cell redefined between a kill and its resume ----------------------------------------
PROSE = CellSpec(name="prose-c2", category="prose", concurrency=2)


class ConcurrentTestbed(ScriptedTestbed):
    """Every config measures 100 tok/s a request in flight (a cell's throughput grows with its
    concurrency, as a server's does), and Ctrl-C comes once, while the first boot of K=5
    benches its second cell."""

    def __init__(self) -> None:
        super().__init__(lambda config, n: 100.0)
        self.interrupt = True

    def bench(self, cell: CellSpec) -> CellResultRecord:
        if self.interrupt and self.boots[-1]["num_speculative_tokens"] == 5 and cell == PROSE:
            self.interrupt = False
            raise KeyboardInterrupt
        one = super().bench(cell)
        tok_s = one.output_throughput * cell.concurrency
        return one.model_copy(update={"concurrency": cell.concurrency, "output_throughput": tok_s})


def round_with_cells(
    tmp_path: Path,
    testbed: ScriptedTestbed,
    sweep: list[dict[str, Any]],
    cells: Sequence[CellSpec],
    shown: io.StringIO,
) -> None:
    """A round of ``sweep`` (its budget one change each) on ``testbed`` under the profile with
    ``cells``, the ledger ``ledger.db`` in ``tmp_path``; what it shows goes to ``shown``."""
    data = {**profile_data(), "cells": [c.model_dump() for c in cells]}
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            Profile.model_validate(data),
            ledger,
            NullSink(),
            testbed,
            SweepProposer(sweep),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=shown, width=300)),
        ).run(RoundOptions(budget=len(sweep), proposer="sweep", approve="auto"))


def test_a_cell_redefined_before_a_resume_is_measured_again_never_pooled_with_its_old_reading(
    tmp_path: Path,
) -> None:
    testbed = ConcurrentTestbed()
    shown = io.StringIO()

    def run(*cells: CellSpec) -> None:
        round_with_cells(tmp_path, testbed, [{"num_speculative_tokens": 5}], cells, shown)

    # the champion measured on (code-c1 ×1, prose-c2 ×2); K=5 killed after its code-c1
    with pytest.raises(KeyboardInterrupt):
        run(CELL, PROSE)
    # both cells now run four times the requests: the resume measures each again, and the
    # champion too, before K=5 is judged against it
    code4 = CELL.model_copy(update={"concurrency": 4})
    prose8 = PROSE.model_copy(update={"concurrency": 8})
    shown.truncate(0)
    run(code4, prose8)
    said = shown.getvalue()
    for name, change in (("code-c1", "concurrency 1 → 4"), ("prose-c2", "concurrency 2 → 8")):
        line = (
            f"cell {name} changed since it was last measured ({change}): its readings of the old "
            "definition stay in the ledger, set aside, and it is measured again"
        )
        assert said.count(line) == 1, said
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        baseline, k5 = ledger.experiments(cluster="evolving")
        # 400 + 800 on both sides, not the old code-c1's 100 beside the new prose-c2's 800 (a
        # +200 % "gain" over the champion's old 300, kept)
        assert k5.status == Status.DISCARD
        assert k5.objective == pytest.approx(1200.0) and k5.delta_pct == pytest.approx(0.0)
        champion = ledger.champion("evolving")
        assert champion is not None and champion.experiment_id == baseline.id
        assert champion.objective == pytest.approx(1200.0)
        # the old reading stays in the ledger as it was measured, beside the new one
        readings = [(r.spec, r.result.output_throughput) for r in ledger.cell_results(k5.id)]
        assert readings == [(CELL, 100.0), (code4, 400.0), (prose8, 800.0)]
        # measured as the profile defines it now: nothing more to say
        assert changed_cells(ledger, "evolving", [code4, prose8]) == {}


class KilledAfterTheChampion(ConcurrentTestbed):
    """``ConcurrentTestbed`` without its Ctrl-C; once ``armed``, Ctrl-C at the first deploy
    after a boot of the champion's config (``champion``)."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupt = False
        self.armed = False
        self.champion: Config | None = None

    def deploy(self, config: Config) -> dict[int, str]:
        if self.armed and self.boots and self.boots[-1] == self.champion:
            self.boots.append(config)
            raise KeyboardInterrupt
        return super().deploy(config)


def test_a_cell_the_champion_measured_again_is_not_said_to_have_changed(
    tmp_path: Path,
) -> None:
    """A round under the old cells (the baseline, then K=5 decided), then the cells redefined:
    the next round measures the champion again (its readings filed under the baseline, the
    ledger's first experiment) and is killed at the boot after. The newest reading of each
    cell is the champion's, under the cell as it is now. Before, the "latest" reading was the
    last in experiment order, K=5's under the old definition, so ``status`` said the cell had
    changed and would be measured again when it just had been, and said nothing once the old
    cells were back."""
    testbed = KilledAfterTheChampion()

    def run(sweep: list[dict[str, Any]], *cells: CellSpec) -> None:
        round_with_cells(tmp_path, testbed, sweep, cells, io.StringIO())

    run([{"num_speculative_tokens": 5}], CELL, PROSE)
    code4 = CELL.model_copy(update={"concurrency": 4})
    prose8 = PROSE.model_copy(update={"concurrency": 8})
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        champion = ledger.champion("evolving")
        assert champion is not None
        testbed.champion, testbed.armed = champion.config, True
    with pytest.raises(KeyboardInterrupt):
        run([{"num_speculative_tokens": 4}, {"num_speculative_tokens": 6}], code4, prose8)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        readings = ledger.cluster_cell_results("evolving")
        first, *later = sorted(readings)
        newest = max((r for rs in readings.values() for r in rs), key=lambda r: r.boot_id)
        assert newest in readings[first] and newest.spec in (code4, prose8), readings
        assert any(r.spec == CELL for e in later for r in readings[e]), readings
        assert changed_cells(ledger, "evolving", [code4, prose8]) == {}
        assert list(changed_cells(ledger, "evolving", [CELL, PROSE])) == ["code-c1", "prose-c2"]
