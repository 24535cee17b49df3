"""What a round needs from a cluster and from MLflow, as protocols.

``ClusterTestbed`` is the real thing (a ``Deployer`` plus the bench client); the research
benchmark drives the same round loop against a simulated testbed and a ``NullSink``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from cluster import stopped
from cluster.bench import run_cell, smoke
from cluster.bench_spec import BenchSpec
from cluster.connect import open_transport
from cluster.deploy import Deployer
from cluster.errors import BenchError, NodeError, OwnershipError
from cluster.nodes import Fence, Progress
from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec
from ledger.mlflow_sink import RunState
from orchestrator.errors import OrchestrateError
from orchestrator.interrupts import unbroken
from orchestrator.profile import Profile
from orchestrator.settings import runtime_placeholders


def deployer_for(
    profile: Profile,
    *,
    progress: Progress | None = None,
    fence: Fence | None = None,
    parallel: bool = True,
) -> Deployer:
    """The deployer ``orchestrate`` drives a profile's cluster with: one transport per node
    (SSH where the node says so), the runtime placeholders, the profile's smoke generation;
    ``fence`` asked right before each node is stopped or started (``lease.still_leased``); a
    teardown under way holds the signals that would cut it short (``interrupts.unbroken``)."""
    return Deployer(
        profile.cluster,
        profile.launcher,
        profile.space,
        profile.gates,
        {n.rank: open_transport(n, profile.cluster.ssh) for n in profile.cluster.nodes},
        model=profile.model,
        runtime=runtime_placeholders(),
        smoke=lambda url, model, prompt, n: smoke(url, model, prompt=prompt, max_tokens=n),
        progress=progress,
        fence=fence,
        unbroken=unbroken,
        parallel=parallel,
    )


class Testbed(Protocol):
    """Deploys configs, measures cells, tears down."""

    def deploy(self, config: Config) -> dict[int, str]:
        """Boot ``config`` on every node; the rendered launcher of each rank.

        Raises:
            NodeError: the boot failed (its ``failure_class`` says how).
        """
        ...

    def bench(self, cell: CellSpec) -> CellResultRecord:
        """Measure one cell against what is deployed.

        Raises:
            NodeError: class bench_failed.
        """
        ...

    def logs(self) -> dict[int, str]:
        """Every node's engine log."""
        ...

    def stop_all(self) -> None:
        """Stop every engine; confirmed gone.

        Raises:
            NodeError: a node could not be reached or its engine would not stop.
        """
        ...

    def restore(self, config: Config) -> None:
        """Boot ``config`` (the champion) again after a failure and leave it serving.

        Raises:
            NodeError: the restore failed too (every node is torn down again).
        """
        ...


@runtime_checkable
class StopsStarted(Protocol):
    """A testbed whose engines run on nodes another may take (``ClusterTestbed``): it can stop
    exactly the engines its last boot started."""

    def stop_started(self) -> dict[int, str]:
        """Stop exactly the engines this testbed's last boot started, each verified its own,
        whoever holds the nodes now: by rank, what became of each (``teardown.stop_started``).
        Never raises a node's error (each is its node's outcome).

        Raises:
            LeaseLost: the fence found the round's lease another's: nothing was stopped (the
                engines are the new holder's, who takes the round over).
        """
        ...


class Sink(Protocol):
    """Where a person looks: one parent run per round, one child per experiment."""

    def start_round(
        self,
        *,
        round_id: int,
        cluster: str,
        params: Mapping[str, str],
        tags: Mapping[str, str] = ...,
    ) -> str: ...

    def start_experiment(
        self,
        *,
        parent_run_id: str,
        number: int,
        kind: str,
        params: Mapping[str, object],
        tags: Mapping[str, str] = ...,
    ) -> str: ...

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: int | None = None
    ) -> None: ...

    def log_texts(self, run_id: str, texts: Mapping[str, str]) -> None: ...

    def log_files(self, run_id: str, files: Mapping[str, Path]) -> None: ...

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None: ...

    def rename(self, run_id: str, name: str) -> None: ...

    def finish(self, run_id: str, status: str = "FINISHED") -> None: ...

    def run_state(self, run_id: str) -> RunState | None: ...

    def find_run(self, tags: Mapping[str, str]) -> str | None: ...

    def metric_steps(self, run_id: str, key: str) -> set[int]: ...


class NullSink:
    """A sink that records nothing (benchmarks that simulate thousands of experiments) but
    its runs' status and tags, so that a round's end finds nothing to complete."""

    def __init__(self) -> None:
        self._runs = 0
        self._states: dict[str, RunState] = {}

    def _next(self) -> str:
        self._runs += 1
        run_id = f"null-{self._runs}"
        self._states[run_id] = RunState("RUNNING", {}, frozenset())
        return run_id

    def start_round(
        self,
        *,
        round_id: int,
        cluster: str,
        params: Mapping[str, str],
        tags: Mapping[str, str] = {},
    ) -> str:
        return self._next()

    def start_experiment(
        self,
        *,
        parent_run_id: str,
        number: int,
        kind: str,
        params: Mapping[str, object],
        tags: Mapping[str, str] = {},
    ) -> str:
        return self._next()

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: int | None = None
    ) -> None:
        pass

    def log_texts(self, run_id: str, texts: Mapping[str, str]) -> None:
        pass

    def log_files(self, run_id: str, files: Mapping[str, Path]) -> None:
        pass

    def rename(self, run_id: str, name: str) -> None:
        pass

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        state = self._states.get(run_id)
        if state is not None:
            self._states[run_id] = RunState(state.status, {**state.tags, **tags}, state.metrics)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        state = self._states.get(run_id)
        if state is not None:
            self._states[run_id] = RunState(status, state.tags, state.metrics)

    def run_state(self, run_id: str) -> RunState | None:
        return self._states.get(run_id)

    def find_run(self, tags: Mapping[str, str]) -> str | None:
        return None

    def metric_steps(self, run_id: str, key: str) -> set[int]:
        return set()


class ClusterTestbed:
    """A real cluster: deploy through its transports, measure with the bench client as the
    profile's ``bench`` section says (how long a cell waits for a silent engine). ``stop``
    set (the lease's ``gone``: the cluster another's now) stops a cell where it stands."""

    def __init__(
        self,
        deployer: Deployer,
        base_url: str,
        model: str,
        *,
        stop: threading.Event | None = None,
        bench: BenchSpec | None = None,
    ) -> None:
        self.deployer = deployer
        self.base_url = base_url
        self.model = model
        self.stop = stop
        self.bench_settings = bench or BenchSpec()

    def deploy(self, config: Config) -> dict[int, str]:
        """Boot ``config`` (see ``Deployer.deploy``)."""
        result = self.deployer.deploy(config)
        return {rank: launcher.script for rank, launcher in result.launchers.items()}

    def bench(self, cell: CellSpec) -> CellResultRecord:
        """One cell, with every node's clocks read around it.

        Raises:
            NodeError: class bench_failed, with the bench client's evidence; or a node's own
                failure as it was (a clocks query that found the node unreachable is the
                infrastructure's, not the config's), or as a node's log names it
                (``Deployer.logged_fault``: an engine that died of its GPU or a full disk), an
                engine found stopped (``Deployer.stopped_engine``: the node's), or
                an engine found dead (``Deployer.died_measuring``: a worker lost is the
                node's, an OOM the config's).
            OwnershipLost: ``stop`` was set: the cell stopped, its streams closed.
        """
        try:
            return run_cell(
                self.base_url,
                self.model,
                cell,
                clocks=self.deployer.clocks,
                on_notice=self.deployer.progress,
                stop=self.stop,
                # a stopped engine is looked for while the engine is silent: its process
                # state is the evidence only while it is stopped (``cluster.stopped``)
                probe=self.deployer.stopped_engine,
                hang_after_s=self.bench_settings.hang_after_s,
            )
        except (NodeError, OwnershipError):
            raise  # a cell stopped because the cluster is another's: nobody's failure
        except OrchestrateError as err:
            message = f"bench cell {cell.name} failed: {err}"
            # an engine that died of its node (an ECC error, a full disk) mid-cell: the node's
            # or an engine found stopped (SIGSTOP, a suspended host): the head waits on it
            fault = (
                self.deployer.logged_fault(message)
                or self.deployer.stopped_engine(message)
                or _stopped_meanwhile(err, message)
                or self.deployer.died_measuring(cell.name)
            )
            if fault is not None:
                raise fault from err
            raise NodeError(
                message,
                failure_class="bench_failed",
                rank=0,
                host=self.deployer.cluster.head.host,
            ) from err

    def logs(self) -> dict[int, str]:
        """Every node's engine log."""
        return self.deployer.logs()

    def stop_all(self) -> None:
        """Stop every node (head first).

        Raises:
            NodeError: a node could not be stopped (every other node was tried first).
        """
        self.deployer.stop_all()

    def restore(self, config: Config) -> None:
        """Boot the champion again (see ``Deployer.restore``)."""
        self.deployer.restore(config)

    def stop_started(self) -> dict[int, str]:
        """Stop exactly the engines the last boot started (see ``Deployer.stop_started``)."""
        return self.deployer.stop_started()


def _stopped_meanwhile(err: OrchestrateError, message: str) -> NodeError | None:
    """``engine_stopped`` on the node whose engine the failed cell found stopped while it was
    silent (``BenchError.stopped``), though continued by the time the cell failed: its silence
    was the node's, never the config's. None where the cell found none."""
    found = err.stopped if isinstance(err, BenchError) else None
    if found is None:
        return None
    return NodeError(
        f"{message}; {stopped.found(found)}",
        failure_class=found.failure_class,
        rank=found.rank,
        host=found.host,
    )


def round_testbed(
    profile: Profile, deployer: Deployer, *, stop: threading.Event | None = None
) -> ClusterTestbed:
    """The testbed a round measures ``profile``'s cluster with (``deployer``: ``deployer_for``'s):
    its endpoint and model, its cells run as its ``bench`` section says; ``stop`` as
    ``ClusterTestbed``'s."""
    return ClusterTestbed(
        deployer, profile.cluster.base_url, profile.model, stop=stop, bench=profile.bench
    )
