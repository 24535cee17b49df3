"""The veto gate on a real SQLite ledger: auto, ask (the CLI's own terminal asker fed through
``CliRunner``'s input), and queue with its timeout rule (a clock the test advances; a person's
decision arrives as a real ledger write)."""

from __future__ import annotations

import getpass
import io
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from agents import ProposalContext, SweepProposer
from knobs import KnobSpace, catalog
from knobs.vocabulary import ProposalStatus
from ledger import Ledger, ProposalRecord
from orchestrator.approval import Answer, ApprovalGate, NobodyDeciding, llm_summary
from orchestrator.cli.round import _ask_at_terminal
from orchestrator.display import RoundDisplay
from orchestrator.errors import UsageError
from orchestrator.round import RoundOptions, RoundRunner
from orchestrator.testbed import NullSink
from tests.test_round_policy import ScriptedTestbed, profile

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))
CHAMPION = SPACE.default_config()
CONTEXT = ProposalContext(
    space=SPACE,
    champion=CHAMPION,
    champion_objective=1000.0,
    history=(),
    known_bad=(),
    decided_keys=frozenset({CHAMPION.key}),
    budget_left=3,
    seed=0,
)
NOTES = {
    "llm_model": "claude-sonnet-4-6",
    "llm_input_tokens": "1234",
    "llm_output_tokens": "210",
    "llm_cost_usd": "0.006852",
    "llm_round_spend_usd": "0.011352",
}


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield opened
    opened.close()


def pending(ledger: Ledger, knob: str = "num_speculative_tokens", new: int = 5) -> ProposalRecord:
    rnd = ledger.create_round(
        cluster="c",
        profile_name="p",
        profile_digest="d",
        budget=3,
        proposer="claude",
        approve="ask",
        seed=0,
    )
    return ledger.add_proposal(
        round_id=rnd.id,
        source="claude",
        knob=knob,
        old_value=CHAMPION[knob],
        new_value=new,
        champion_key=CHAMPION.key,
        hypothesis="[bold]K=5[/bold] verifies fewer rejected drafts",
        expected_effect="objective higher by about 3.5%",
        risk="low",
        estimated_cost="1 boot",
        notes=NOTES,
    )


def test_auto_approves_every_proposal(ledger: Ledger) -> None:
    decided = ApprovalGate(ledger, "auto").decide(pending(ledger), CONTEXT)
    assert (decided.status, decided.decided_by) == ("approved", "auto")


def ask(ledger: Ledger, answers: str) -> tuple[ProposalRecord, str]:
    """The gate in ask mode with the CLI's terminal asker, ``answers`` typed at its prompts."""
    screen = io.StringIO()
    console = Console(file=screen, width=200, color_system=None)
    gate = ApprovalGate(ledger, "ask", asker=_ask_at_terminal(console, RoundDisplay(console)))
    with CliRunner().isolation(input=answers) as (out, _err, _both):
        decided = gate.decide(pending(ledger), CONTEXT)
        prompts = out.getvalue().decode()
    return decided, screen.getvalue() + prompts


#: who a person at the prompt is, as the ledger records their decision
WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def test_ask_shows_the_proposal_and_approves(ledger: Ledger) -> None:
    decided, seen = ask(ledger, "approve\n")
    assert (decided.status, decided.decided_by, decided.new_value) == ("approved", WHO, 5)
    assert "Proposal 1 (claude): num_speculative_tokens 7 → 5" in seen
    # the hypothesis is data: rich markup in it is printed, not interpreted
    assert "hypothesis: [bold]K=5[/bold] verifies fewer rejected drafts" in seen
    assert "expected:   objective higher by about 3.5%" in seen
    assert "risk:       low" in seen
    assert "cost:       1 boot" in seen
    assert (
        "llm:        claude-sonnet-4-6: 1,234 in + 210 out tokens, $0.0069 (round $0.0114)" in seen
    )
    assert "approve, edit or veto [approve]:" in seen


def test_ask_edit_is_validated_again_until_it_is_allowed(ledger: Ledger) -> None:
    decided, seen = ask(ledger, "edit\n7; reboot\ne\n7\nedit\n4\n")
    assert (decided.status, decided.decided_by, decided.new_value) == (
        "approved",
        f"{WHO} (edited)",
        4,
    )
    assert "knob num_speculative_tokens: '7; reboot' is not an integer from 1 to 7" in seen
    assert "knob num_speculative_tokens: 7 is already the champion's value" in seen
    assert seen.count("new value for num_speculative_tokens:") == 3


def test_after_a_refused_edit_the_value_is_typed_again_at_once(ledger: Ledger) -> None:
    """The review's E2: after `edit` with a value refused, the prompt went back to `approve,
    edit or veto`, and the value typed there was `unknown answer '4'`. It now says a value is
    taken there, and takes it as the edit."""
    decided, seen = ask(ledger, "edit\n7; reboot\n4\n")
    assert (decided.status, decided.decided_by, decided.new_value) == (
        "approved",
        f"{WHO} (edited)",
        4,
    )
    assert "approve, edit or veto (or a new value for num_speculative_tokens)" in seen, seen
    assert "unknown answer" not in seen, seen


def test_ask_veto_records_the_reason(ledger: Ledger) -> None:
    decided, _ = ask(ledger, "veto\nK=5 wedged rank 2 last week\n")
    assert (decided.status, decided.decided_by, decided.reason) == (
        "vetoed",
        WHO,
        "K=5 wedged rank 2 last week",
    )
    assert ledger.proposal(decided.id).status == "vetoed"


def test_ask_refuses_an_unknown_answer_and_asks_again(ledger: Ledger) -> None:
    decided, seen = ask(ledger, "maybe\nv\nnot now\n")
    assert "unknown answer 'maybe': approve, edit or veto" in seen
    assert (decided.status, decided.reason) == ("vetoed", "not now")


class Clock:
    """Time that moves only when the gate sleeps. An action ``at`` a moment runs on the first
    clock read at or after it, or once a sleep has carried time past it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.actions: list[tuple[float, Callable[[], object]]] = []

    def __call__(self) -> float:
        self._run(lambda moment: moment <= self.now)
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self._run(lambda moment: moment < self.now)

    def at(self, moment: float, action: Callable[[], object]) -> None:
        self.actions.append((moment, action))

    def _run(self, due: Callable[[float], bool]) -> None:
        for entry in [a for a in self.actions if due(a[0])]:
            self.actions.remove(entry)
            entry[1]()


def queue(ledger: Ledger, clock: Clock, **kw: object) -> ApprovalGate:
    return ApprovalGate(
        ledger,
        "queue",
        poll_s=1.0,
        clock=clock,
        sleep=clock.sleep,
        **kw,  # type: ignore[arg-type]
    )


def test_queue_waits_for_a_person(ledger: Ledger) -> None:
    clock = Clock()
    p = pending(ledger)
    clock.at(
        40.0,
        lambda: ledger.decide_proposal(
            p.id, status=ProposalStatus.VETOED, by="person", reason="no"
        ),
    )
    decided = queue(ledger, clock).decide(p, CONTEXT)
    assert (decided.status, decided.decided_by, decided.reason) == ("vetoed", "person", "no")
    assert clock.now == 41.0  # read at the first poll after the decision


@pytest.mark.parametrize("action", ["veto", "approve"])
def test_the_queue_timeout_decides_as_the_profile_says(ledger: Ledger, action: str) -> None:
    clock = Clock()
    decided = queue(ledger, clock, queue_timeout_s=5.0, on_timeout=action).decide(
        pending(ledger), CONTEXT
    )
    assert decided.status == ("vetoed" if action == "veto" else "approved")
    assert decided.decided_by == "timeout"
    assert decided.reason == f"no decision within 5s (the profile's on_timeout: {action})"
    assert clock.now == 5.0


def test_a_decision_in_the_instant_of_the_timeout_wins(ledger: Ledger) -> None:
    clock = Clock()
    p = pending(ledger)
    # the person's write lands between the gate's last read and its timeout write
    clock.at(5.0, lambda: ledger.decide_proposal(p.id, status=ProposalStatus.APPROVED, by="person"))
    decided = queue(ledger, clock, queue_timeout_s=5.0).decide(p, CONTEXT)
    assert (decided.status, decided.decided_by) == ("approved", "person")


def test_timeout_vetoes_in_a_row_pause_the_round(ledger: Ledger) -> None:
    clock = Clock()
    gate = queue(ledger, clock, queue_timeout_s=5.0, max_timeouts=2)
    assert gate.decide(pending(ledger), CONTEXT).decided_by == "timeout"
    p = pending(ledger)
    clock.at(
        clock.now + 2,
        lambda: ledger.decide_proposal(p.id, status=ProposalStatus.APPROVED, by="person"),
    )
    assert gate.decide(p, CONTEXT).decided_by == "person"  # a person answered: count restarts
    assert gate.decide(pending(ledger), CONTEXT).decided_by == "timeout"
    with pytest.raises(NobodyDeciding) as caught:
        gate.decide(pending(ledger), CONTEXT)
    assert caught.value.exit_code == 130
    assert str(caught.value) == (
        "2 proposals in a row were vetoed by the queue's 5s timeout: nobody is deciding, so "
        "the round is paused; run the same command to resume once someone can decide (a "
        "change the timeout vetoed may be proposed again), or set the profile's "
        "approve.timeout_s longer or approve.on_timeout: approve"
    )
    # the last one the timeout vetoed, for the round to record before it stops
    assert caught.value.decided.status == ProposalStatus.VETOED
    assert ledger.proposals(status=ProposalStatus.PENDING) == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"mode": "vote"}, "--approve 'vote': use auto, ask or queue"),
        (
            {"mode": "ask"},
            "--approve ask needs a terminal to answer at, and stdin is none (nohup, cron, a "
            "service); use --approve queue and answer with `orchestrate proposals approve|veto "
            "ID`",
        ),
        ({"on_timeout": "shrug"}, "queue timeout action 'shrug': use veto or approve"),
        ({"queue_timeout_s": 0.0}, "queue timeout 0s: must be positive"),
        ({"max_timeouts": 0}, "max_timeouts 0: must be at least 1"),
    ],
)
def test_bad_gate_settings_are_usage_errors(
    ledger: Ledger, kw: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"mode": "queue", **kw}
    with pytest.raises(UsageError) as caught:
        ApprovalGate(ledger, **args)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_llm_summary_reads_the_notes() -> None:
    assert llm_summary({}) == ""
    assert llm_summary({**NOTES, "llm_fallback": "spend cap"}).endswith("; fell back: spend cap")


def test_a_vetoed_change_says_its_reason_once(tmp_path: Path) -> None:
    """The round's line for a veto at the prompt: who vetoed it and why, said once."""
    why = "K=5 wedged rank 2 last week"
    screen = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        runner = RoundRunner(
            profile(),
            ledger,
            NullSink(),
            ScriptedTestbed(lambda config, n: 100.0),
            SweepProposer([{"num_speculative_tokens": 5}]),
            ApprovalGate(ledger, "ask", asker=lambda p, problem: Answer("veto", None, why)),
            RoundDisplay(Console(file=screen, width=200)),
        )
        runner.run(RoundOptions(budget=1, proposer="sweep", approve="ask"))
    [line] = [line for line in screen.getvalue().splitlines() if "vetoed" in line]
    assert line.count(why) == 1 and line.count("vetoed") == 1, line
    # the proposal's number beside the experiment's: `proposals approve 2` is another change
    assert (
        line.strip() == f"#2 (proposal 1) num_speculative_tokens 7 → 5: vetoed by {WHO}: {why}"
    ), line


def test_an_edited_proposal_says_its_edit_and_a_vetoed_value_names_its_veto(
    tmp_path: Path,
) -> None:
    """A person vetoes K=5, then edits the next proposal (K=3) to 5: refused, naming the veto,
    its reason and `orchestrate known-bad clear`; then to 4. The experiment is described as
    edited, from the value proposed, and the proposer's hypothesis is kept, marked as about
    the value it proposed."""
    why = "too risky tonight"
    answers = iter([Answer("veto", None, why), Answer("edit", "5"), Answer("edit", "4")])
    problems: list[str | None] = []

    def asker(p: ProposalRecord, problem: str | None) -> Answer:
        problems.append(problem)
        return next(answers)

    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        runner = RoundRunner(
            profile(),
            ledger,
            NullSink(),
            ScriptedTestbed(lambda config, n: 100.0),
            SweepProposer([{"num_speculative_tokens": 5}, {"num_speculative_tokens": 3}]),
            ApprovalGate(ledger, "ask", asker=asker),
            RoundDisplay(Console(file=io.StringIO(), width=200)),
        )
        runner.run(RoundOptions(budget=1, proposer="sweep", approve="ask"))
        vetoed, edited = ledger.experiments()[1:3]
        proposal = ledger.proposal(edited.proposal_id or 0)
    assert problems[2] == (
        f"num_speculative_tokens 7 → 5 was vetoed under this champion (experiment "
        f"#{vetoed.id}: {why}); `orchestrate known-bad clear {vetoed.id} --reason TEXT` lets "
        "it run again"
    ), problems
    assert edited.description == "num_speculative_tokens 7 → 4 (sweep, edited by person from 3)"
    assert proposal.hypothesis.startswith(
        "edited by a person from 3 to 4; the proposer's hypothesis, about 3: "
        "num_speculative_tokens 7 → 3"
    ), proposal.hypothesis
