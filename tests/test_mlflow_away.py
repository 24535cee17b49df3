"""MLflow that stops answering mid-round is the infrastructure's fault, never the night's end:
the round goes on with the ledger as its record, says so once, and fills MLflow in from the
ledger when it answers again; a round that ends while it is still away stays open, and the
same command fills MLflow in and closes it. The tracking server is a real ``mlflow server``
that the test pauses (SIGSTOP: its requests time out) and lets go on (SIGCONT); the testbed is
scripted (the real loop, ledger, verdict and MLflow sink run unchanged)."""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from agents import SweepProposer
from knobs.config import Config
from knobs.vocabulary import RoundStatus, State
from ledger import Ledger, MlflowSinkError
from ledger.mlflow_sink import MlflowSink, mlflow_experiment
from orchestrator.approval import ApprovalGate
from orchestrator.display import RoundDisplay
from orchestrator.mirror import Mirror
from orchestrator.outages import mlflow_reached, through_ledger_outages, waiting_for_mlflow
from orchestrator.round import RoundOptions, RoundReport, RoundRunner
from tests.fixtures.cli import orchestrate, said_until
from tests.fixtures.mlflow_store import MlflowServer
from tests.fixtures.partition import BOUNDS, FarPostgres, connections_made
from tests.test_ledger_outage import bring_back, take_away
from tests.test_round_policy import ScriptedTestbed, profile

CHANGES = [{"num_speculative_tokens": k} for k in (5, 6, 2, 3)]
ENDED = {"crash": "FAILED", "vetoed": "KILLED"}
SECRET = "hf_NotForTheLedger42"  # in every engine log; the environment names it a secret


class Outage(ScriptedTestbed):
    """K=5 serves 130 tok/s, the rest 100; ``on_deploy(n)`` runs as deploy n begins. Each
    boot's launcher and engine log say which boot they are of."""

    def __init__(self, on_deploy: Callable[[int], None]) -> None:
        super().__init__(lambda c, n: 130.0 if c["num_speculative_tokens"] == 5 else 100.0)
        self.on_deploy = on_deploy

    def deploy(self, config: Config) -> dict[int, str]:
        self.on_deploy(len(self.boots) + 1)
        super().deploy(config)
        return {0: f"#!/bin/sh\n# boot {len(self.boots)}\n"}

    def logs(self) -> dict[int, str]:
        return {0: f"engine log of boot {len(self.boots)}, token {SECRET}\n"}


class BothAway(Outage):
    """``Outage``, and the ledger at ``pg_url`` taken away as boot 3 comes up: the boot is up,
    and recording it finds the ledger gone."""

    def __init__(self, on_deploy: Callable[[int], None], pg_url: str) -> None:
        super().__init__(on_deploy)
        self.pg_url = pg_url

    def deploy(self, config: Config) -> dict[int, str]:
        launchers = super().deploy(config)
        if len(self.boots) == 3:
            take_away(self.pg_url)
        return launchers


@pytest.fixture
def impatient(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's HTTP client gives up on a silent server after 6 s, without retries (a server
    that answers takes well under that, even on a loaded machine: at 2 s, one answering
    server's first call timed out under a load average of 11); the engine logs' token is a
    secret of the environment."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "6")
    monkeypatch.setenv("HF_TOKEN", SECRET)


def _sink(server: MlflowServer) -> MlflowSink:
    return MlflowSink(server.url, experiment_name=mlflow_experiment(profile().cluster.name))


def _round(
    ledger: Ledger,
    server: MlflowServer,
    testbed: Outage,
    said: io.StringIO,
    sink: MlflowSink | None = None,
) -> RoundReport:
    """A round of ``CHANGES``; ``sink``: the command's, opened once at its start (as the CLI
    does), else opened now."""
    prof = profile()
    sink = sink or _sink(server)
    return RoundRunner(
        prof,
        ledger,
        sink,
        testbed,
        SweepProposer(CHANGES),
        ApprovalGate(ledger, "auto"),
        RoundDisplay(Console(file=said, width=400)),
        mlflow_retry_s=0.0,  # try MLflow again at every experiment
    ).run(RoundOptions(budget=len(CHANGES), proposer="sweep", approve="auto"))


def _assert_mlflow_has_every_verdict(ledger: Ledger, server: MlflowServer) -> None:
    client = MlflowClient(server.url)
    experiments = ledger.experiments()
    assert experiments and all(e.state == State.DECIDED for e in experiments)
    for e in experiments:
        assert e.mlflow_run_id is not None, f"experiment {e.id} has no MLflow run"
        run = client.get_run(e.mlflow_run_id)
        assert run.data.tags.get("status") == e.status, (e.id, run.data.tags)
        assert run.info.status == ENDED.get(str(e.status), "FINISHED"), (e.id, run.info.status)
        assert run.data.tags.get("experiment") == str(e.id)


def _assert_mlflow_has_every_boot_text(ledger: Ledger, server: MlflowServer, into: Path) -> None:
    """Every boot's engine log on its experiment's run, redacted, and every booted
    experiment's launcher; nothing left held in the ledger."""
    client = MlflowClient(server.url)
    boots = 0
    for e in ledger.experiments():
        assert e.mlflow_run_id is not None
        run_id = e.mlflow_run_id
        for b in ledger.boots(e.id):
            boots += 1
            path = f"logs/boot-{b.id}/node-0.log"
            log = Path(client.download_artifacts(run_id, path, str(into))).read_text()
            assert log.startswith("engine log of boot ") and SECRET not in log, (e.id, log)
        if ledger.boots(e.id):
            launcher = client.download_artifacts(run_id, "launchers/node-0.sh", str(into))
            assert Path(launcher).read_text().startswith("#!/bin/sh\n# boot ")
    assert boots > 0
    assert ledger.holding("scripted") == []


def test_mlflow_away_mid_round_is_filled_in_when_it_answers(
    tmp_path: Path, mlflow_server: MlflowServer, impatient: None
) -> None:
    def outage(n: int) -> None:
        if n == 3:  # the first candidate's second boot: MLflow goes away
            mlflow_server.pause()
        if n == 7:  # some boots later it is back
            mlflow_server.resume()

    testbed = Outage(outage)
    said = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        report = _round(ledger, mlflow_server, testbed, said)
        assert len(testbed.boots) > 7, "the outage must end inside the round"
        # the round went to its budget, every verdict the config's: none is a crash
        assert report.stopped_by == "budget"
        assert ledger.round(report.round.id).status == RoundStatus.DONE
        assert len([e for e in report.experiments if e.kind == "candidate"]) == len(CHANGES)
        assert not [e for e in report.experiments if e.status == "crash"]
        assert "keep" in {e.status for e in report.experiments}
        text = said.getvalue()
        assert text.count("MLflow stopped answering") == 1, text
        assert text.count("MLflow answers again") == 1, text
        _assert_mlflow_has_every_verdict(ledger, mlflow_server)
        # the launchers and engine logs of the boots MLflow missed, held in the ledger and
        # given to it when it answered
        _assert_mlflow_has_every_boot_text(ledger, mlflow_server, tmp_path / "artifacts")
        parent = MlflowClient(mlflow_server.url).get_run(report.round.mlflow_run_id or "")
        assert parent.info.status == "FINISHED"


@pytest.mark.timeout(480)
def test_a_tracking_server_silent_mid_round_holds_one_call_briefly_then_the_round_goes_on(
    tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracking server that goes silent mid-round (it takes connections and never answers)
    under MLflow's HTTP settings as a user has them, with a request timeout of 5 s
    (``MLFLOW_HTTP_REQUEST_TIMEOUT``; orchestrate's own 30 s and 10 s reach MLflow as
    tests/test_mlflow_http_scope.py shows): the call that finds it silent holds the round for
    its two retries (orchestrate's 30 s a request: about a minute and a half; MLflow's own
    held it about 20 minutes, and again at each later try), and every later try of whether it
    is back is one request, so the boots go on at their pace; MLflow, back, is filled in."""
    for name in [k for k in os.environ if k.startswith("MLFLOW_HTTP_REQUEST_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    booted: list[float] = []

    def outage(n: int) -> None:
        booted.append(time.monotonic())
        if n == 3:
            mlflow_server.pause()
        if n == 7:
            mlflow_server.resume_answered()
            booted.append(time.monotonic())  # the wait for /health is not the round's

    testbed = Outage(outage)
    said = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        report = _round(ledger, mlflow_server, testbed, said)
        assert report.stopped_by == "budget"
        # boots 3 to 7 while MLflow is silent, a try of it before each experiment's first
        gaps = [later - earlier for earlier, later in itertools.pairwise(booted[2:7])]
        # boot 3's texts: the call that found it silent, three requests of 5 s and 4 s of
        # backoff (MLflow's own retries: minutes)
        assert 10.0 <= gaps[0] < 60.0, gaps
        assert all(gap < 15.0 for gap in gaps[1:]), gaps  # then at boot pace: one request
        text = said.getvalue()
        assert text.count("MLflow stopped answering") == 1, text
        assert text.count("MLflow answers again") == 1, text
        _assert_mlflow_has_every_verdict(ledger, mlflow_server)
        _assert_mlflow_has_every_boot_text(ledger, mlflow_server, tmp_path / "artifacts")
    assert [k for k in os.environ if k.startswith("MLFLOW_HTTP_REQUEST_")] == [
        "MLFLOW_HTTP_REQUEST_TIMEOUT"
    ], "a call's bound outlived it"


@pytest.mark.timeout(300)
def test_an_mlflow_store_on_postgresql_cut_off_mid_round_fails_its_call_within_a_minute(
    far_postgres: FarPostgres, tmp_path: Path
) -> None:
    """MLflow's store on PostgreSQL (no tracking server): its connections are made with the
    ledger's bounds on a server that falls silent (read back from them), so a partition that
    takes the database's host away mid-round fails MLflow's call within about a minute (the
    round goes on without MLflow: ``orchestrator.mirror``), where it waited for the kernel's
    retransmissions, about 15 minutes; and with the link back MLflow answers again."""
    made: list[dict[str, str]] = []
    with connections_made(made):
        sink = MlflowSink(
            far_postgres.url, experiment_name="orchestrate/cut", artifact_root=tmp_path / "art"
        )
        run_id = sink.start_round(round_id=1, cluster="cut", params={"budget": "4"})
    assert made and all({k: c[k] for k in BOUNDS} == BOUNDS for c in made), made
    far_postgres.cut()
    started = time.monotonic()
    try:
        with pytest.raises(MlflowSinkError) as away:
            sink.set_tags(run_id, {"status": "keep"})
        took = time.monotonic() - started
    finally:
        far_postgres.mend()
    assert took < 75.0, away.value.message
    assert away.value.unreachable, away.value.message  # an outage, not a refusal
    sink.set_tags(run_id, {"status": "keep"})
    state = sink.run_state(run_id)
    assert state is not None and state.tags["status"] == "keep"


def test_a_round_that_ends_with_mlflow_away_stays_open_and_the_same_command_closes_it(
    tmp_path: Path, mlflow_server: MlflowServer, impatient: None
) -> None:
    def outage(n: int) -> None:
        if n == 3:  # away for the rest of the round
            mlflow_server.pause()

    said = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        with pytest.raises(MlflowSinkError, match="the round stays open") as away:
            _round(ledger, mlflow_server, Outage(outage), said)
        assert "run the same command when MLflow answers" in away.value.message
        # every experiment decided and recorded; the round open until MLflow has them too
        [rnd] = ledger.rounds("scripted")
        assert rnd.status == RoundStatus.RUNNING
        assert len([e for e in ledger.experiments() if e.kind == "candidate"]) == len(CHANGES)
        assert all(e.state == State.DECIDED for e in ledger.experiments())
        # the boots' texts that only MLflow keeps are held in the ledger, without the secret
        held = [h for i in ledger.holding("scripted") for h in ledger.held_texts(i)]
        assert any(h.path.startswith("logs/boot-") for h in held), held
        assert all(SECRET not in h.text for h in held)
        mlflow_server.resume_answered()
        again = Outage(lambda n: None)
        report = _round(ledger, mlflow_server, again, io.StringIO())
        assert report.resumed and report.round.id == rnd.id
        assert ledger.round(rnd.id).status == RoundStatus.DONE
        assert again.boots == [], "closing the round boots nothing"
        _assert_mlflow_has_every_verdict(ledger, mlflow_server)
        _assert_mlflow_has_every_boot_text(ledger, mlflow_server, tmp_path / "artifacts")


def test_a_boot_whose_logs_find_mlflow_and_the_ledger_away_is_torn_down_first(
    tmp_path: Path, mlflow_server: MlflowServer, pg_url: str, impatient: None
) -> None:
    """Boot 3 comes up as MLflow and the ledger both go away: recording it fails, and so does
    keeping its engine log (MLflow does not take it, the ledger cannot hold it). Its engines
    are stopped before the round waits for the ledger (none runs through the wait), and the
    round resumes to its budget when both are back."""
    engines_up_in_waits: list[bool] = []

    def away(n: int) -> None:
        if n == 3:
            mlflow_server.pause()

    testbed = BothAway(away, pg_url)

    def wait(_seconds: float) -> None:
        engines_up_in_waits.append(testbed._current is not None)
        bring_back(pg_url)
        mlflow_server.resume()

    said = io.StringIO()
    sink = _sink(mlflow_server)
    with Ledger(pg_url) as ledger:
        try:
            report = through_ledger_outages(
                lambda: _round(ledger, mlflow_server, testbed, said, sink),
                note=lambda line: print(line, file=said),
                sleep=wait,
            )
        finally:
            bring_back(pg_url)
            mlflow_server.resume()
        assert engines_up_in_waits == [False], said.getvalue()
        assert report.resumed and report.stopped_by == "budget"
        assert ledger.round(report.round.id).status == RoundStatus.DONE
        assert not [e for e in ledger.experiments() if e.status == "crash"]
        _assert_mlflow_has_every_verdict(ledger, mlflow_server)


def test_a_round_resumed_after_the_ledger_came_back_goes_on_while_mlflow_is_still_away(
    tmp_path: Path, mlflow_server: MlflowServer, pg_url: str, impatient: None
) -> None:
    """One outage takes the ledger and MLflow away as boot 3 comes up; the ledger is back
    after the first wait, MLflow only four boots later. The resume that follows the wait
    goes on with MLflow behind (before, its fill-in of MLflow stopped the round), and MLflow
    is filled in once it answers: every verdict and every boot's engine log."""

    def away(n: int) -> None:
        if n == 3:
            mlflow_server.pause()
        if n == 7:
            mlflow_server.resume()

    testbed = BothAway(away, pg_url)
    said = io.StringIO()
    sink = _sink(mlflow_server)  # the command's, as `orchestrate round` opens it
    with Ledger(pg_url) as ledger:
        try:
            report = through_ledger_outages(
                lambda: _round(ledger, mlflow_server, testbed, said, sink),
                note=lambda line: print(line, file=said),
                sleep=lambda _s: bring_back(pg_url),
            )
        finally:
            bring_back(pg_url)
            mlflow_server.resume()
        assert len(testbed.boots) > 7, "MLflow must come back inside the round"
        assert report.resumed and report.stopped_by == "budget", said.getvalue()
        assert ledger.round(report.round.id).status == RoundStatus.DONE
        assert not [e for e in ledger.experiments() if e.status == "crash"]
        text = said.getvalue()
        assert "MLflow answers again" in text, text
        _assert_mlflow_has_every_verdict(ledger, mlflow_server)
        boots = [b for e in ledger.experiments() for b in ledger.boots(e.id)]
        client = MlflowClient(mlflow_server.url)
        logged = {
            d.path
            for e in ledger.experiments()
            for d in client.list_artifacts(e.mlflow_run_id or "", "logs")
        }
        # every boot's logs but those of the boot that met both away (lost)
        assert len(logged) == len(boots) - 1, (logged, [b.id for b in boots])
        assert ledger.holding("scripted") == []


def test_status_says_which_experiments_mlflow_lacks_texts_of(tmp_path: Path) -> None:
    """A ledger holding texts MLflow missed (a round that ended with MLflow away): ``orchestrate
    status`` names the experiments, in the JSON and in one line, and what puts them on their
    runs; a ledger holding none says nothing of it."""
    ledgers = Path(__file__).parent / "fixtures" / "ledgers"
    shutil.copyfile(ledgers / "schema4.sqlite", tmp_path / "orchestrate.db")
    profile = str(ledgers / "schema4.profile.yaml")
    env = {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/orchestrate.db"}
    quiet = orchestrate(tmp_path, "status", "--profile", profile, env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert "MLflow lacks" not in quiet.stdout
    with Ledger(env["ORCHESTRATE_LEDGER"]) as ledger:
        ledger.hold_texts(3, {"logs/boot-5/node-0.log": "engine log"})
    shown = orchestrate(tmp_path, "status", "--profile", profile, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["held_for_mlflow"] == [3]
    plain = orchestrate(tmp_path, "status", "--profile", profile, env=env)
    said = " ".join(plain.stdout.split())
    assert "MLflow lacks the launchers and engine logs of 1 experiment(s) (#3)" in said, said
    assert "the next `orchestrate round` puts them on their runs" in said


def test_a_round_command_waits_for_an_mlflow_that_does_not_answer_yet(
    tmp_path: Path, mlflow_server: MlflowServer, impatient: None
) -> None:
    """MLflow that does not answer as the command opens it (a tracking server restarting as a
    timer starts the night) is waited for on the ledger's schedule, and the round then runs;
    one that is configured wrongly is refused at once, no wait."""
    said: list[str] = []
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            mlflow_server.resume_answered()

    mlflow_server.pause()
    try:
        sink = waiting_for_mlflow(
            lambda: _sink(mlflow_server), reached_before=True, note=said.append, sleep=wait
        )
    finally:
        mlflow_server.resume()
    assert waits == [10.0, 30.0]
    assert len(said) == 2 and all(line.startswith("MLflow did not answer") for line in said)
    with Ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        report = _round(ledger, mlflow_server, Outage(lambda n: None), io.StringIO(), sink)
        assert report.stopped_by == "budget"
        _assert_mlflow_has_every_verdict(ledger, mlflow_server)
    with pytest.raises(MlflowSinkError) as wrong:
        waiting_for_mlflow(
            lambda: MlflowSink(str(tmp_path / "mlruns")),
            reached_before=True,
            note=said.append,
            sleep=wait,
        )
    assert not wrong.value.unreachable
    assert waits == [10.0, 30.0], "a wrong configuration is not waited for"


def test_an_mlflow_that_never_answered_the_ledger_is_refused_at_once_one_that_did_is_waited_for(
    tmp_path: Path, impatient: None
) -> None:
    """A tracking URI that names nothing (a wrong port) on a ledger whose rounds never reached
    an MLflow is refused at the command's start in one line, no wait; the same URI on a ledger
    whose rounds MLflow answered is an outage, and waited for."""
    ledgers = Path(__file__).parent / "fixtures" / "ledgers"
    profile = str(ledgers / "schema4.profile.yaml")
    # bound, never listening: every connection to it is refused, and no other process can
    # take the port while the test runs
    with socket.socket() as nothing:
        nothing.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{nothing.getsockname()[1]}"
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
        fresh = {**env, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/fresh.db"}
        refused = orchestrate(tmp_path, "round", "--budget", "1", "--profile", profile, env=fresh)
        assert refused.returncode == 4, refused.stderr
        errors = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, refused.stderr
        assert uri in errors[0] and "never reached an MLflow" in errors[0], errors
        assert "MLflow did not answer" not in refused.stdout + refused.stderr
        with Ledger(fresh["ORCHESTRATE_LEDGER"]) as ledger:
            assert not mlflow_reached(ledger, "twin-2node")
            assert ledger.rounds("twin-2node") == [], "nothing was started"

        shutil.copyfile(ledgers / "schema4.sqlite", tmp_path / "old.db")
        old = {**env, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/old.db"}
        said = said_until(
            tmp_path,
            *("round", "--budget", "1", "--profile", profile),
            words="MLflow did not answer",
            env=old,
        )
        assert "waiting 10s before trying again" in " ".join(" ".join(said).split()), said
        with Ledger(old["ORCHESTRATE_LEDGER"]) as ledger:
            assert mlflow_reached(ledger, "twin-2node")


def _without_mlflow_http_settings() -> dict[str, str]:
    """The environment without MLflow's HTTP settings: MLflow's own defaults, as a user has."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST_")}


def test_a_tracking_server_that_is_not_there_is_said_in_seconds_not_minutes(
    tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracking URI that names nothing on a fresh ledger: a refused port, and an address that
    takes the connection and never answers (a blackholed server). MLflow's own HTTP retries
    held the first for about 4 minutes and the second for over 16 before the command said a
    word; its first contact is bounded now, and says so in one line within seconds. A user's
    own setting is honoured, and the bound is the first contact's only: a sink opened leaves
    MLflow's settings as they were, for a round to ride out a tracking server away mid-round
    on MLflow's own retries."""
    ledgers = Path(__file__).parent / "fixtures" / "ledgers"
    profile = str(ledgers / "schema4.profile.yaml")
    env = _without_mlflow_http_settings()
    # bound, never listening (refused); and listening, never accepting (no answer, ever)
    with socket.socket() as refused, socket.socket() as silent:
        refused.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        for name, port, within in (
            ("refused", refused.getsockname()[1], 30.0),
            ("silent", silent.getsockname()[1], 60.0),
        ):
            uri = f"http://127.0.0.1:{port}"
            fresh = {
                **env,
                "MLFLOW_TRACKING_URI": uri,
                "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path}/{name}.db",
            }
            started = time.monotonic()
            said = orchestrate(
                tmp_path, "round", "--budget", "1", "--profile", profile, env=fresh, timeout=90
            )
            took = time.monotonic() - started
            assert said.returncode == 4, said.stderr
            errors = [line for line in said.stderr.splitlines() if line.startswith("Error:")]
            assert len(errors) == 1, said.stderr
            assert uri in errors[0] and "never reached an MLflow" in errors[0], errors
            assert took < within, (name, took)
        # the user's own settings win over the bound: no retry, a 2 s wait, then the line
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
        started = time.monotonic()
        with pytest.raises(MlflowSinkError) as away:
            MlflowSink(f"http://127.0.0.1:{silent.getsockname()[1]}")
        assert away.value.unreachable
        assert time.monotonic() - started < 10.0
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name)
    sink = _sink(mlflow_server)
    assert sink.experiment_id
    assert not [k for k in os.environ if k.startswith("MLFLOW_HTTP_REQUEST_")], (
        "the first contact's bound outlived it"
    )


def test_a_write_mlflow_refused_is_not_said_as_mlflow_away() -> None:
    """A tracking server that does not answer is waited for; a write MLflow refused (its
    artifact store read-only or full) asks for the fix, not for patience."""
    lines: list[str] = []

    def failing(unreachable: bool) -> Callable[[], None]:
        def write() -> None:
            raise MlflowSinkError(
                "[Errno 30] Read-only file system: 'mlartifacts/1'",
                tracking_uri="sqlite:///mlflow.db",
                operation="log_artifact",
                unreachable=unreachable,
            )

        return write

    for unreachable in (False, True):
        Mirror(note=lines.append).write(failing(unreachable))
    refused, away = lines
    assert refused.startswith("MLflow refused a write ([Errno 30] Read-only file system")
    assert "once it takes one: fix what it names" in refused and "answer" not in refused
    assert away.startswith("MLflow stopped answering ([Errno 30]")
    assert "filled in from it once it answers" in away
