"""The human veto end to end on the four-node twin: ``--approve queue`` decided from a second
process while the round waits, the queue's timeout rule, and ``--approve ask`` answered at a
pseudo-terminal. Every veto is a ``vetoed`` row (no boot), an MLflow tag, and a constraint the
next proposal sees."""

from __future__ import annotations

import csv
import fcntl
import getpass
import io
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from mlflow.tracking import MlflowClient

from knobs.vocabulary import ProposalStatus
from ledger import Ledger, ProposalRecord
from orchestrator.profile import load_profile
from orchestrator.report.data import collect
from orchestrator.report.data import summary as report_summary
from tests.fixtures.cli import ORCHESTRATE, orchestrate
from tests.fixtures.messages_api import MessagesApi, tool_use
from tests.fixtures.profiles import fast_profile, small_fast_profile
from tests.fixtures.wait import wait_until

T = TypeVar("T")


@pytest.fixture
def workdir(cli_workdir: Path) -> Path:
    return cli_workdir


def wait_for(what: str, probe: Callable[[], T | None], proc: subprocess.Popen[Any]) -> T:
    """``probe()`` once it is not None; fails if the round exits first or after two minutes."""

    def found() -> T | None:
        value = probe()
        if value is None:
            assert proc.poll() is None, f"the round exited ({proc.returncode}) before {what}"
        return value

    value = wait_until(what, found, 120, interval=0.1)
    assert value is not None
    return value


def pending_proposal(workdir: Path, after: int = 0) -> Callable[[], ProposalRecord | None]:
    def probe() -> ProposalRecord | None:
        if not (workdir / "orchestrate.db").exists():
            return None
        ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
        try:
            waiting = [p for p in ledger.proposals(status=ProposalStatus.PENDING) if p.id > after]
        finally:
            ledger.close()
        return waiting[0] if waiting else None

    return probe


def results(workdir: Path) -> list[dict[str, str]]:
    exported = orchestrate(workdir, "export", "-", "--profile", "profile.yaml")
    assert exported.returncode == 0, exported.stderr
    return list(csv.DictReader(io.StringIO(exported.stdout), delimiter="\t"))


def good(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "knob": "num_speculative_tokens",
        "value": 5,
        "hypothesis": "K=5 drafts fewer rejected tokens.",
        "expected_direction": "higher",
        "expected_size_pct": 3.0,
        "risk": "low",
        "estimated_cost": "1 boot",
    }
    data.update(fields)
    return data


def test_queue_waits_while_another_process_vetoes_then_approves(
    workdir: Path, messages_api: MessagesApi
) -> None:
    fast_profile(
        workdir,
        proposer={"kind": "claude", "claude": {"api_retries": 0}},
        approve={"mode": "queue"},
    )
    messages_api.script(
        tool_use(good()),
        tool_use(good(knob="max_num_batched_tokens", value=8192, hypothesis="MNBT 8192.")),
    )
    log = (workdir / "round.log").open("w")
    proc = subprocess.Popen(
        [*ORCHESTRATE, "round", "--budget", "1", "--profile", "profile.yaml", "--json"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        first = wait_for("a pending proposal", pending_proposal(workdir), proc)
        assert (first.knob, first.new_value, first.source) == (
            "num_speculative_tokens",
            5,
            "claude",
        )
        listed = orchestrate(workdir, "proposals", "list", "--profile", "profile.yaml", "--json")
        assert listed.returncode == 0, listed.stderr
        [shown] = json.loads(listed.stdout)
        assert (shown["id"], shown["status"], shown["hypothesis"]) == (
            first.id,
            "pending",
            "K=5 drafts fewer rejected tokens.",
        )
        assert shown["notes"]["llm_cost_usd"] == "0.004500"
        # `status` while the round waits: it runs (no resume, no `cluster down` to suggest:
        # both are refused while it holds the lease), and the proposal it waits on is named
        # with the commands that decide it
        now = orchestrate(workdir, "status", "--profile", "profile.yaml")
        assert now.returncode == 0, now.stderr
        said = " ".join(now.stdout.split())
        assert "round 1 running: 0 of 1 done," in said and " (held by " in said, said
        assert "to resume" not in said and "cluster down" not in said, said
        assert (
            f"proposal {first.id} of round 1 waits for a person: num_speculative_tokens "
            f"7 → 5 (claude); decide with `orchestrate proposals approve {first.id} --profile "
            f"profile.yaml` or `orchestrate proposals veto {first.id} --reason TEXT --profile "
            "profile.yaml`"
        ) in said, said
        data = orchestrate(workdir, "status", "--profile", "profile.yaml", "--json")
        assert data.returncode == 0, data.stderr
        state = json.loads(data.stdout)
        assert state["running_round"]["live"] is True and state["lease"]["held"] is True
        [waiting] = state["pending_proposals"]
        assert (waiting["proposal"], waiting["round"], waiting["source"]) == (first.id, 1, "claude")
        assert (
            waiting["approve"] == f"orchestrate proposals approve {first.id} --profile profile.yaml"
        )
        reason = "K=5 wedged rank 2 last week"
        veto = orchestrate(
            workdir, "proposals", "veto", str(first.id), "--reason", reason, "-p", "profile.yaml"
        )
        assert veto.returncode == 0, veto.stderr
        assert veto.stdout == f"vetoed proposal {first.id}: num_speculative_tokens 7 → 5\n"

        second = wait_for("the next proposal", pending_proposal(workdir, first.id), proc)
        assert (second.knob, second.new_value) == ("max_num_batched_tokens", 8192)
        approve = orchestrate(workdir, "proposals", "approve", str(second.id), "-p", "profile.yaml")
        assert approve.returncode == 0, approve.stderr
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # a failed wait leaves the pipe unread
        log.close()
    assert proc.returncode == 0, (workdir / "round.log").read_text()
    # the round's terminal names each proposal it waits on, its change and the commands that
    # decide it, once
    said = " ".join((workdir / "round.log").read_text().split())
    for p, change in ((first, "num_speculative_tokens 7 → 5"), (second, "max_num_batched_tokens")):
        line = f"proposal {p.id} of round 1 waits for a person: {change}"
        assert said.count(line) == 1, said
        assert said.count(f"`orchestrate proposals veto {p.id} --reason TEXT --profile ") == 1
    report = json.loads(out)
    assert [(e["kind"], e["status"]) for e in report["experiments"]][:2] == [
        ("baseline", "keep"),
        ("candidate", "vetoed"),
    ]
    vetoed = report["experiments"][1]
    assert (vetoed["knob"], vetoed["value"]) == ("num_speculative_tokens", 5)
    assert report["experiments"][2]["knob"] == "max_num_batched_tokens"

    # the veto cost no boot, is a row of results.tsv and a tag in MLflow; the ledger says who
    # decided each (a team shares a ledger: whose veto bars the value?)
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        assert ledger.boots(vetoed["experiment"]) == []
        who = f"{getpass.getuser()}@{socket.gethostname()}"
        assert [ledger.proposal(p.id).decided_by for p in (first, second)] == [who, who]
    finally:
        ledger.close()
    rows = results(workdir)
    [row] = [r for r in rows if r["status"] == "vetoed"]
    assert (row["knob"], row["value"]) == ("num_speculative_tokens", "5")
    assert reason in row["description"]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(vetoed["mlflow_run_id"])
    # a person's decision, not a failure: FINISHED (MLflow's UI shows KILLED as a kill)
    assert (run.info.status, run.data.tags["status"]) == ("FINISHED", "vetoed")
    assert run.data.tags["veto_reason"] == reason

    # the next proposal was made knowing the veto
    later = messages_api.requests[1].texts()
    section = later[later.index("Vetoed by a person") :]
    assert "num_speculative_tokens=5" in section.split("##")[0]


def test_the_queue_timeout_vetoes_then_pauses_and_the_round_resumes(workdir: Path) -> None:
    small_fast_profile(
        workdir,
        proposer={
            "kind": "sweep",
            "sweep": [
                {"num_speculative_tokens": 5},
                {"max_num_batched_tokens": 8192},
                {"cuda_graphs": True},
            ],
        },
        approve={"mode": "queue", "timeout_s": 0.2, "on_timeout": "veto", "max_timeouts": 2},
    )
    paused = orchestrate(workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert paused.returncode == 130, paused.stderr
    assert paused.stderr.endswith(
        "Error: 2 proposals in a row were vetoed by the queue's 0.2s timeout: nobody is "
        "deciding, so the round is paused; run the same command to resume once someone can "
        "decide (a change the timeout vetoed may be proposed again), or set the profile's "
        "approve.timeout_s longer or approve.on_timeout: approve\n"
    )
    # both timeouts are rows before the round resumes (the second was only recorded by the
    # resume): results.tsv has them as they are
    why = "no decision within 0.2s (the profile's on_timeout: veto)"
    rows = results(workdir)
    told = [(r["status"], r["knob"], r["description"].partition(" vetoed ")[2]) for r in rows]
    assert told[1:] == [
        ("vetoed", "num_speculative_tokens", f"by timeout: {why}"),
        ("vetoed", "max_num_batched_tokens", f"by timeout: {why}"),
    ]  # fmt: skip
    # and nobody judged them: they bar nothing (known-bad listed them, under every champion,
    # as a person's veto)
    known = orchestrate(workdir, "known-bad", "list", "--profile", "profile.yaml")
    assert known.returncode == 0, known.stderr
    assert "timeout" not in known.stdout and "vetoed" not in known.stdout, known.stdout
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        decided = [(p.knob, p.status, p.decided_by, p.reason) for p in ledger.proposals()]
        skipped = ledger.proposals()[1].notes.get("skipped")
        assert ledger.unfinished_round("twin-local") is not None
    finally:
        ledger.close()
    assert decided == [
        ("num_speculative_tokens", "vetoed", "timeout", why),
        ("max_num_batched_tokens", "vetoed", "timeout", why),
    ]
    # the sweep's second proposal passed over the first entry for the rest of the sitting, and
    # said why (it had counted the timeout's veto as the entry done, for good)
    assert skipped == (
        "entry 1 (num_speculative_tokens=5): num_speculative_tokens 7 → 5 was vetoed under "
        "this champion by the queue's timeout (experiment #2: nobody decided it); it may be "
        "proposed again once the round resumes"
    )
    # the report as far as it got counts as the budget does: the vetoes are not experiments
    # done (it said "running, 2 of 1 experiments decided", and that the round "ended")
    page = workdir / "reports" / "round-1" / "report.html"
    html = " ".join(page.read_text().split())
    summary = html[html.index("<h1>") : html.index("<h2>")]
    # stopped (exit 130, nobody deciding) and not gone on since: the page's first line says so
    assert "(open: the same command resumes it; see below), 0 of 1 experiments done (2 vetoed " \
        "besides)," in summary, summary  # fmt: skip
    assert "The round ended with" not in html
    assert "The champion is still the one the round started from (the round is not over)." in html
    shown = orchestrate(workdir, "status", "--profile", "profile.yaml", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["running_round"]["done"] == 0

    resumed = orchestrate(
        workdir, "round", "--budget", "1", "--approve", "auto", "--profile", "profile.yaml"
    )
    assert resumed.returncode == 0, resumed.stderr
    rows = results(workdir)
    assert [(r["status"], r["knob"]) for r in rows][:3] == [
        ("keep", "-"),
        ("vetoed", "num_speculative_tokens"),
        ("vetoed", "max_num_batched_tokens"),
    ]
    # nobody judged the first entry: the resumed round offers it again, as the Optuna and
    # Claude proposers would (the sweep counted it as done and went on to cuda_graphs)
    assert (rows[3]["knob"], rows[3]["value"]) == ("num_speculative_tokens", "5")
    assert rows[3]["status"] != "vetoed"
    assert len(rows) == 4
    html = " ".join(page.read_text().split())
    summary = html[html.index("<h1>") : html.index("<h2>")]
    assert "done, 1 of 1 experiments done (2 vetoed besides)," in summary, summary
    # and so does the round's parent run in MLflow (its "experiments" counted the vetoes)
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        prof = load_profile(str(workdir / "profile.yaml"), base_dir=workdir)
        numbers = report_summary(collect(prof, ledger, 1))
        parent = ledger.round(1).mlflow_run_id
        children = [e.mlflow_run_id for e in ledger.experiments(round_id=1)]
    assert (numbers["experiments"], numbers["vetoed"], numbers["vetoed_by_timeout"]) == (1, 2, 2)
    # as MLflow has them: the parent's counts, and each veto's run ended FINISHED, not KILLED
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    assert parent is not None
    logged = client.get_run(parent).data.metrics
    assert (logged["experiments"], logged["vetoed"], logged["vetoed_by_timeout"]) == (1, 2, 2)
    ended = [client.get_run(c) for c in children if c is not None]
    assert [(r.data.tags["status"], r.info.status) for r in ended][1:3] == [
        ("vetoed", "FINISHED"),
        ("vetoed", "FINISHED"),
    ]


def test_a_change_the_queue_timeout_vetoed_is_proposed_again_once_the_round_resumes(
    workdir: Path,
) -> None:
    # the champion's neighbours in order: the first one is the first change proposed
    fast_profile(
        workdir,
        proposer={"kind": "sweep"},
        approve={"mode": "queue", "timeout_s": 0.2, "on_timeout": "veto", "max_timeouts": 1},
    )
    paused = orchestrate(workdir, "round", "--budget", "1", "--profile", "profile.yaml")
    assert paused.returncode == 130, paused.stderr
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        [timed_out] = ledger.proposals()
    assert timed_out.decided_by == "timeout"
    # nobody judged it: it bars no value (it was a known-bad region under every champion)
    known = orchestrate(workdir, "known-bad", "list", "--profile", "profile.yaml")
    assert known.returncode == 0, known.stderr
    assert "no decision within" not in known.stdout, known.stdout
    # the person is back: the change is offered again (it was held under this champion, so
    # the knobs that matter most, proposed first, were gone from every round after)
    resumed = orchestrate(
        workdir, "round", "--budget", "1", "--approve", "auto", "--profile", "profile.yaml"
    )
    assert resumed.returncode == 0, resumed.stderr
    with Ledger(os.environ["ORCHESTRATE_LEDGER"]) as ledger:
        last = ledger.proposals()[-1]
        run = [e for e in ledger.experiments(round_id=1) if e.proposal_id == last.id]
    assert (last.knob, last.new_value, last.status) == (
        timed_out.knob,
        timed_out.new_value,
        ProposalStatus.APPROVED,
    )
    assert len(run) == 1 and run[0].status != "vetoed"


def test_a_bare_resume_runs_the_round_as_it_started_and_a_flag_given_runs_it_its_way(
    workdir: Path,
) -> None:
    """A round started with ``--approve queue --proposer optuna --seed 3`` and killed before
    its baseline: the resume a timer (or the line ``status`` prints) runs, a bare
    ``orchestrate round``, goes on with the queue, Optuna and seed 3, as it says. Before, it
    said it kept them and ran the profile's instead (here: auto, sweep), so the change booted
    with nobody asked. A flag the resume gives runs it its way, and says so."""
    fast_profile(
        workdir,
        proposer={"kind": "sweep", "sweep": [{"num_speculative_tokens": 5}]},
        approve={"mode": "auto", "timeout_s": 0.2, "on_timeout": "veto", "max_timeouts": 1},
    )
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        started = ledger.create_round(
            cluster="twin-local",
            profile_name="twin",
            profile_digest="",
            budget=1,
            proposer="optuna",
            approve="queue",
            seed=3,
        )
    finally:
        ledger.close()
    bare = orchestrate(workdir, "round", "--profile", "profile.yaml")
    # the queue's timeout vetoed Optuna's change, and the round paused: nobody is deciding
    assert bare.returncode == 130, bare.stderr
    assert "1 proposals in a row were vetoed by the queue's 0.2s timeout" in bare.stderr
    said = " ".join(bare.stdout.split())
    assert "proposer optuna, approve queue" in said, said
    assert "started with" not in said, said  # nothing differs from how it started
    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        [(source, status, by)] = [(p.source, p.status, p.decided_by) for p in ledger.proposals()]
    finally:
        ledger.close()
    assert (source, status, by) == ("optuna", ProposalStatus.VETOED, "timeout")
    # a person gets it going: this resume's own approval and proposer run it, and it says so
    flagged = orchestrate(
        workdir, "round", "--approve", "auto", "--proposer", "sweep", "--profile", "profile.yaml"
    )
    assert flagged.returncode == 0, flagged.stderr
    said = " ".join(flagged.stdout.split())
    assert (
        f"round {started.id} started with approval queue; this command's auto runs it from "
        "here (a resume without it goes on with queue)"
    ) in said, said
    assert f"round {started.id} started with proposer optuna; this command's sweep" in said
    # the mode in force is said: the resume's, not the round's as it started (it said
    # "approve queue" and "waiting for approval (queue)" while the auto gate approved)
    assert f"resuming round {started.id} on twin-local" in said, said
    assert "proposer sweep, approve auto" in said, said
    assert "waiting for approval (auto)" in said and "waiting for approval (queue)" not in said
    # the report says what it started with, and what the resume ran it with
    html = " ".join((workdir / "reports" / "round-1" / "report.html").read_text().split())
    summary = html[html.index("<h1>") : html.index("<h2>")]
    assert "proposer optuna (resumed with sweep), approval queue (resumed with auto)," in summary

    rows = results(workdir)
    assert [(r["status"], r["knob"]) for r in rows][1:] == [
        ("vetoed", rows[1]["knob"]),
        (rows[2]["status"], "num_speculative_tokens"),
    ]
    assert rows[2]["status"] != "vetoed"


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[=>]|\r")


class Terminal:
    """A process on a pseudo-terminal: ``expect`` what it shows, ``send`` what a person types."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color"}
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True
        )
        os.close(slave)
        self.master = master
        self.screen = ""
        self._at = 0

    def expect(self, text: str, timeout: float = 120) -> None:
        """Wait until ``text`` appears after what was matched last."""
        deadline = time.monotonic() + timeout
        while (found := self.screen.find(text, self._at)) < 0:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} on the terminal; it shows:\n{self.screen[-3000:]}"
            assert self._read(min(left, 1.0)), f"ended before {text!r}:\n{self.screen[-3000:]}"
        self._at = found + len(text)

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def finish(self, timeout: float = 180) -> int:
        """Read to the end; the exit code."""
        deadline = time.monotonic() + timeout
        while self._read(1.0):
            assert time.monotonic() < deadline, f"still running:\n{self.screen[-3000:]}"
        return self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)

    def _read(self, wait: float) -> bool:
        """Read what is there (waiting up to ``wait``); False once the process has ended."""
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return self.proc.poll() is None
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the other side is closed
            return False
        if not chunk:
            return False
        self.screen += _ANSI.sub("", chunk.decode(errors="replace"))
        return True


#: who a person deciding here is, as the ledger records it
WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def test_ask_at_a_terminal_vetoes_approves_and_edits(workdir: Path) -> None:
    small_fast_profile(
        workdir,
        proposer={
            "kind": "sweep",
            "sweep": [
                {"num_speculative_tokens": 5},
                {"cuda_graphs": True},
                {"max_num_batched_tokens": 8192},
            ],
        },
        approve={"mode": "ask"},
    )
    term = Terminal([*ORCHESTRATE, "round", "--budget", "2", "--profile", "profile.yaml"], workdir)
    try:
        term.expect("Proposal 1 (sweep): num_speculative_tokens 7 → 5")
        term.expect("hypothesis: num_speculative_tokens 7 → 5: entry 1 of the 3")
        term.expect("approve, edit or veto [approve]:")
        term.send("veto")
        term.expect("reason:")
        term.send("K=5 wedged rank 2 last week")

        term.expect("Proposal 2 (sweep): cuda_graphs false → true")
        term.expect("approve, edit or veto [approve]:")
        term.send("")  # the default: approve

        term.expect("Proposal 3 (sweep): max_num_batched_tokens 7168 → 8192")
        term.expect("approve, edit or veto [approve]:")
        term.send("edit")
        term.expect("new value for max_num_batched_tokens:")
        term.send("7; reboot")
        term.expect("'7; reboot' is not an integer from 2048 to 16384 in steps of 512")
        # after a refused value the prompt takes a value too; `e` still asks for it
        term.expect("approve, edit or veto (or a new value for max_num_batched_tokens) [approve]:")
        term.send("e")
        term.expect("new value for max_num_batched_tokens:")
        term.send("8704")
        assert term.finish() == 0, term.screen[-3000:]
    finally:
        term.close()

    ledger = Ledger(os.environ["ORCHESTRATE_LEDGER"])
    try:
        decided = [
            (p.knob, p.new_value, p.status, p.decided_by, p.reason) for p in ledger.proposals()
        ]
    finally:
        ledger.close()
    assert decided == [
        ("num_speculative_tokens", 5, "vetoed", WHO, "K=5 wedged rank 2 last week"),
        ("cuda_graphs", True, "approved", WHO, None),
        ("max_num_batched_tokens", 8704, "approved", f"{WHO} (edited)", None),
    ]
    rows = results(workdir)
    assert [(r["knob"], r["value"]) for r in rows[1:]] == [
        ("num_speculative_tokens", "5"),
        ("cuda_graphs", "true"),
        ("max_num_batched_tokens", "8704"),
    ]
    assert rows[1]["status"] == "vetoed"
