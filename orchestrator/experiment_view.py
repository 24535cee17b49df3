"""One experiment as the ledger holds it, for a person reading a night back in a terminal
(``orchestrate experiments show``): the change and its decision, the verdict's rule, reason and
statistics, and each boot with its role, how it ended, the node a failed one failed on
(schema 6; a boot recorded before names its node only in its message), the nodes whose clocks
were off while it measured (its cells then measure the node, and no verdict counts them), and
the cells it measured, with the seconds its hosts stalled each one's window and what those
stalls may have cost the boot's objective (``host_stalls``: its stall error, and whether a busy
host disturbed it). Read only: nothing is written.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from cluster.stall import DISTURBED_FRACTION, stalled
from knobs.records import CellResultRecord
from knobs.vocabulary import cut_short
from ledger import BootRecord, ExperimentRecord, Ledger
from orchestrator import host_stalls, left_open
from orchestrator.errors import OrchestrateError
from orchestrator.profile_sections import VerdictSpec
from orchestrator.timestamps import utc_minute
from orchestrator.verdict import slow_ranks


class NoSuchExperiment(OrchestrateError):
    """The cluster's ledger has no experiment of that ID."""

    exit_code = 3

    def __init__(self, message: str, *, experiment: int) -> None:
        super().__init__(message)
        self.experiment = experiment


def named_experiment(
    ledger: Ledger, cluster: str, experiment_id: int, *, hint: str
) -> ExperimentRecord:
    """Experiment ``experiment_id`` of ``cluster``, an ID a person typed.

    Raises:
        NoSuchExperiment: ``cluster`` has none of that ID (``hint``: where to find one).
    """
    e = ledger.find_experiment(cluster, experiment_id)
    if e is None:
        raise NoSuchExperiment(
            f"cluster {cluster} has no experiment #{experiment_id}: {hint}",
            experiment=experiment_id,
        )
    return e


def experiment_view(
    ledger: Ledger,
    cluster: str,
    experiment_id: int,
    *,
    min_matmul_rate: float,
    verdict_spec: VerdictSpec,
) -> dict[str, Any]:
    """Experiment ``experiment_id`` of ``cluster`` as JSON-ready data (see the module; a node
    whose matmul rate read below ``min_matmul_rate`` had its clocks off). A stop an earlier
    release recorded ``discard`` and left open for another look reads ``inconclusive``, as
    every reader shows it (``left_open``; ``verdict_spec``: the profile's verdict settings),
    and ``recorded_status`` keeps the ledger's word.

    Raises:
        NoSuchExperiment: ``cluster`` has none of that ID.
    """
    e = named_experiment(
        ledger,
        cluster,
        experiment_id,
        hint="`orchestrate export` lists its experiments (results.tsv)",
    )
    verdict = ledger.verdict(e.id)
    [shown] = left_open.read(verdict_spec, ledger, [e])
    cells: dict[int, list[tuple[int, CellResultRecord]]] = {}
    for r in ledger.cell_results(e.id):
        cells.setdefault(r.boot_id, []).append((r.repeat, r.result))
    return {
        **_experiment(shown),
        "recorded_status": None if e.status is None else str(e.status),
        "verdict": None if verdict is None else verdict.model_dump(mode="json"),
        "boots": [_boot(b, cells.get(b.id, []), min_matmul_rate) for b in ledger.boots(e.id)],
    }


def _experiment(e: ExperimentRecord) -> dict[str, Any]:
    return {
        "id": e.id,
        "cluster": e.cluster,
        "round": e.round_id,
        # the proposal it came from (None: a baseline)
        "proposal": e.proposal_id,
        "kind": str(e.kind),
        "description": e.description,
        "knob": e.label,
        "value": e.value,
        "coupled_value": e.coupled_value,
        "state": str(e.state),
        "status": None if e.status is None else str(e.status),
        "objective": e.objective,
        "delta_pct": e.delta_pct,
        "accept_len": e.accept_len,
        "failure_class": e.failure_class,
        "failure_detail": e.failure_detail,
        "created_at": _when(e.created_at),
        "decided_at": _when(e.decided_at),
        "mlflow_run_id": e.mlflow_run_id,
        "config": dict(e.config),
    }


def _boot(
    b: BootRecord, cells: list[tuple[int, CellResultRecord]], min_matmul_rate: float
) -> dict[str, Any]:
    node = None if b.failed_rank is None else {"rank": b.failed_rank, "host": b.failed_host}
    records = [c for _, c in cells]
    return {
        "id": b.id,
        "role": str(b.role),
        "measurement": b.measurement,
        "status": str(b.status),
        "failure_class": b.failure_class,
        "failure_detail": b.failure_detail,
        "failed_on": node,
        "started_at": _when(b.started_at),
        "healthy_at": _when(b.healthy_at),
        "ended_at": _when(b.ended_at),
        "clocks_off": slow_ranks(records, min_matmul_rate),
        # what its hosts' stalls may have moved its objective by (relative), and whether that
        # makes it a busy host's reading (``host_stalls``, the verdict's one home)
        "stalled_s": sum(stalled(c) for c in records),
        "stall_error": host_stalls.boot_error(records),
        "disturbed": host_stalls.disturbed(records),
        "cells": [
            {
                "cell": c.cell,
                "repeat": repeat,
                "output_throughput": c.output_throughput,
                "accepted_per_step": c.accepted_per_step,
                "errors": c.errors,
                "duration": c.duration,
                "client_stall_s": c.client_stall_s,
                "engine_stall_s": c.engine_stall_s,
                "measured_again": c.measured_again,
                "engine_found_stopped": c.engine_found_stopped,
            }
            for repeat, c in cells
        ],
    }


def _stalls(b: dict[str, Any]) -> str:
    """A boot's stalls as its line says them (nothing where none)."""
    if b["stalled_s"] <= 0:
        return ""
    cost = (
        f"its hosts stalled its cells' windows {b['stalled_s']:.2f} s in all, which may have "
        f"moved its objective by up to {b['stall_error'] * 100:.1f}%"
    )
    if b["disturbed"]:
        return (
            f"; disturbed by a busy host: {cost} (over {DISTURBED_FRACTION:.0%}: the host's "
            "reading, not the config's alone)"
        )
    return f"; {cost}"


def _cell(c: dict[str, Any]) -> str:
    """A cell's line: its tok/s, its errors, and its window's stalls where any."""
    line = f"      {c['cell']}: {c['output_throughput']:.1f} tok/s"
    line += "" if not c["errors"] else f", {c['errors']} error(s)"
    stalls = [
        f"{c[key]:.2f} s ({who})"
        for key, who in (("client_stall_s", "client"), ("engine_stall_s", "engine"))
        if c[key] > 0
    ]
    if stalls:
        line += f", stalled {' + '.join(stalls)} around its {c['duration']:g} s window"
    if c["measured_again"]:
        line += f"; measured again {c['measured_again']} time(s)"
        if c["engine_found_stopped"]:
            line += f" ({c['engine_found_stopped']} for an engine found stopped)"
    return line


def _when(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def view_lines(view: dict[str, Any]) -> list[str]:
    """``experiment_view``'s data as the lines ``orchestrate experiments show`` prints."""
    status = view["status"] or f"{view['state']} (not decided)"
    lines = [f"experiment #{view['id']} of cluster {view['cluster']}, round {view['round']}"]
    if view["proposal"] is not None:
        lines[0] += f", proposal {view['proposal']}"
    lines.append(f"  {view['description']}")
    measured = ""
    if view["objective"] is not None:
        measured = f": objective {view['objective']:.1f}"
        if view["delta_pct"] is not None:
            measured += f" ({view['delta_pct']:+.2f}% vs its champion)"
    decided = view["decided_at"]
    when = "-" if decided is None else utc_minute(datetime.fromisoformat(decided))
    lines.append(f"  {status}{measured}, decided {when}")
    verdict = view["verdict"]
    if verdict is not None:
        lines.append(f"  verdict ({verdict['rule']}): {verdict['reason']}")
        lines.append(f"  statistics: {json.dumps(verdict['stats'], sort_keys=True)}")
    lines.append(f"  boots: {len(view['boots'])}")
    for b in view["boots"]:
        head = f"    boot {b['id']} ({b['role']}, measurement {b['measurement']}): {b['status']}"
        if b["failure_class"] is not None:
            on = b["failed_on"]
            head += f", {b['failure_class']}"
            head += "" if on is None else f" on node {on['rank']} ({on['host']})"
            head += "" if not b["failure_detail"] else f": {b['failure_detail']}"
        said = None if b["failure_class"] is not None else cut_short(b["failure_detail"])
        if said is not None:
            head += f"; {said}"
        if b["clocks_off"]:
            nodes = ", ".join(str(r) for r in b["clocks_off"])
            head += (
                f"; clocks off on node(s) {nodes}: it measured the node, and no verdict counts it"
            )
        lines.append(head + _stalls(b))
        lines.extend(_cell(c) for c in b["cells"])
    return lines
