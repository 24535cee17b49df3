"""A knob taken off ``untuned:`` (to be tuned from now on): the champion, which ran it at the
launcher's own flag (or the engine's default), takes the knob's default, and the round's start
and ``status`` say where its engine ran it and how to start from another value; a default given
under ``knobs:`` is where the champion starts."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from agents import SweepProposer
from ledger import Ledger
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.profile import load_profile
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.fixtures.profiles import write_profile
from tests.test_profile_evolution import RenderingTestbed, profile_data

LINE = (
    "profile gained knob kv_cache_dtype: the champion takes its default {value}, where its "
    "engine ran the launcher's own --kv-cache-dtype (or the engine's default) until now; to "
    "start from another value, give it as the knob's default under knobs: "
    "({{name: kv_cache_dtype, default: VALUE}})"
)


def _untuned() -> dict[str, Any]:
    """The launcher runs the KV cache at auto, the profile leaving the knob to it."""
    data = profile_data()
    data["untuned"] = ["kv_cache_dtype"]
    data["launcher"]["argv"] = ["true", "--kv-cache-dtype", "auto"]
    return data


def _round(tmp_path: Path, data: dict[str, Any]) -> tuple[list[str], RenderingTestbed]:
    """One experiment's round under ``data``: the lines it showed, the configs it booted."""
    profile = load_profile(str(write_profile(tmp_path, data)), base_dir=tmp_path)
    testbed = RenderingTestbed(profile.space)
    shown = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        RoundRunner(
            profile,
            ledger,
            NullSink(),
            testbed,
            SweepProposer(),
            ApprovalGate(ledger, "auto"),
            RoundDisplay(Console(file=shown, width=1000)),
        ).run(RoundOptions(budget=1, proposer="sweep", approve="auto"))
    return shown.getvalue().splitlines(), testbed


def test_a_knob_taken_off_untuned_says_where_the_engine_ran_it_at_the_round_and_status(
    tmp_path: Path,
) -> None:
    _round(tmp_path, _untuned())
    write_profile(tmp_path, profile_data())  # off untuned:, and out of the launcher's argv
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/ledger.db"}
    status = orchestrate(tmp_path, "status", "--profile", "profile.yaml", env=env, timeout=60)
    assert status.returncode == 0, status.stderr
    line = LINE.format(value="'fp8_e4m3'")
    said = " ".join(status.stdout.split())  # status wraps at the terminal's width
    assert f"{line} (recorded by the next round or cluster up)" in said, status.stdout
    shown, testbed = _round(tmp_path, profile_data())
    assert line in shown, shown
    assert {b["kv_cache_dtype"] for b in testbed.boots} == {"fp8_e4m3"}


def test_a_default_under_knobs_is_where_a_knob_taken_off_untuned_starts(tmp_path: Path) -> None:
    _round(tmp_path, _untuned())
    shown, testbed = _round(tmp_path, profile_data({"name": "kv_cache_dtype", "default": "auto"}))
    assert LINE.format(value="'auto'") in shown, shown
    assert {b["kv_cache_dtype"] for b in testbed.boots} == {"auto"}
