"""What ``orchestrate round`` leaves for the morning: the round's report and results.tsv, at
its end or where it stopped short, and its table (or JSON) on the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from knobs.vocabulary import RoundStatus
from orchestrator.cli.common import out
from orchestrator.errors import OrchestrateError

if TYPE_CHECKING:
    from ledger import ExperimentRecord, Ledger, RoundRecord
    from ledger.mlflow_sink import MlflowSink
    from orchestrator.display import RoundDisplay
    from orchestrator.profile import Profile
    from orchestrator.report import Written
    from orchestrator.round import RoundReport


def report_stop(
    prof: Profile,
    ledger: Ledger,
    sink: MlflowSink,
    round_id: int,
    stop: OrchestrateError | KeyboardInterrupt,
    display: RoundDisplay,
) -> None:
    """The report and results.tsv of round ``round_id`` as far as it got, for a round that
    stopped short (a node away, a champion that stopped booting, a bad value, the LLM API,
    MLflow away at its end, an interrupt): the morning finds them as a round's end leaves
    them, the stop among them. The stop stays the command's: its line the last word, its
    exit code the exit; a report that cannot be written is one line before it, and a second
    Ctrl-C leaves it unwritten. Nothing where the ledger is what failed (nothing to read it
    from) or the cluster is another orchestrator's now (its report is that one's to write);
    MLflow is left out where it is what failed or held back from this cluster's rounds (its
    calls would wait on a server away)."""
    from cluster.errors import OwnershipError
    from ledger import LedgerError, MlflowSinkError
    from orchestrator.stops import last_stop, record_stop

    if isinstance(stop, LedgerError | OwnershipError):
        return
    try:
        try:
            recorded = last_stop(ledger, prof.cluster.name, round_id) is not None
        except LedgerError:  # not read: tried, and kept outside the ledger if it takes no write
            recorded = False
        if not recorded:
            # the round records its stop as its loop unwinds; one that stopped before its loop
            # began (or as it waited out the ledger away), or whose record the interrupt itself
            # cut short, is recorded here: the report, `status` and the resume say why it
            # stopped (``record_stop``: kept outside a ledger that takes no write)
            record_stop(ledger, prof.cluster.name, round_id, stop)
        to_mlflow = not isinstance(stop, MlflowSinkError) and not ledger.holding(prof.cluster.name)
        page = write_round_report(
            prof, ledger, sink if to_mlflow else None, ledger.round(round_id), display
        )
        if page is not None:
            display.note(f"the round's report, as far as it got: {page}")
    except KeyboardInterrupt:
        return  # asked again to stop: the stop's line, at once
    except Exception as e:  # whatever it was, the stop's line is the command's last word
        display.note(f"the round's report was not written: {type(e).__name__}: {e}")


def write_round_report(
    prof: Profile,
    ledger: Ledger,
    sink: MlflowSink | None,
    rnd: RoundRecord,
    display: RoundDisplay,
) -> Path | None:
    """The round's report (``orchestrate report``), written at its end (or where it stopped
    short) and logged to its MLflow parent run (not without a ``sink``). A report that cannot
    be written is said in one line (``not_written``): the round's record is complete without
    it, and ``orchestrate report`` writes it again. A round done in the ledger owes MLflow this
    close till it is written (``round_close``): ``orchestrate report`` or the next round writes
    it where it was not (``settle_owed_close``)."""
    from orchestrator.crashpoints import crashpoint
    from orchestrator.report import default_dir, write_report

    try:
        written = write_report(prof, ledger, rnd.id)
    except OrchestrateError as e:
        display.note(not_written(rnd.id, default_dir(rnd.id), e))
        return None
    crashpoint("report.written")
    if rnd.mlflow_run_id and sink is not None:
        try:
            log_close(prof, ledger, sink, rnd, written)
        except OrchestrateError as e:
            display.note(still_owed(rnd, e))
    return written.page


def not_written(round_id: int, folder: Path, e: OrchestrateError) -> str:
    """The one line of round ``round_id``'s report that could not be written into ``folder``
    (``e``: why): what, where, and what writes it once it can be; nothing of the round is
    lost, and the command's exit and last line stay the round's."""
    return (
        f"round {round_id}'s report was not written into {folder.absolute()} ({e.message}): "
        "nothing of the round is lost (the ledger has it); once that folder can be written "
        f"(or into another, with --out DIR), `orchestrate report --round {round_id}` writes it"
    )


def still_owed(rnd: RoundRecord, e: OrchestrateError) -> str:
    """Round ``rnd``'s close is not in MLflow (``e``: why): still owed, nothing lost; written
    by ``orchestrate report`` or the next round where the round is done, else by its resume."""
    by = (
        f"`orchestrate report --round {rnd.id}` or the next `orchestrate round` writes them"
        if rnd.status == RoundStatus.DONE
        else "the round's resume writes them"
    )
    return (
        f"round {rnd.id}'s report, results.tsv and numbers are not on its MLflow run yet "
        f"({e.message}): still owed, nothing is lost (the ledger has them); {by}"
    )


def log_close(
    prof: Profile, ledger: Ledger, sink: MlflowSink, rnd: RoundRecord, written: Written
) -> None:
    """Round ``rnd``'s close on its MLflow parent run: the round in numbers, its report
    (``written``), its results.tsv and the champion's launchers; recorded as written where
    it was owed (``round_close``).

    Raises:
        MlflowSinkError: MLflow failed (the close stays owed).
    """
    from ledger import tsv_text
    from orchestrator import left_open, round_close
    from orchestrator.compared_with import tsv_notes
    from orchestrator.report.data import launchers, summary

    run_id = rnd.mlflow_run_id
    if not run_id:
        return
    # the parent run at a glance: the round in numbers, its report, its results.tsv and the
    # champion's launchers
    sink.log_metrics(run_id, summary(written.data))
    for path in (written.page, *written.pictures):
        sink.log_files(run_id, {"report": path})
    experiments = left_open.read(
        prof.verdict, ledger, ledger.experiments(cluster=prof.cluster.name)
    )
    texts = {"results.tsv": tsv_text(experiments, tsv_notes(prof, ledger))}
    champion = written.data.champion_config
    if champion is not None:
        for rank, script in launchers(prof, champion).items():
            texts[f"champion/node-{rank}.sh"] = script
    sink.log_texts(run_id, texts)
    round_close.written(ledger, prof.cluster.name, rnd.id)  # where it was owed


def write_owed_closes(
    prof: Profile, ledger: Ledger, sink: MlflowSink, display: RoundDisplay
) -> None:
    """The close MLflow lacks of each round the ledger has done (``round_close``: the command
    that closed it was killed as it wrote it, or MLflow did not answer then), written before
    a round starts, one line each: a parent run with the numbers of an earlier stop is not
    left so for good."""
    from orchestrator import round_close

    for round_id in round_close.owed(ledger, prof.cluster.name):
        settle_owed_close(prof, ledger, sink, ledger.round(round_id), display)


def settle_owed_close(
    prof: Profile,
    ledger: Ledger,
    sink: MlflowSink,
    rnd: RoundRecord,
    display: RoundDisplay,
    written: Written | None = None,
) -> None:
    """Round ``rnd``'s close, owed (``round_close.owed``), written to MLflow, in one line: the
    one home of what is done with a close owed, for the next round's start
    (``write_owed_closes``) and ``orchestrate report`` (``written``: the report it wrote,
    logged as it is; else the report is written again). An MLflow away leaves it owed; a store
    that lacks the round's run (a round logged to an earlier store, ``--new-mlflow-store``)
    settles it: the ledger keeps its numbers."""
    from ledger import MlflowSinkError
    from orchestrator import round_close

    try:
        present = rnd.mlflow_run_id is not None and sink.run_state(rnd.mlflow_run_id)
    except MlflowSinkError as e:  # still owed: the round's end, or the next, writes it
        display.note(still_owed(rnd, e))
        return
    if not present:
        # in the store an earlier round logged to (``--new-mlflow-store``): not this one's
        display.note(
            f"round {rnd.id}'s close is not in MLflow, whose store here lacks its run: "
            "the ledger keeps its numbers (`orchestrate report` draws them)"
        )
        round_close.written(ledger, prof.cluster.name, rnd.id)
        return
    lacked = (
        f"round {rnd.id}'s report, results.tsv and numbers were not on its MLflow run "
        "(its command stopped as it wrote them)"
    )
    if written is None:
        display.note(f"{lacked}: writing them")
        write_round_report(prof, ledger, sink, rnd, display)
        return
    try:
        log_close(prof, ledger, sink, rnd, written)
    except MlflowSinkError as e:
        display.note(still_owed(rnd, e))
        return
    display.note(f"{lacked}: written now")


def print_report(report: RoundReport, as_json: bool, page: Path | None) -> None:
    """The round's experiments and champion: a table, or JSON for scripts; and where its
    report is."""
    from knobs.spec import as_text
    from orchestrator.display import experiments_table, whole_rows_width

    if as_json:
        payload = {
            "report": None if page is None else str(page),
            "round": report.round.id,
            "status": report.round.status,
            "resumed": report.resumed,
            "stopped_by": report.stopped_by,
            "gpu_hours": round(report.gpu_hours, 4),
            "experiments": [_experiment_json(e) for e in report.experiments],
            "champion": None
            if report.champion is None
            else {
                "experiment": report.champion.experiment_id,
                "objective": report.champion.objective,
                "config": report.champion.config.as_dict(),
                # measured again since its verdict: what its row in results.tsv keeps
                "measured_again": None if report.level is None else report.level.as_json(),
                "cells_changed": None if report.cells is None else report.cells.as_json(),
            },
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    console = out()
    if report.experiments:
        table = experiments_table(report.experiments, report.champion, f"Round {report.round.id}")
        wider = whole_rows_width(console, table)  # in a log file, one line a row
        if wider is not None:
            console.width = wider  # ``print(width=)`` only narrows
        console.print(table)
    elif report.stopped_by == "exhausted":
        console.print(
            f"Round {report.round.id}: nothing was left to try (every one-knob change of the "
            "champion is decided under it or barred)"
        )
    else:
        console.print(f"Round {report.round.id}: no experiment decided yet ({report.stopped_by})")
    console.print(f"GPU-hours: {report.gpu_hours:.2f} (boots included)")
    if report.champion is not None:
        settings_text = ", ".join(f"{k}={as_text(v)}" for k, v in report.champion.config.items())
        console.print(
            f"champion: experiment #{report.champion.experiment_id}, objective "
            f"{report.champion.objective:.1f}  ({settings_text})"
        )
        for said in (report.level, report.cells):
            if said is not None:
                console.print(f"  {said.words()}", markup=False)
    if page is not None:
        console.print(f"report: {page}")


def _experiment_json(e: ExperimentRecord) -> dict[str, Any]:
    return {
        "experiment": e.id,
        "round": e.round_id,
        "kind": e.kind,
        "knob": e.knob,
        "value": e.value,
        "coupled_knob": e.coupled_knob,
        "coupled_value": e.coupled_value,
        "description": e.description,
        "config": e.config.as_dict(),
        "config_key": e.config.key,
        "state": e.state,
        "status": e.status,
        "objective": e.objective,
        "delta_pct": e.delta_pct,
        "accept_len": e.accept_len,
        "failure_class": e.failure_class,
        "mlflow_run_id": e.mlflow_run_id,
    }
