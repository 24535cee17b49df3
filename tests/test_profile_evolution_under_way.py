"""A profile that changes under a ledger loses nothing and moves one knob (docs/reliability.md,
"Profiles that change"). A change under way whose value the profile's narrowed domain no longer
has is closed on resume as one of a knob the profile lost is; a change recorded while a knob
was out of the profile takes the knob, once it is back, from the champion it was proposed
against, not from the knob's default: it moves its own knob and no other."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agents import Proposer, SweepProposer
from knobs.config import Change, Config
from knobs.space import KnobSpace
from knobs.vocabulary import EventKind, ProposalStatus, State, Status
from ledger import ExperimentRecord, Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.champion import ChampionEvidence
from orchestrator.display import RoundDisplay
from orchestrator.history import proposal_context
from orchestrator.known_bad import barred_regions
from orchestrator.profile import Profile, load_profile
from orchestrator.report.data import collect
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.test_profile_evolution import (
    FOO,
    baseline_kept,
    changes,
    left_pending,
    profile_data,
)
from tests.test_round_policy import ScriptedTestbed

K = "num_speculative_tokens"
MNBT = "max_num_batched_tokens"


class KillingTestbed(ScriptedTestbed):
    """Renders every config it deploys with the profile's space (as a launcher does); a config
    ``kill`` picks is interrupted as it deploys (Ctrl-C); ``speed`` and ``text`` as
    ``ScriptedTestbed``'s (100 tok/s and the same text by default)."""

    def __init__(
        self,
        space: KnobSpace,
        kill: Callable[[Config], bool] = lambda config: False,
        speed: Callable[[Config], float] = lambda config: 100.0,
        text: Callable[[Config], str] = lambda config: "same",
    ) -> None:
        super().__init__(lambda config, n: speed(config), text=lambda config, n: text(config))
        self.space = space
        self.kill = kill

    def deploy(self, config: Config) -> dict[int, str]:
        self.space.render(config)  # a config lacking a knob of the space fails here
        if self.kill(config):
            self.boots.append(config)
            raise KeyboardInterrupt
        return super().deploy(config)


def round_of(
    tmp_path: Path,
    data: dict[str, Any],
    budget: int,
    proposer: Proposer | None = None,
    **testbed: Any,
) -> tuple[str, KillingTestbed]:
    """A round (or its resume) under profile ``data``; what it showed, and its testbed."""
    path = write_profile(tmp_path, data)
    profile = load_profile(str(path), base_dir=tmp_path)
    bed = KillingTestbed(profile.space, **testbed)
    shown = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            profile,
            ledger,
            NullSink(),
            bed,
            proposer or SweepProposer(),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=shown, width=300)),
        ).run(RoundOptions(budget=budget, proposer="sweep", approve="auto"))
    return " ".join(shown.getvalue().split()), bed


def killed_as_it_boots(tmp_path: Path, move: dict[str, Any]) -> ExperimentRecord:
    """A round of one change, ``move``, under the profile as it was, Ctrl-C'd as the change
    boots (after the baseline): the change, left under way."""
    [(knob, value)] = move.items()
    with pytest.raises(KeyboardInterrupt):
        round_of(
            tmp_path,
            profile_data(),
            1,
            SweepProposer([move]),
            kill=lambda config: config[knob] == value,
        )
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        _, change = ledger.experiments(cluster="evolving")
        assert (change.knob, change.value, change.state) == (knob, value, State.DEPLOYING)
    return change


# ---- a change under way outside a narrowed domain -----------------------------------------
NARROWED = {"name": MNBT, "high": 8192}
GPU_NARROWED = {"name": "gpu_memory_utilization", "high": 0.88}
OUTSIDE = (
    "max_num_batched_tokens 12288 is outside the profile's domain now (an integer from 2048 to "
    "8192 in steps of 512): the change is closed without a verdict and not booted; nothing is "
    "barred"
)


def test_a_change_outside_a_domain_narrowed_under_way_is_closed_unbooted_on_resume(
    tmp_path: Path,
) -> None:
    """Ctrl-C as the change MNBT 7168 → 12288 boots; the profile then narrows MNBT to 8192 at
    most. Before, the resume booted 12288 anyway, a value the profile no longer allows, and
    judged it. Now it is closed as a change of a knob the profile lost is: decided vetoed by
    the profile, its boot kept and no boot more, a line naming the knob, the value and the
    domain; it bars nothing (should the domain open again, 12288 may run) and does not count
    against the budget: the round goes on with the next change."""
    change = killed_as_it_boots(tmp_path, {MNBT: 12288})
    shown, testbed = round_of(
        tmp_path, profile_data(NARROWED), 1, SweepProposer([{MNBT: 12288}, {K: 3}])
    )
    # it booted once before the kill: its line says so, never "not booted" beside its boot
    booted_once = OUTSIDE.replace(
        "and not booted;", ", its 1 boot(s) kept and no boot more;"
    ).replace("verdict ,", "verdict,")
    assert f"#{change.id} max_num_batched_tokens 7168 → 12288 (sweep): vetoed {booted_once}" in (
        shown
    ), shown
    assert testbed.boots and all(b[MNBT] == 7168 for b in testbed.boots)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        closed = ledger.experiment(change.id)
        assert (closed.state, closed.status) == (State.DECIDED, Status.VETOED)
        assert closed.description == (
            "max_num_batched_tokens 7168 → 12288 (sweep); closed: max_num_batched_tokens 12288 "
            "is outside the profile's domain now"
        )
        verdict = ledger.verdict(change.id)
        assert verdict is not None and verdict.rule == "outside-domain"
        assert verdict.stats == {
            "by": "profile",
            "knob": MNBT,
            "value": 12288,
            "undecided": True,
            "boots": 1,
            "failed": {},
        }
        assert len(ledger.boots(change.id)) == 1  # kept, and none more
        # not counted against the budget: the round's one change is the next
        assert changes(ledger)[2:] == [(K, 3)]
        assert ledger.unfinished_round("evolving") is None
        # nothing barred with the domain as it was, nor taken as decided: it may run again
        wide = Profile.model_validate(profile_data())
        assert barred_regions(wide, ledger) == []
        rnd = ledger.rounds("evolving")[-1]
        context = proposal_context(wide, ledger, ChampionEvidence(wide, ledger), rnd, 0)
        assert context.refusal(Change(knob=MNBT, old=7168, new=12288)) is None


@pytest.mark.parametrize(
    ("status", "coupled"),
    [
        (ProposalStatus.PENDING, False),
        (ProposalStatus.APPROVED, False),
        (ProposalStatus.PENDING, True),
        (ProposalStatus.APPROVED, True),
    ],
)
def test_a_proposal_outside_a_domain_narrowed_since_is_closed_not_booted(
    tmp_path: Path, status: ProposalStatus, coupled: bool
) -> None:
    """A round killed after it recorded a proposal (pending, or approved: the kill before its
    experiment) whose value the profile's domain then leaves out: MNBT 12288 under a profile
    that allows 8192 at most, or a coupled move whose enabling change, gpu_memory_utilization
    0.85 → 0.9, a profile allowing 0.88 at most no longer has. Before, every resume stopped
    with "max_num_batched_tokens: 12288 is above 8192" (exit 3) until the domain opened
    again. Now the change is recorded and closed by the profile without a boot, naming the
    knob whose value is out, and the round goes on."""
    round_of(tmp_path, profile_data(), 1)
    move: dict[str, Any] = (
        dict(knob="kv_cache_dtype", old_value="fp8_e4m3", new_value="auto")
        if coupled
        else dict(knob=MNBT, old_value=7168, new_value=12288)
    )
    rnd, proposal = left_pending(
        tmp_path,
        status == ProposalStatus.APPROVED,
        coupled=("gpu_memory_utilization", 0.85, 0.9) if coupled else None,
        **move,
    )
    shown, testbed = round_of(tmp_path, profile_data(NARROWED, GPU_NARROWED), 1)
    line = (
        "gpu_memory_utilization 0.9 is outside the profile's domain now (a number from 0.7 to "
        "0.88 in steps of 0.01): the change is closed without a verdict and not booted; "
        "nothing is barred"
        if coupled
        else OUTSIDE
    )
    assert line in shown
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        closed = ledger.experiments(round_id=rnd.id)[0]
        assert (closed.status, closed.proposal_id, ledger.boots(closed.id)) == (
            Status.VETOED,
            proposal.id,
            [],
        )
        label = "kv_cache_dtype+gpu_memory_utilization" if coupled else MNBT
        assert closed.label == label
        verdict = ledger.verdict(closed.id)
        assert verdict is not None and verdict.rule == "outside-domain"
        # a pending one is decided by the profile: no person is asked about it
        decider = ledger.proposal(proposal.id).decided_by
        assert decider == ("auto" if status == ProposalStatus.APPROVED else "profile")
        # the round went on with a change the profile allows, and bars nothing
        assert changes(ledger)[-1] == (K, 2)
        assert ledger.unfinished_round("evolving") is None
        assert barred_regions(Profile.model_validate(profile_data()), ledger) == []
    assert testbed.boots and all(b[MNBT] == 7168 for b in testbed.boots)


# ---- a change under way that a forbidden combination added since matches -----------------
FORBIDS = {"when": {MNBT: 12288}, "reason": "12288 hangs the drafter (seen on the night of 5 Dec)"}
FORBIDDEN_LINE = (
    "the profile forbids its config now (forbidden combination max_num_batched_tokens=12288: "
    "12288 hangs the drafter (seen on the night of 5 Dec)): the change is closed without a "
    "verdict and not booted; nothing is barred"
)


def test_a_change_under_way_that_a_forbidden_combination_added_since_matches_is_closed(
    tmp_path: Path,
) -> None:
    """Ctrl-C as MNBT 7168 → 12288 boots; the person who saw it hang writes a forbidden
    combination for it before the resume. Before, the resume booted it anyway (a config the
    profile forbids); now it is closed by the profile as a change outside the domain is, no
    boot more, and the round goes on. A proposal a kill left pending that the rule matches is
    closed the same way (before, every resume stopped with exit 3 on it)."""
    change = killed_as_it_boots(tmp_path, {MNBT: 12288})
    forbidding = {**profile_data(), "forbidden": [FORBIDS]}
    shown, testbed = round_of(tmp_path, forbidding, 1, SweepProposer([{K: 3}]))
    assert f"#{change.id} max_num_batched_tokens 7168 → 12288 (sweep): vetoed " in shown, shown
    # its one boot before the kill kept: said so, never "not booted"
    assert (
        FORBIDDEN_LINE.replace(" and not booted;", ", its 1 boot(s) kept and no boot more;")
        in shown
    ), shown
    assert testbed.boots and all(b[MNBT] == 7168 for b in testbed.boots)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        closed = ledger.experiment(change.id)
        assert (closed.state, closed.status) == (State.DECIDED, Status.VETOED)
        verdict = ledger.verdict(change.id)
        assert verdict is not None and verdict.rule == "forbidden-combination"
        assert len(ledger.boots(change.id)) == 1
        assert changes(ledger)[-1] == (K, 3)  # the round's one change, not counted against it
    # a proposal the rule matches, left pending by a kill
    rnd, pending = left_pending(tmp_path, knob=MNBT, old_value=7168, new_value=12288)
    shown, _ = round_of(tmp_path, forbidding, 1, SweepProposer([{K: 4}]))
    assert FORBIDDEN_LINE in shown, shown
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        first = ledger.experiments(round_id=rnd.id)[0]
        assert (first.proposal_id, first.status, ledger.boots(first.id)) == (
            pending.id,
            Status.VETOED,
            [],
        )
        assert ledger.proposal(pending.id).decided_by == "profile"
        assert changes(ledger)[-1] == (K, 4)
        assert barred_regions(Profile.model_validate(profile_data()), ledger) == []


# ---- a knob dropped and put back ----------------------------------------------------------
FOO_NEW = {**FOO, "new": True}


def with_foo(*knobs: dict[str, Any]) -> dict[str, Any]:
    """The profile with knob foo, whose champion runs it at 5 (its default is 3)."""
    return {**profile_data(FOO_NEW, *knobs), "champion": {"foo": 5}}


def test_a_change_recorded_without_a_dropped_knob_takes_it_from_its_champion_when_it_is_back(
    tmp_path: Path,
) -> None:
    """The champion runs foo 5 (default 3). The profile drops foo; K 7 → 2 is decided and
    Ctrl-C comes as K 7 → 3 boots, both recorded without foo. foo comes back. Before, the
    resume booted K=3 at foo's default 3 against a champion at foo 5: two knobs moved, and
    K=2, decided, was proposed again under the same champion (its key had foo 3). Now a
    change's missing knob comes from the champion it was proposed against: K=3 boots at foo
    5, one knob away from the champion, and the next round goes on with K=4."""
    round_of(tmp_path, with_foo(), 1)  # the baseline at foo 5, and K=1
    with pytest.raises(KeyboardInterrupt):
        round_of(tmp_path, profile_data(), 2, kill=lambda config: config[K] == 3)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        *_, k2, k3 = ledger.experiments(cluster="evolving")
        assert (k2.value, k2.status, k3.value, k3.state) == (2, Status.DISCARD, 3, State.DEPLOYING)
        assert "foo" not in k2.config and "foo" not in k3.config
    _, testbed = round_of(tmp_path, with_foo(), 2)
    assert testbed.boots
    for booted in testbed.boots:  # the change at K=3, the champion at K=7: foo 5 in each
        assert booted["foo"] == 5 and booted[K] in (3, 7)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        resumed = ledger.boots(k3.id)[1:]
        assert resumed and {b.config_key for b in resumed} == {Config({**k3.config, "foo": 5}).key}
        assert ledger.experiment(k3.id).status == Status.DISCARD
    round_of(tmp_path, with_foo(), 1)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        # K=1, 2 and 3 decided under the same champion, foo dropped or not: not proposed again
        assert [v for _, v in changes(ledger)[1:]] == [1, 2, 3, 4]


def test_a_champion_kept_without_a_dropped_knob_takes_it_from_its_parent_when_it_is_back(
    tmp_path: Path,
) -> None:
    """The champion runs foo 5; the profile drops foo, and K 7 → 6 is kept (the new champion
    recorded without foo), then K 6 → 4 found invalid (its greedy texts differ). foo comes back.
    Before, the new champion took foo's default 3 ("takes its default 3"): the keep moved foo
    and K; the region K=4's invalid verdict bars had foo 3, so it barred no config the
    champion's changes reach; the report showed the champion at foo 3. Now the champion takes
    foo 5 from the champion it was proposed against, and the region and the report too
    (the last round's: a past round's report shows its champion as that round ran it)."""
    round_of(tmp_path, with_foo(), 1)
    round_of(
        tmp_path,
        profile_data(),
        2,
        SweepProposer([{K: 6}, {K: 4}]),
        speed=lambda config: 110.0 if config[K] == 6 else 100.0,
        text=lambda config: "other" if config[K] == 4 else "same",
    )
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        *_, k6, k4 = ledger.experiments(cluster="evolving")
        assert (k6.status, k4.status) == (Status.KEEP, Status.INVALID)
    shown, testbed = round_of(tmp_path, with_foo(), 1, SweepProposer([{K: 5}]))
    assert (
        "profile gained knob foo: the champion takes 5, as the champion it was changed from "
        "ran it (experiment #1), not its default 3" in shown
    )
    assert testbed.boots and all(b["foo"] == 5 for b in testbed.boots)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        [event] = ledger.events("evolving", EventKind.KNOB_ADDED)
        assert (event.subject, event.detail) == (
            "foo",
            {"value": 5, "from_experiment": 1, "champion_experiment": k6.id},
        )
        back = Profile.model_validate(with_foo())
        [region] = [r.region for r in barred_regions(back, ledger) if r.experiment.id == k4.id]
        assert region.when["foo"] == 5 and region.when[K] == 4
        # the last round's report: the champion as it runs now, foo 5
        report = collect(back, ledger)
        assert report.champion_config is not None and report.champion_config["foo"] == 5
        # round 2's, a past round's: its champion as round 2 ran it, without foo
        # (``test_report_past_round``)
        then = collect(back, ledger, k6.round_id)
        assert then.champion_config is not None and "foo" not in then.champion_config


# ---- cluster up after a knob drop ---------------------------------------------------------
@pytest.mark.timeout(300)
def test_cluster_up_of_a_champion_that_fails_as_the_profile_renders_it_names_the_dropped_knob(
    cli_workdir: Path,
) -> None:
    """The champion was measured at gpu_memory_utilization 0.85; the profile stops tuning the
    knob, and the twin's engine takes vLLM's default 0.9 and runs out of memory. Before,
    `cluster up` failed as any deploy does (exit 6, the engine's out-of-memory line) and the
    knob was never named. Now it says what a round says (``evolution.refit_blame``): the knob
    dropped, its value, that the engine's default runs now, the ways back; exit 3."""
    data = twin_profile_data()
    profile = Profile.model_validate(data)
    baseline = baseline_kept(cli_workdir, profile)
    data["untuned"] = ["gpu_memory_utilization"]
    del data["champion"]["gpu_memory_utilization"]
    write_profile(cli_workdir, data)
    up = orchestrate(cli_workdir, "cluster", "up", "--profile", "profile.yaml")
    assert up.returncode == 3, up.stderr
    [line] = [x for x in up.stderr.splitlines() if x.startswith("Error: ")]
    assert line.startswith(
        f"Error: the champion (experiment #{baseline.id}) failed to come up (oom"
    )
    assert line.endswith(
        "): knob gpu_memory_utilization, which the profile no longer has, was 0.85 in it, and "
        "without it the engine runs at its own default: put gpu_memory_utilization back in "
        "profile twin-test (take it out of untuned:), or set --gpu-memory-utilization 0.85 in "
        "its launcher, and run the same command again"
    ), line
    # with --set, the set config fails (its own failure, exit 6) and the champion's restore
    # after it fails as the profile renders it now: the restore's line is the refit line
    # (before, the engine's out-of-memory line, the knob never named)
    write_profile(cli_workdir, {**data, "restore_champion": True})
    up = orchestrate(cli_workdir, "cluster", "up", "--profile", "profile.yaml", "--set", f"{K}=3")
    assert up.returncode == 6, up.stderr
    said = " ".join(up.stdout.split())
    assert (
        f"champion NOT restored: the champion (experiment #{baseline.id}) failed to come up (oom"
        in said
    ), said
    assert "knob gpu_memory_utilization, which the profile no longer has, was 0.85" in said, said
