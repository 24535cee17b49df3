"""Deploy and teardown: stop everything → preflight → workers N-1…1 → head → /health →
a greedy smoke generation → boot-log gates. Every failure is a typed ``DeployError``.

It owns the boot's order and what follows a failure: a failed boot torn down on every node,
its logs read, the champion booted again when asked (``Deployer.attempt``), and after a bench
cell failed, whose fault it was by what the nodes logged and did since the boot came up. The
nodes are driven through ``cluster.nodes``; each step's gate is ``cluster.readiness``'s, the stop
``cluster.teardown``'s, the preflight gates ``cluster.preflight``'s; which node and class a
failed boot is blamed on is ``cluster.blame``'s."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from cluster import engine_process, teardown
from cluster.errors import DeployError, NodeError
from cluster.gates import GateSpec
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import SCRIPT, LauncherSpec, RenderedLauncher, render_node
from cluster.nodes import Fence, Nodes, Progress, Unbroken
from cluster.ports import ensure_ports_free, keep_ports
from cluster.preflight import Preflight
from cluster.readiness import Boot, Smoke
from cluster.transport import Transport
from knobs.config import Config
from knobs.records import NodeClockRecord
from knobs.space import KnobSpace
from knobs.vocabulary import INFRASTRUCTURE
from orchestrator.errors import OrchestrateError


class DeployResult(BaseModel):
    """A healthy boot: what was rendered and the evidence that it is good."""

    model_config = ConfigDict(frozen=True)

    launchers: dict[int, RenderedLauncher]
    start_order: tuple[int, ...]
    clocks: tuple[NodeClockRecord, ...]
    boot_seconds: float
    smoke_text: str


@dataclass(frozen=True)
class Attempt:
    """What ``Deployer.attempt`` did (issue #4): a healthy boot, or the failure with its
    evidence, the teardown of every node and, when asked, the restored champion."""

    config: Config
    result: DeployResult | None = None
    failure: NodeError | None = None
    logs: Mapping[int, str] = field(default_factory=dict)
    teardown: Mapping[int, str] = field(default_factory=dict)
    restored: DeployResult | None = None
    restore_failure: NodeError | None = None


class Deployer:
    """Drives one cluster's nodes through its transports."""

    def __init__(
        self,
        cluster: ClusterSpec,
        launcher: LauncherSpec,
        space: KnobSpace,
        gates: GateSpec,
        transports: Mapping[int, Transport],
        *,
        model: str,
        runtime: Mapping[str, str],
        smoke: Smoke,
        progress: Progress | None = None,
        fence: Fence | None = None,
        unbroken: Unbroken | None = None,
        parallel: bool = True,
    ) -> None:
        self.cluster = cluster
        self.launcher = launcher
        self.space = space
        self.gates = gates
        self.model = model
        self.runtime = dict(runtime)
        self._nodes = Nodes(
            cluster,
            transports,
            progress=progress,
            fence=fence,
            unbroken=unbroken,
            parallel=parallel,
        )
        self.transports = self._nodes.transports
        self._preflight = Preflight(
            cluster,
            gates,
            self.transports,
            self.runtime,
            on_every=self._nodes.on_every,
            progress=self._nodes.progress,
        )
        self._blame = self._nodes.blamer(gates, self._nodes.log_of, self._container)
        self._boot = Boot(self._nodes, gates, self._blame, model=model, smoke=smoke)

    # ---- the nodes (``cluster.nodes``) ------------------------------------------------------
    def progress(self, message: str) -> None:
        """``message`` on the progress the deployer was given (the round's phase line)."""
        self._nodes.progress(message)

    def close(self) -> None:
        """Close every node's transport (SSH connections)."""
        self._nodes.close()

    def reach(self) -> dict[int, NodeError | None]:
        """Open every node's connection at once and run ``true`` on it: rank → its error, or
        None when it answered. Connections stay open for what follows."""
        return self._nodes.reach()

    def logs(self, skip: Mapping[int, str] | None = None) -> dict[int, str]:
        """Every node's engine log, by rank, read at once (a node that cannot be read gives
        its error; ``skip`` maps ranks known to be unreachable to why, not tried again)."""
        return self._nodes.logs(skip)

    def alive(self, node: NodeSpec) -> bool:
        """Whether the node's engine process group is alive."""
        return self._nodes.alive(node)

    def render(self, config: Config) -> dict[int, RenderedLauncher]:
        """Every node's launcher for ``config``.

        Raises:
            ProfileError, KnobError: the template or config cannot be rendered.
        """
        return {
            n.rank: render_node(self.launcher, self.space, config, self.cluster, n, self.runtime)
            for n in self.cluster.nodes
        }

    # ---- teardown (``cluster.teardown``) ----------------------------------------------------
    def stop_all(self) -> dict[int, str]:
        """Stop every node's engine, head first then ranks 1…N-1 (the reverse of the start
        order), each confirmed gone before the next. A node that fails does not keep the
        others running: every node is tried, then the first failure is raised.

        Raises:
            NodeError: a node could not be reached or its engine would not die.
            Whatever the fence raises, right before a node's stop would go out: that node and
                the ones after it are left as they are (they are another's now).
        """
        outcomes, errors = self.stop_each()
        if errors:
            raise errors[0]
        return outcomes

    def teardown(self) -> dict[int, str]:
        """``stop_all`` that raises no node's error: rank → ``absent``/``stopped``/``killed``,
        or ``unreachable: …``/``failed: …`` for a node that could not be stopped (the fence's
        refusal is raised, as ``stop_all`` raises it)."""
        return self.stop_each()[0]

    def stop_each(self) -> tuple[dict[int, str], list[NodeError]]:
        """Stop every node (see ``stop_all``): rank → outcome, and every node's error."""
        return teardown.stop_each(self._nodes, self.gates, self.runtime, self._container)

    def stop_started(self) -> dict[int, str]:
        """Stop exactly the engines this deployer's last boot started, each checked by its
        process group and start time, whatever the nodes' pid files say now: rank → outcome
        (``teardown.stop_started``). For a round whose node was taken by nobody it knows of.

        Raises:
            Whatever the fence raises, before any stop goes out.
        """
        return teardown.stop_started(self._nodes, self.gates, self._boot.started, self._container)

    # ---- preflight (``cluster.preflight``) ------------------------------------------------
    def clocks(self) -> list[NodeClockRecord]:
        """Every node's clocks, read in parallel (empty when the profile has no clocks query).

        Raises:
            NodeError: the query failed or printed something unreadable.
        """
        return self._preflight.clocks()

    def preflight(self) -> list[NodeClockRecord]:
        """The preflight gates on every node at once (``Preflight.run``).

        Raises:
            DeployError: preflight_failed (interface, memory) or clocks_stuck.
            NodeError: a node could not be reached or a query failed.
        """
        return self._preflight.run()

    # ---- boot (each step's gate: ``cluster.readiness``) ------------------------------------------
    def deploy(self, config: Config) -> DeployResult:
        """Boot ``config`` on every node. The caller tears down on failure (``stop_all``).

        Raises:
            DeployError: with its failure class and evidence.
            NodeError: a node could not be reached.
            DeployError: once our engines are stopped, something still listens on the
                cluster's ports (class ``port_in_use``, issue #17).
        """
        started = time.monotonic()
        launchers = self.render(config)
        self.stop_all()
        head = self.cluster.head
        ensure_ports_free(self.cluster, self._nodes.transport(head))  # issue #17: none foreign
        clocks = self.preflight()

        def upload(node: NodeSpec) -> None:
            self._nodes.transport(node).put_text(
                f"{node.workdir}/{SCRIPT}", launchers[node.rank].script, mode=0o755
            )

        keep_ports(self.cluster)  # the pair these engines take, for the commands after
        self._nodes.progress("uploading launchers")
        self._nodes.fence()  # the new owner's launchers are not replaced either
        self._nodes.on_every(self.cluster.nodes, upload)
        order: list[int] = []
        for node in self.cluster.workers_desc:
            self._nodes.progress(f"starting {node.name} (worker)")
            self._boot.start(node)
            order.append(node.rank)
            self._boot.await_worker(node)
        self._nodes.progress(f"starting {head.name} (head)")
        self._boot.start(head)
        order.append(0)
        self._boot.await_health(config)
        self._nodes.progress("smoke generation")
        text = self._boot.smoke_check()
        self._boot.log_gates()
        return DeployResult(
            launchers=launchers,
            start_order=tuple(order),
            clocks=tuple(clocks),
            boot_seconds=time.monotonic() - started,
            smoke_text=text,
        )

    # ---- after a failure (issue #4) ---------------------------------------------------------
    def restore(self, config: Config) -> DeployResult:
        """Boot ``config`` (the champion) again after a failure; if that fails too, every node
        is torn down again.

        Raises:
            DeployError, NodeError: the restore itself failed.
        """
        self._nodes.progress("restoring the champion")
        try:
            return self.deploy(config)
        except NodeError:
            self.teardown()
            raise

    def attempt(self, config: Config, *, fallback: Config | None = None) -> Attempt:
        """Deploy ``config``. On failure: tear every node down, read every node's log (the
        evidence), then boot ``fallback`` (the champion) when one is given. Never raises a
        ``NodeError``: the failure, the teardown and the restore are in the result.

        Raises:
            ProfileError, KnobError: ``config`` cannot be rendered at all.
        """
        try:
            return Attempt(config=config, result=self.deploy(config))
        except NodeError as failure:
            self._nodes.progress(
                f"deploy failed ({failure.failure_class}): tearing down every node"
            )
            stopped = self.teardown()
            logs = self.logs(skip={r: how for r, how in stopped.items() if how.startswith("unr")})
            if fallback is None:
                return Attempt(config=config, failure=failure, logs=logs, teardown=stopped)
            try:
                restored = self.restore(fallback)
            except NodeError as e:
                return Attempt(
                    config=config,
                    failure=failure,
                    logs=logs,
                    teardown=stopped,
                    restore_failure=e,
                )
            return Attempt(
                config=config, failure=failure, logs=logs, teardown=stopped, restored=restored
            )
        except OrchestrateError:
            raise  # a config that does not render: nothing was touched
        except BaseException:
            # not the boot's failure: an interrupt (Ctrl-C in `cluster up`), or an error of
            # orchestrate's own (a progress line that cannot be written, a bug), with engines
            # perhaps started: nothing is left half up for it. Quietly: the progress may be
            # what failed
            with self._nodes.quiet(), contextlib.suppress(Exception):
                self.teardown()
            raise

    # ---- after a bench cell failed ----------------------------------------------------------
    def logged_fault(self, message: str) -> DeployError | None:
        """After a bench cell failed (``message``): the node's own failure a log names since the
        boot came up, if one does (a GPU or its driver, a full disk: ``INFRASTRUCTURE``), the
        head's log read first. What a node logged while it booted (a warning about the hub on
        an air-gapped node, a cache it could not write) and a worker gone (``worker_missing``:
        a head logs that too when a worker died of the config's own failure) are not read."""
        return self._blame.named(
            message,
            self.cluster.head,
            INFRASTRUCTURE - {"worker_missing"},
            log_of=self._boot.since_up,
        )

    def _container(self, node: NodeSpec) -> str | None:
        """The container ``node``'s engine runs in, if its launcher names one."""
        return engine_process.container_of(
            self.launcher, self.gates.stop_hook, self.cluster, node, self.runtime
        )

    def died_measuring(self, cell: str) -> DeployError | None:
        """After bench cell ``cell`` failed: an engine found dead since the boot came up, judged
        as at boot (``Blame.lost``) on what each log says since then: a worker lost with no
        failure of its own (killed, its node gone) is ``worker_missing``, the node's, however
        the head's requests failed for it; a node whose log names a config's failure (an OOM
        at this concurrency) is that; a head dead of nothing it names, ``bench_failed``.
        None while every engine lives."""
        dead = [n for n in self.cluster.nodes if not self._nodes.alive(n)]
        if not dead:
            return None
        return self._nodes.blamer(self.gates, self._boot.since_up, self._container).lost(
            dead[0], f"while cell {cell} was measured", default="bench_failed"
        )

    def stopped_engine(self, message: str) -> DeployError | None:
        """After bench cell failed (``message``): ``engine_stopped`` on the first node whose
        engine has a process found stopped (``Blame.stopped``), else None."""
        return self._blame.stopped(message)
