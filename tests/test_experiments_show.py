"""``orchestrate experiments show`` as a real process on ledgers released orchestrates wrote
(``fixtures/ledgers``): one experiment's change, verdict and boots, the node each failed boot
failed on, the boot whose clocks were off (which no verdict counts), and its cells; an unknown
ID is one line; nothing is written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from knobs.records import CellResultRecord
from knobs.vocabulary import (
    BOOT_CLOSED_BY_DOWN,
    BOOT_ERRORED,
    BOOT_INTERRUPTED,
    BOOT_TORN_DOWN,
    BootRole,
    BootStatus,
    Kind,
)
from ledger import ExperimentRecord, Ledger
from orchestrator.cli import run
from orchestrator.host_stalls import boot_error, disturbed
from orchestrator.profile import Profile, load_profile
from tests.fixtures.cli import orchestrate
from tests.test_verdict import cell

LEDGERS = Path(__file__).parent / "fixtures" / "ledgers"
REASON = "fixture: node-1's clocks are stuck tonight; set the change aside"


def _ledger(tmp_path: Path, name: str) -> dict[str, str]:
    """A copy of release ``name``'s ledger and its profile in ``tmp_path``; the environment
    that points the CLI at it."""
    shutil.copyfile(LEDGERS / f"{name}.sqlite", tmp_path / "orchestrate.db")
    return {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}


def _show(tmp_path: Path, env: dict[str, str], *args: str) -> Any:
    return orchestrate(tmp_path, "experiments", "show", *args, env=env)


def test_an_experiment_shows_its_verdict_its_boots_their_nodes_and_its_cells(
    tmp_path: Path,
) -> None:
    env = _ledger(tmp_path, "schema6")
    shutil.copyfile(LEDGERS / "schema6.profile.yaml", tmp_path / "profile.yaml")
    before = hashlib.sha256((tmp_path / "orchestrate.db").read_bytes()).hexdigest()

    # the change a person vetoed while node-1's clocks were stuck: its one boot failed there
    done = _show(tmp_path, env, "3", "--json", "-p", "profile.yaml")
    assert done.returncode == 0, done.stderr
    vetoed = json.loads(done.stdout)
    assert (vetoed["id"], vetoed["status"], vetoed["knob"], vetoed["value"]) == (
        3,
        "vetoed",
        "gpu_memory_utilization",
        0.71,
    )
    assert vetoed["verdict"]["rule"] == "veto" and vetoed["verdict"]["reason"] == REASON
    [boot] = vetoed["boots"]
    assert (boot["status"], boot["failure_class"], boot["failed_on"]) == (
        "failed",
        "clocks_stuck",
        {"rank": 1, "host": "127.0.0.1"},
    )
    assert boot["cells"] == [] and boot["clocks_off"] == []

    # the next change: a boot whose node-2 clocks went off while it measured, a boot that
    # failed on node-2, and the boot its verdict counted
    done = _show(tmp_path, env, "4", "--json", "-p", "profile.yaml")
    assert done.returncode == 0, done.stderr
    discarded = json.loads(done.stdout)
    assert discarded["status"] == "discard" and discarded["verdict"]["rule"] == "posterior"
    assert discarded["verdict"]["stats"]["candidate_boots"] == 1
    off, failed, counted = discarded["boots"]
    assert off["clocks_off"] == [2] and len(off["cells"]) == 4
    assert failed["failed_on"] == {"rank": 2, "host": "127.0.0.1"} and failed["cells"] == []
    assert counted["clocks_off"] == [] and {c["cell"] for c in counted["cells"]} == {
        "code-c1",
        "prose-c8",
        "structured-c4",
        "agentic-c4-8k",
    }
    assert all(c["output_throughput"] > 0 for c in counted["cells"])

    text = _show(tmp_path, env, "4", "-p", "profile.yaml")
    assert text.returncode == 0, text.stderr
    assert "discard: objective 10551.0 (+3.41% vs its champion)" in text.stdout
    assert "verdict (posterior): +3.41% over 1 boot(s) vs 3" in text.stdout
    assert (
        f"boot {off['id']} (measure, measurement 0): down; clocks off on node(s) 2" in text.stdout
    )
    assert f"boot {failed['id']} (measure, measurement 1): failed, clocks_stuck on node 2" in (
        text.stdout
    )

    unknown = _show(tmp_path, env, "44", "-p", "profile.yaml")
    assert unknown.returncode == 3
    assert unknown.stderr.strip().splitlines() == [
        "Error: cluster twin-local has no experiment #44: `orchestrate export` lists its "
        "experiments (results.tsv)"
    ]
    after = hashlib.sha256((tmp_path / "orchestrate.db").read_bytes()).hexdigest()
    assert after == before, "showing writes nothing"
    nowhere = {**env, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/none.db"}
    missing = _show(tmp_path, nowhere, "1", "-p", "profile.yaml")
    assert missing.returncode == 4 and not (tmp_path / "none.db").exists()
    assert missing.stderr.strip().splitlines() == [
        f"Error: no ledger yet at sqlite:///{tmp_path}/none.db: `orchestrate round` creates it "
        "(ORCHESTRATE_LEDGER or the profile's ledger_url names another)"
    ]


def test_a_boot_recorded_before_schema_6_names_no_node_and_keeps_its_message(
    tmp_path: Path,
) -> None:
    """The schema-5 release's kv_capacity crash: its failed boot shows its class and message,
    and no node (the columns came with schema 6)."""
    env = _ledger(tmp_path, "schema5")
    done = _show(tmp_path, env, "3", "--json")
    # read as upgraded, and left as the release wrote it: no upgrade, no copy aside
    assert (tmp_path / "orchestrate.db").read_bytes() == (LEDGERS / "schema5.sqlite").read_bytes()
    assert [p.name for p in tmp_path.glob("orchestrate.db*")] == ["orchestrate.db"]
    assert done.returncode == 0, done.stderr
    crash = json.loads(done.stdout)
    assert crash["status"] == "crash" and crash["failure_class"] == "kv_capacity"
    [failed] = [b for b in crash["boots"] if b["status"] == "failed"]
    assert (failed["failure_class"], failed["failed_on"]) == ("kv_capacity", None)
    assert failed["failure_detail"] == "node-0: engine exited before /health was 200"


def test_an_experiment_says_when_it_was_decided_as_the_rest_of_the_cli_does(
    tmp_path: Path,
) -> None:
    """To the minute, in UTC, said so (``2026-12-05 03:12 UTC``), as status and the report say
    a moment; ``--json`` keeps ISO 8601."""
    env = _ledger(tmp_path, "schema6")
    shutil.copyfile(LEDGERS / "schema6.profile.yaml", tmp_path / "profile.yaml")
    iso = json.loads(_show(tmp_path, env, "4", "--json", "-p", "profile.yaml").stdout)
    decided = datetime.fromisoformat(iso["decided_at"]).astimezone(UTC)
    text = _show(tmp_path, env, "4", "-p", "profile.yaml").stdout
    assert f", decided {decided:%Y-%m-%d %H:%M} UTC\n" in text, text
    assert iso["decided_at"] not in text


def _baseline(ledger: Ledger, prof: Profile) -> ExperimentRecord:
    """A round of one experiment, its baseline, recorded and not yet booted."""
    rnd = ledger.create_round(
        cluster=prof.cluster.name,
        profile_name=prof.name,
        profile_digest="d",
        budget=1,
        proposer="sweep",
        approve="auto",
        seed=0,
    )
    return ledger.add_experiment(
        cluster=prof.cluster.name,
        round_id=rnd.id,
        kind=Kind.BASELINE,
        config=prof.initial_champion(),
        champion_key=None,
        champion_objective=None,
        description="baseline",
    )


def test_a_boot_a_stopped_run_cut_short_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A boot closed by no failure but by a run that stopped (interrupted and torn down, left
    up by a killed run and closed by a resume or by `cluster down`) says it was cut short, not
    just "down", and how: only a boot whose teardown never ran reads as killed before it."""
    url = f"sqlite:///{tmp_path}/orchestrate.db"
    monkeypatch.setenv("ORCHESTRATE_LEDGER", url)
    prof = load_profile(None)
    config = prof.initial_champion()
    with Ledger(url) as ledger:
        e = _baseline(ledger, prof)
        errored = BOOT_ERRORED + "launcher of node-0: unknown placeholder {nope}"
        for detail in (BOOT_INTERRUPTED, BOOT_CLOSED_BY_DOWN, errored, None, BOOT_TORN_DOWN):
            boot = ledger.start_boot(e.id, config, role=BootRole.MEASURE, measurement=0)
            ledger.end_boot(boot.id, status=BootStatus.DOWN, failure_detail=detail)
    assert run(["experiments", "show", str(e.id)]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if "boot " in ln]
    assert lines == [
        "boot 1 (measure, measurement 0): down; cut short: the run was interrupted or killed "
        "before its teardown",
        "boot 2 (measure, measurement 0): down; cut short: a killed run left it up; "
        "`orchestrate cluster down` closed it",
        "boot 3 (measure, measurement 0): down; cut short: an error of orchestrate's stopped "
        "the run: launcher of node-0: unknown placeholder {nope}",
        "boot 4 (measure, measurement 0): down",
        "boot 5 (measure, measurement 0): down; cut short: the run was interrupted (Ctrl-C, "
        "SIGTERM or SIGHUP); its teardown ran and stopped its engines",
    ], lines


def test_each_boot_shows_its_stalls_what_they_may_have_cost_and_whether_disturbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The forty-ninth session's review (F5): a boot's cells listed their tok/s and nothing of
    the seconds their hosts stalled them, though the verdict weighed them (a busy host's boots
    confirmed a drift). Each cell now says its window's stalls (client, engine), each boot what
    they may have moved its objective by (``host_stalls.boot_error``: the verdict's one home)
    and whether a busy host disturbed it; a boot nothing stalled says nothing of it."""
    url = f"sqlite:///{tmp_path}/orchestrate.db"
    monkeypatch.setenv("ORCHESTRATE_LEDGER", url)
    prof = load_profile(None)
    config = prof.initial_champion()
    # boot 1 clean; boot 2 lightly stalled (one cell, 0.01 s); boot 3 a busy host's
    stalls = [{}, {0: (0.01, 0.0)}, {0: (0.2, 0.0), 1: (1.19, 4.46)}]
    with Ledger(url) as ledger:
        e = _baseline(ledger, prof)
        booted: list[list[CellResultRecord]] = []
        for measurement, stalled in enumerate(stalls):
            boot = ledger.start_boot(e.id, config, role=BootRole.MEASURE, measurement=measurement)
            records = []
            for i, spec in enumerate(prof.cells):
                client, engine = stalled.get(i, (0.0, 0.0))
                record = cell(1000.0 + 100 * i, name=spec.name).model_copy(
                    update={
                        "client_stall_s": client,
                        "engine_stall_s": engine,
                        "measured_again": 2 if engine else 0,
                        # one of the two dropped as the node's: an engine found stopped
                        "engine_found_stopped": 1 if engine else 0,
                    }
                )
                ledger.add_cell_result(e.id, boot.id, record, spec=spec)
                records.append(record)
            ledger.end_boot(boot.id, status=BootStatus.DOWN)
            booted.append(records)
    assert run(["experiments", "show", str(e.id)]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    heads = [ln for ln in lines if ln.startswith("boot ")]
    light, busy = (boot_error(b) * 100 for b in booted[1:])
    assert not disturbed(booted[1]) and disturbed(booted[2])
    assert heads == [
        "boot 1 (measure, measurement 0): down",
        "boot 2 (measure, measurement 1): down; its hosts stalled its cells' windows 0.01 s in "
        f"all, which may have moved its objective by up to {light:.1f}%",
        "boot 3 (measure, measurement 2): down; disturbed by a busy host: its hosts stalled its "
        f"cells' windows 5.85 s in all, which may have moved its objective by up to {busy:.1f}% "
        "(over 2%: the host's reading, not the config's alone)",
    ], heads
    first, second = prof.cells[0].name, prof.cells[1].name
    assert f"{first}: 1000.0 tok/s" in lines  # boot 1: nothing stalled, nothing said
    assert f"{first}: 1000.0 tok/s, stalled 0.20 s (client) around its 2 s window" in lines
    assert (
        f"{second}: 1100.0 tok/s, stalled 1.19 s (client) + 4.46 s (engine) around its 2 s "
        "window; measured again 2 time(s) (1 for an engine found stopped)"
    ) in lines, lines

    assert run(["experiments", "show", str(e.id), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert [(b["stalled_s"], b["disturbed"]) for b in view["boots"]] == [
        (0.0, False),
        (0.01, False),
        (pytest.approx(5.85), True),
    ]
    assert [b["stall_error"] for b in view["boots"]] == [0.0, *(boot_error(b) for b in booted[1:])]
    assert view["boots"][2]["cells"][1]["engine_stall_s"] == 4.46
    assert [c["engine_found_stopped"] for c in view["boots"][2]["cells"]][:2] == [0, 1]
