"""The cool-off outlives the process, and the round's line names who really proposes: a real
``orchestrate round`` on the twin, the real SDK talking to the local Messages API server. The
next round (a new process) leaves an API that failed a minute ago alone, as the round that saw
it fail would have, and says that Optuna proposes; a proposal taken from the queue says so and
whose it is, not that the round's proposer is proposing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ledger import Ledger
from orchestrator.profile import load_profile
from tests.fixtures.cli import orchestrate
from tests.fixtures.messages_api import MessagesApi, hang
from tests.fixtures.profiles import fast_profile
from tests.test_claude_deadline import PAST

HHMM = r"\d\d:\d\d UTC"


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    return cli_workdir


def lines(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines()]


def test_the_next_round_leaves_the_failed_api_alone_and_says_optuna_proposes(
    workdir: Path, messages_api: MessagesApi
) -> None:
    claude_settings = {"api_retries": 0, "api_timeout_s": 30, "api_deadline_s": 0.5}
    fast_profile(workdir, proposer={"kind": "claude", "claude": claude_settings})
    messages_api.script(hang(120))
    first = orchestrate(workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert first.returncode == 0, first.stderr
    said = lines(first.stdout)
    assert "proposing (claude)" in said, first.stdout
    assert f"claude fell back to optuna (timed out): {PAST}" in said, first.stdout
    assert len(messages_api.requests) == 1

    # a new process, minutes later at most: the API is not asked, and the line says who
    # proposes (it said "proposing (claude)" and asked the dead API again)
    second = orchestrate(workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert second.returncode == 0, second.stderr
    said = lines(second.stdout)
    fell_back = [line for line in said if "fell back" in line]
    assert len(fell_back) == 1 and re.fullmatch(
        rf"claude fell back to optuna \(timed out\): Claude API not asked: failing since "
        rf"{HHMM} \(timed out\); asked again from {HHMM}",
        fell_back[0],
    ), second.stdout
    assert len(messages_api.requests) == 1
    proposing = [line for line in said if line.startswith("proposing (")]
    assert len(proposing) == 1 and re.fullmatch(
        rf"proposing \(optuna: claude leaves the API alone until {HHMM}\)", proposing[0]
    ), second.stdout


def test_a_proposal_taken_from_the_queue_says_whose_it_is(workdir: Path) -> None:
    fast_profile(workdir, proposer={"kind": "sweep", "sweep": [{"cuda_graphs": True}]})
    profile = load_profile(str(workdir / "profile.yaml"), base_dir=workdir)
    champion = profile.initial_champion()
    # a round stopped while Claude's proposal waited in the queue
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        rnd = ledger.create_round(
            cluster=profile.cluster.name,
            profile_name=profile.name,
            profile_digest="",
            budget=1,
            proposer="claude",
            approve="queue",
            seed=0,
        )
        waiting = ledger.add_proposal(
            round_id=rnd.id,
            source="claude",
            knob="num_speculative_tokens",
            old_value=champion["num_speculative_tokens"],
            new_value=5,
            champion_key=champion.key,
            hypothesis="K=5 drafts fewer rejected tokens.",
        )
    # resumed with the sweep and nobody to ask: the sweep proposes nothing, Claude's waits
    resumed = orchestrate(
        workdir,
        "round",
        "--proposer",
        "sweep",
        "--approve",
        "auto",
        "--profile",
        "profile.yaml",
    )
    assert resumed.returncode == 0, resumed.stderr
    said = lines(resumed.stdout)
    assert f"proposal #{waiting.id} from the queue, proposed by claude" in said, resumed.stdout
    assert not [line for line in said if line.startswith("proposing (")], resumed.stdout
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        [ran] = [e for e in ledger.experiments(round_id=rnd.id) if e.proposal_id == waiting.id]
    assert (ran.knob, ran.value) == ("num_speculative_tokens", 5)
