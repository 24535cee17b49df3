"""``orchestrate known-bad list | clear`` as a real process on a real SQLite ledger: every
region the cluster's verdicts bar, with the experiment that barred it; a cleared one is
recorded as an event (who, why), bars nothing from then on and is proposed again, while the
experiment's verdict and results.tsv stay as they were."""

from __future__ import annotations

import getpass
import io
import json
import os
import socket
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from agents import SweepProposer
from knobs.config import Change
from knobs.vocabulary import EventKind, Kind, Status
from ledger import Ledger, VerdictRecord
from orchestrator.approval import ApprovalGate
from orchestrator.champion import ChampionEvidence
from orchestrator.display import RoundDisplay
from orchestrator.history import proposal_context
from orchestrator.profile import load_profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.test_config_failures import Failing
from tests.test_round_policy import CELL

PROFILE = "scripted.yaml"


def write_scripted_profile(directory: Path) -> Path:
    """The scripted testbed's profile, with K narrowed to 5…7 (so K=5 is the champion's first
    neighbour) and one flaky K=5 start."""
    data: dict[str, Any] = {
        "name": "scripted",
        "model": "m",
        "cluster": {
            "name": "scripted",
            "nodes": [{"rank": 0, "host": "127.0.0.1", "workdir": str(directory / "node")}],
        },
        "launcher": {"argv": ["true"]},
        "knob_catalog": "vllm-dflash2",
        "knobs": [{"name": "num_speculative_tokens", "low": 5, "high": 7, "default": 7}],
        "cells": [CELL.model_dump()],
        "verdict": {"noise": {"boot_to_boot": 0.02, "run_to_run": 0.01}},
    }
    path = directory / PROFILE
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def a_round(directory: Path, testbed: Failing, changes: list[dict[str, object]] | None) -> Any:
    """One budget-1 or -2 round in this process on the CLI's ledger (``ORCHESTRATE_LEDGER``)."""
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    loop = RoundRunner(
        load_profile(str(directory / PROFILE)),
        ledger,
        NullSink(),
        testbed,
        SweepProposer(changes),  # type: ignore[arg-type]
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=io.StringIO())),
    )
    try:
        return loop.run(
            RoundOptions(budget=len(changes or [None]), proposer="sweep", approve="auto")
        )
    finally:
        ledger.close()


def listed(directory: Path) -> list[dict[str, Any]]:
    done = orchestrate(directory, "known-bad", "list", "--json", "--profile", PROFILE)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def test_known_bad_regions_are_listed_cleared_with_a_reason_and_proposed_again(
    cli_workdir: Path,
) -> None:
    write_scripted_profile(cli_workdir)
    # K=5 fails to start twice (a crash: barred); a memory fraction of 0.9 runs out of memory
    # (monotone: its whole side barred)
    broken = Failing(
        lambda n, c: (
            "start"
            if c["num_speculative_tokens"] == 5
            else "oom"
            if c["gpu_memory_utilization"] == 0.9
            else None
        )
    )
    first = a_round(
        cli_workdir, broken, [{"num_speculative_tokens": 5}, {"gpu_memory_utilization": 0.9}]
    )
    k5, gmu = first.experiments[1:]
    assert (k5.status, gmu.status) == (Status.CRASH, Status.CRASH)

    rows = listed(cli_workdir)
    assert [(r["id"], r["source"], r["region"], r["reason"], r["cleared"]) for r in rows] == [
        (k5.id, "crash", "num_speculative_tokens=5", "start", None),
        (gmu.id, "crash", "gpu_memory_utilization>=0.9", "oom", None),
    ]
    assert rows[0]["champion"] == first.experiments[0].id
    table = orchestrate(cli_workdir, "known-bad", "list", "-p", PROFILE)
    assert table.returncode == 0, table.stderr
    assert "num_speculative_tokens=5" in table.stdout and "2 barred, 0 cleared" in table.stdout
    before = orchestrate(cli_workdir, "export", "-", "--profile", PROFILE).stdout

    why = "node-0 had a stale engine on the port that night, not the config"
    cleared = orchestrate(
        cli_workdir, "known-bad", "clear", str(k5.id), "--reason", why, "--profile", PROFILE
    )
    assert cleared.returncode == 0, cleared.stderr
    actor = f"{getpass.getuser()}@{socket.gethostname()}"
    assert cleared.stdout.startswith(
        f"cleared num_speculative_tokens=5 (barred by experiment #{k5.id}"
    )
    assert actor in cleared.stdout

    rows = listed(cli_workdir)
    assert rows[0]["cleared"]["by"] == actor and rows[0]["cleared"]["reason"] == why
    assert rows[1]["cleared"] is None
    assert (
        "1 barred, 1 cleared" in orchestrate(cli_workdir, "known-bad", "list", "-p", PROFILE).stdout
    )
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    [event] = ledger.events("scripted", EventKind.KNOWN_BAD_CLEARED)
    assert (event.subject, event.reason, event.actor) == (str(k5.id), why, actor)
    assert ledger.experiment(k5.id).status == Status.CRASH  # the verdict stays
    ledger.close()
    assert orchestrate(cli_workdir, "export", "-", "--profile", PROFILE).stdout == before

    # the champion's first neighbour is K=5 again: the sweep proposes it, and it boots now
    again = a_round(cli_workdir, Failing(lambda n, c: None), None)
    [k5_again] = again.experiments
    assert (k5_again.knob, k5_again.value) == ("num_speculative_tokens", 5)
    assert k5_again.status in (Status.DISCARD, Status.INCONCLUSIVE, Status.KEEP)


def test_clearing_what_bars_nothing_is_one_line(cli_workdir: Path) -> None:
    write_scripted_profile(cli_workdir)
    report = a_round(
        cli_workdir,
        Failing(lambda n, c: "start" if c["num_speculative_tokens"] == 5 else None),
        [{"num_speculative_tokens": 5}],
    )
    baseline, k5 = report.experiments

    def clear(*args: str) -> tuple[int, str]:
        done = orchestrate(cli_workdir, "known-bad", "clear", *args, "--profile", PROFILE)
        assert done.stdout == ""
        return done.returncode, done.stderr

    code, err = clear(str(baseline.id), "--reason", "why not")
    assert code == 3
    assert err == (
        f"Error: experiment #{baseline.id} bars nothing on cluster scripted; "
        "`orchestrate known-bad list` shows what is barred\n"
    )
    assert clear("999", "--reason", "no such experiment")[0] == 3
    code, err = clear(str(k5.id), "--reason", "  ")
    assert code == 2 and err.startswith("Error: --reason must say why")
    code, err = clear(str(k5.id))
    assert code == 2 and "--reason" in err and len(err.splitlines()) == 1
    assert (
        orchestrate(
            cli_workdir, "known-bad", "clear", str(k5.id), "--reason", "flaky", "-p", PROFILE
        ).returncode
        == 0
    )
    code, err = clear(str(k5.id), "--reason", "twice")
    assert code == 3 and "was cleared already" in err and len(err.splitlines()) == 1
    assert listed(cli_workdir)[0]["cleared"]["reason"] == "flaky"


def test_an_invalid_configs_region_says_why_and_a_risk_line_says_how_it_stands(
    cli_workdir: Path,
) -> None:
    """K 7 → 6 found invalid (its greedy texts differ), then MNBT 7168 → 8192 kept. Before,
    the region K=6's verdict bars read "invalid: invalid" (the status as its own reason), and
    the risk line of any K change named it, K=5 too, as if it held that config. Now its reason
    is the verdict's words; a risk line names it only for K=6, with the knob that keeps that
    config out of it."""
    prof = load_profile(str(write_scripted_profile(cli_workdir)))
    base = prof.initial_champion()
    cluster = prof.cluster.name
    mismatch = "greedy outputs differ from the champion's on 1 prompt(s): code-c1/p0"
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        rnd = ledger.create_round(
            cluster=cluster, profile_name="scripted", profile_digest="d", budget=2,
            proposer="sweep", approve="auto", seed=0,
        )  # fmt: skip

        def decided(change: Change | None, status: Status, rule: str, reason: str) -> int:
            e = ledger.add_experiment(
                cluster=cluster,
                round_id=rnd.id,
                kind=Kind.BASELINE if change is None else Kind.CANDIDATE,
                config=base if change is None else base.apply(change),
                champion_key=None if change is None else base.key,
                champion_objective=None if change is None else 100.0,
                knob=None if change is None else change.knob,
                value=None if change is None else change.new,
            )
            ledger.decide(
                e.id,
                verdict=VerdictRecord(status=status, rule=rule, reason=reason, stats={}),
                objective=100.0,
                delta_pct=None,
                accept_len=None,
                promote=status == Status.KEEP,
            )
            return e.id

        decided(None, Status.KEEP, "baseline", "the baseline")
        k6 = decided(
            Change(knob="num_speculative_tokens", old=7, new=6), Status.INVALID,
            "greedy-mismatch", mismatch,
        )  # fmt: skip
        decided(
            Change(knob="max_num_batched_tokens", old=7168, new=8192), Status.KEEP, "keep", "+5%"
        )
    rows = listed(cli_workdir)
    assert [(r["id"], r["source"], r["reason"]) for r in rows] == [(k6, "invalid", mismatch)]
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        context = proposal_context(prof, ledger, ChampionEvidence(prof, ledger), rnd, 0)
    risk = context.risk_of(Change(knob="num_speculative_tokens", old=7, new=6))
    assert "invalid: invalid" not in risk, risk
    assert (
        "known-bad regions near it: cuda_graphs=false, drafter_adapter_rank=64, "
        "gpu_memory_utilization=0.85, kv_cache_dtype=fp8_e4m3, max_num_batched_tokens=7168, "
        f"num_speculative_tokens=6 (invalid: {mismatch}), outside it by "
        "max_num_batched_tokens 8192 (not 7168)"
    ) in risk, risk
    assert "known-bad" not in context.risk_of(Change(knob="num_speculative_tokens", old=7, new=5))
