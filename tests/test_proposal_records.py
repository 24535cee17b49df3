"""What a person reads of proposals and the experiments they became, through the real CLI on
a real SQLite ledger a real round wrote: ``proposals list`` has a header, each proposal's
experiment and a veto's reason; ``status``, ``experiments show`` and the round report name
the proposal an experiment came from."""

from __future__ import annotations

import getpass
import io
import json
import os
import re
import socket
from pathlib import Path

from rich.console import Console

from agents import SweepProposer
from knobs.vocabulary import Kind, Status
from ledger import Ledger, ProposalRecord
from orchestrator.approval import Answer, ApprovalGate
from orchestrator.display import RoundDisplay, experiments_table
from orchestrator.profile import load_profile
from orchestrator.round import RoundOptions, RoundReport, RoundRunner
from orchestrator.testbed import NullSink
from tests.fixtures.cli import orchestrate
from tests.test_known_bad_cli import PROFILE, write_scripted_profile
from tests.test_round_policy import ScriptedTestbed

WHY = "K=5 wedged\trank 2 last week"


def _answer(p: ProposalRecord, problem: str | None) -> Answer:
    """A person at the ``ask`` prompt: K=5 vetoed (a tab in their words), the rest approved."""
    if p.new_value == 5:
        return Answer("veto", None, WHY)
    return Answer("approve")


def _round(directory: Path) -> RoundReport:
    """A round on the CLI's ledger: K=5 vetoed, K=6 approved and kept (120 tok/s against the
    baseline's 100)."""
    write_scripted_profile(directory)
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        return RoundRunner(
            load_profile(str(directory / PROFILE)),
            ledger,
            NullSink(),
            ScriptedTestbed(lambda c, n: 120.0 if c["num_speculative_tokens"] == 6 else 100.0),
            SweepProposer([{"num_speculative_tokens": 5}, {"num_speculative_tokens": 6}]),
            ApprovalGate(ledger, "ask", asker=_answer),
            RoundDisplay(Console(file=io.StringIO())),
        ).run(RoundOptions(budget=3, proposer="sweep", approve="ask"))
    finally:
        ledger.close()


def _cli(directory: Path, *args: str) -> str:
    done = orchestrate(directory, *args, "-p", PROFILE)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_proposals_and_experiments_name_each_other(cli_workdir: Path) -> None:
    report = _round(cli_workdir)
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        vetoed, kept = ledger.proposals()
        became = {e.proposal_id: e for e in ledger.experiments(cluster="scripted")}
        champion = ledger.champion("scripted")
    k5, k6 = became[vetoed.id], became[kept.id]
    assert (k5.status, k6.status) == (Status.VETOED, Status.KEEP)
    assert champion is not None and champion.experiment_id == k6.id

    # a header, then each proposal: the experiment it became, a veto's reason (on one line)
    lines = _cli(cli_workdir, "proposals", "list", "--all").splitlines()
    assert lines[0].split("\t") == [
        "proposal", "status", "decided by", "experiment", "change", "source", "reason",
        "hypothesis",
    ]  # fmt: skip
    rows = [line.split("\t") for line in lines[1:]]
    assert [r[:7] for r in rows] == [
        [str(vetoed.id), "vetoed", vetoed.decided_by, f"#{k5.id}",
         "num_speculative_tokens 7 → 5", "sweep", "K=5 wedged rank 2 last week"],
        [str(kept.id), "approved", kept.decided_by, f"#{k6.id}",
         "num_speculative_tokens 7 → 6", "sweep", "-"],
    ]  # fmt: skip
    shown = json.loads(_cli(cli_workdir, "proposals", "list", "--all", "--json"))
    assert [(p["id"], p["experiment"], p["reason"]) for p in shown] == [
        (vetoed.id, k5.id, WHY),
        (kept.id, k6.id, None),
    ]

    # one proposal in full: its decision with the veto's words, its experiment, its reasoning
    lines = _cli(cli_workdir, "proposals", "show", str(vetoed.id)).splitlines()
    assert lines[:3] == [
        f"proposal {vetoed.id} of round 1 (sweep): num_speculative_tokens 7 → 5",
        f"  status:     vetoed by {getpass.getuser()}@{socket.gethostname()}: K=5 wedged rank 2 "
        "last week",
        f"  experiment: #{k5.id}",
    ], lines
    assert [line.split(":")[0].strip() for line in lines[3:]] == [
        "hypothesis", "expected", "risk", "cost"
    ]  # fmt: skip
    one = json.loads(_cli(cli_workdir, "proposals", "show", str(kept.id), "--json"))
    assert (one["id"], one["status"], one["experiment"]) == (kept.id, "approved", k6.id)

    # the experiment a person reads names the proposal it came from
    said = " ".join(_cli(cli_workdir, "status").split())
    assert f"champion: experiment #{k6.id} (proposal {kept.id}), objective 120.0" in said, said
    state = json.loads(_cli(cli_workdir, "status", "--json"))
    assert state["champion"]["proposal"] == kept.id
    head = _cli(cli_workdir, "experiments", "show", str(k5.id)).splitlines()[0]
    assert head == f"experiment #{k5.id} of cluster scripted, round 1, proposal {vetoed.id}"
    view = json.loads(_cli(cli_workdir, "experiments", "show", str(k6.id), "--json"))
    assert view["proposal"] == kept.id

    _cli(cli_workdir, "report", "--out", "out")
    page = (cli_workdir / "out" / "report.html").read_text()
    assert "<th>#</th><th>proposal</th><th>change</th>" in page
    cells = re.findall(r'<tr><td class="n">#(\d+)</td><td class="n">(\d*)</td>', page)
    assert (str(k5.id), str(vetoed.id)) in cells and (str(k6.id), str(kept.id)) in cells, cells
    baseline = next(e for e in became.values() if e.kind == Kind.BASELINE)
    assert (str(baseline.id), "") in cells, cells

    # the round's own table at its end: each experiment's proposal beside its number
    console = Console(file=io.StringIO(), width=200)
    console.print(experiments_table(report.experiments, report.champion, "Round 1"))
    table = console.file.getvalue()  # type: ignore[attr-defined]
    header = next(line for line in table.splitlines() if " change " in line)
    assert [c.strip() for c in header.split("┃")[1:3]] == ["#", "proposal"], header
    for e, p in ((k5, vetoed), (k6, kept)):
        assert re.search(rf"│\s+{e.id} │\s+{p.id} │ num_speculative", table), table
    # in a log file's 80 columns the change wraps and the verdict is whole, never "inconclu…"
    narrow = Console(file=io.StringIO(), width=80)
    undecided = [e.model_copy(update={"status": "inconclusive"}) for e in report.experiments]
    narrow.print(experiments_table(undecided, report.champion, "Round 1"))
    text = narrow.file.getvalue()  # type: ignore[attr-defined]
    assert text.count("inconclusive") == len(undecided), text
