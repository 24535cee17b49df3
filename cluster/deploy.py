"""Deploy and teardown: stop everything → preflight → workers N-1…1 → head → /health →
a greedy smoke generation → boot-log gates. Every failure is a typed ``DeployError``.

The preflight gates are ``cluster.preflight``'s; which node and class a failed boot is blamed
on is ``cluster.blame``'s."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from pydantic import BaseModel, ConfigDict

from cluster import engine_process
from cluster.blame import Blame
from cluster.claims import ensure_ports_free
from cluster.errors import DeployError, NodeError, tail
from cluster.gates import GateSpec
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import (
    LOG,
    SCRIPT,
    LauncherSpec,
    RenderedLauncher,
    alive_command,
    fill,
    journaled,
    marked,
    placeholders,
    render_node,
    start_command,
    stop_command,
)
from cluster.ports import keep_ports
from cluster.preflight import Preflight
from cluster.transport import Transport, check
from knobs.config import Config
from knobs.records import NodeClockRecord
from knobs.space import KnobSpace
from knobs.vocabulary import INFRASTRUCTURE
from orchestrator.errors import OrchestrateError

T = TypeVar("T")

#: How long a started engine may take to be seen alive (issue #4; see ``Deployer._start``).
START_CONFIRM_S = 5.0
#: How much of each node's log, as the boot came up, marks where a failure in the cells is
#: read from (``Deployer.logged_fault``).
UP_MARK_BYTES = 4096


class DeployResult(BaseModel):
    """A healthy boot: what was rendered and the evidence that it is good."""

    model_config = ConfigDict(frozen=True)

    launchers: dict[int, RenderedLauncher]
    start_order: tuple[int, ...]
    clocks: tuple[NodeClockRecord, ...]
    boot_seconds: float
    smoke_text: str


Progress = Callable[[str], None]
#: Called right before a command that stops or starts an engine (or replaces its launcher)
#: goes out to a node: raises when the cluster is no longer this process's to drive.
Fence = Callable[[], None]
#: A block no signal may cut short: a teardown under way finishes (``orchestrator.interrupts``).
Unbroken = Callable[[], AbstractContextManager[object]]


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
        smoke: Callable[[str, str, str, int], str],
        progress: Progress | None = None,
        fence: Fence | None = None,
        unbroken: Unbroken | None = None,
        parallel: bool = True,
    ) -> None:
        self.cluster = cluster
        self.launcher = launcher
        self.space = space
        self.gates = gates
        self.transports = dict(transports)
        self.model = model
        self.runtime = dict(runtime)
        self._smoke = smoke
        self._progress = progress or _silent
        # asked as close to each stop and launch as the code gets: a process suspended after a
        # node's progress line and woken after another took the cluster over must not stop or
        # start that node under the new owner (issue #17)
        self._fence = fence or _open
        # a teardown that has begun finishes: cut short by a signal, it leaves engines running
        self._unbroken = unbroken or contextlib.nullcontext
        # False runs every per-node step one node at a time (the baseline of bench/deploy.py)
        self.parallel = parallel
        self._preflight = Preflight(
            cluster,
            gates,
            self.transports,
            self.runtime,
            on_every=self._parallel,
            progress=self._progress,
        )
        self._blame = self._blamer(self.log_of)
        #: by rank, the end of each node's log as the last boot came up (``_log_gates``)
        self._up_marks: dict[int, str] = {}

    # ---- helpers ----------------------------------------------------------------------------
    def progress(self, message: str) -> None:
        """``message`` on the progress the deployer was given (the round's phase line)."""
        self._progress(message)

    def _t(self, node: NodeSpec) -> Transport:
        return self.transports[node.rank]

    def _parallel(self, nodes: Sequence[NodeSpec], fn: Callable[[NodeSpec], T]) -> list[T]:
        """``fn`` on every node at once; the first error (in rank order) is raised."""
        if not self.parallel:
            return [fn(n) for n in nodes]
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            futures = [pool.submit(fn, n) for n in nodes]
            return [f.result() for f in futures]

    def _each(self, nodes: Sequence[NodeSpec], fn: Callable[[NodeSpec], T]) -> list[T | NodeError]:
        """``fn`` on every node at once; a node's ``NodeError`` is its result, not raised."""

        def settled(node: NodeSpec) -> T | NodeError:
            try:
                return fn(node)
            except NodeError as e:
                return e

        return self._parallel(nodes, settled)

    def close(self) -> None:
        """Close every node's transport (SSH connections)."""
        for transport in self.transports.values():
            transport.close()

    def reach(self) -> dict[int, NodeError | None]:
        """Open every node's connection at once and run ``true`` on it: rank → its error, or
        None when it answered. Connections stay open for what follows."""
        nodes = sorted(self.cluster.nodes, key=lambda n: n.rank)
        results = self._each(
            nodes, lambda n: check(self._t(n).run(["true"], timeout=60), n, "reaching the node")
        )
        return {
            n.rank: r if isinstance(r, NodeError) else None
            for n, r in zip(nodes, results, strict=True)
        }

    def log_of(self, node: NodeSpec, max_bytes: int = 2_000_000) -> str:
        """The engine log of ``node`` ('' if none)."""
        return self._t(node).read_text(f"{node.workdir}/{LOG}", max_bytes=max_bytes)

    def logs(self, skip: Mapping[int, str] | None = None) -> dict[int, str]:
        """Every node's engine log, by rank, read at once (a node that cannot be read gives
        its error; ``skip`` maps ranks known to be unreachable to why, not tried again)."""
        skip = skip or {}
        nodes = sorted((n for n in self.cluster.nodes if n.rank not in skip), key=lambda n: n.rank)
        out = {rank: f"<log unavailable: {why}>" for rank, why in skip.items()}
        for n, r in zip(nodes, self._each(nodes, self.log_of), strict=True):
            out[n.rank] = f"<log unavailable: {r}>" if isinstance(r, NodeError) else r
        return dict(sorted(out.items()))

    def render(self, config: Config) -> dict[int, RenderedLauncher]:
        """Every node's launcher for ``config``.

        Raises:
            ProfileError, KnobError: the template or config cannot be rendered.
        """
        return {
            n.rank: render_node(self.launcher, self.space, config, self.cluster, n, self.runtime)
            for n in self.cluster.nodes
        }

    # ---- teardown ---------------------------------------------------------------------------
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
        # The connections are opened on every node at once: TCP, key exchange and
        # authentication are the slow part and have no order. The stops then run one at a
        # time, head first, each confirmed gone before the next: the reverse of the start
        # order, as the seeds' launchers stop. A headless rank whose head is gone exits on its
        # own, while a worker stopped under a live head makes the head die of NCCL errors
        # first, with logs that blame the wrong node. Over warm connections a stop that finds
        # nothing costs one round trip, so stopping at once would save little and lose the
        # order the nodes' journals show (0, 1, …, N-1). Once begun, no signal cuts it short.
        with self._unbroken():
            return self._stop_reached()

    def _stop_reached(self) -> tuple[dict[int, str], list[NodeError]]:
        reached = self.reach()
        outcomes: dict[int, str] = {}
        errors: list[NodeError] = []
        for node in sorted(self.cluster.nodes, key=lambda n: n.rank):
            unreachable = reached[node.rank]
            if unreachable is not None:
                outcomes[node.rank] = f"unreachable: {unreachable.message}"
                errors.append(unreachable)
                continue
            self._progress(f"stopping {node.name}")
            try:
                outcomes[node.rank] = self._stop(node)
            except NodeError as e:
                outcomes[node.rank] = f"failed: {e.message}"
                errors.append(e)
        return outcomes, errors

    def _stop(self, node: NodeSpec) -> str:
        grace = self.gates.stop_grace_s
        if self.gates.stop_hook is not None:
            values = placeholders(self.cluster, node, self.runtime)
            hook = [fill(t, values, f"stop hook of {node.name}") for t in self.gates.stop_hook]
            self._fence()
            self._t(node).run(journaled(node, marked(node, hook), "stop-hook"), timeout=grace + 60)
        stop = journaled(node, stop_command(node, grace), "stop")
        self._fence()
        result = self._t(node).run(stop, timeout=grace + 30)
        check(result, node, "stopping the engine")
        lines = result.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    def alive(self, node: NodeSpec) -> bool:
        """Whether the node's engine process group is alive."""
        return self._t(node).run(alive_command(node), timeout=30).returncode == 0

    def disk_free(self, node: NodeSpec) -> tuple[int, int] | None:
        """KiB free and KiB in all on the filesystem of ``node``'s workdir (``df -P``); None
        where the node cannot be asked or its ``df`` prints something else."""
        try:
            result = self._t(node).run(["df", "-Pk", "--", node.workdir], timeout=30)
        except NodeError:
            return None
        fields = result.stdout.strip().splitlines()[-1].split() if result.stdout.strip() else []
        if result.returncode != 0 or len(fields) < 4 or not all(f.isdigit() for f in fields[1:4]):
            return None
        return int(fields[3]), int(fields[1])

    def logged_fault(self, message: str) -> DeployError | None:
        """After a bench cell failed (``message``): the node's own failure a log names since the
        boot came up, if one does (a GPU or its driver, a full disk: ``INFRASTRUCTURE``), the
        head's log read first. What a node logged while it booted (a warning about the hub on
        an air-gapped node, a cache it could not write) and a worker gone (``worker_missing``:
        a head logs that too when a worker died of the config's own failure) are not read."""
        return self._blame.named(
            message, self.cluster.head, INFRASTRUCTURE - {"worker_missing"}, log_of=self._since_up
        )

    def died_measuring(self, cell: str) -> DeployError | None:
        """After bench cell ``cell`` failed: an engine found dead since the boot came up, judged
        as at boot (``Blame.lost``) on what each log says since then: a worker lost with no
        failure of its own (killed, its node gone) is ``worker_missing``, the node's, however
        the head's requests failed for it; a node whose log names a config's failure (an OOM
        at this concurrency) is that; a head dead of nothing it names, ``bench_failed``.
        None while every engine lives."""
        dead = [n for n in self.cluster.nodes if not self.alive(n)]
        if not dead:
            return None
        return self._blamer(self._since_up).lost(
            dead[0], f"while cell {cell} was measured", default="bench_failed"
        )

    def stopped_engine(self, message: str) -> DeployError | None:
        """After bench cell failed (``message``): ``engine_stopped`` on the first node whose
        engine has a process found stopped (``Blame.stopped``), else None."""
        return self._blame.stopped(message)

    def _blamer(self, log_of: Callable[[NodeSpec], str]) -> Blame:
        """A ``Blame`` that reads each node's log with ``log_of`` and asks the node the rest."""
        return Blame(
            self.cluster,
            self.gates,
            log_of=log_of,
            alive=self.alive,
            disk_free=self.disk_free,
            stopped_of=lambda n: engine_process.stopped(self._t(n), n, self._container(n)),
            killed_of=lambda n: engine_process.killed_by(self._t(n), n, self._container(n)),
        )

    def _container(self, node: NodeSpec) -> str | None:
        """The container ``node``'s engine runs in, if its launcher names one."""
        return engine_process.container_of(
            self.launcher, self.gates.stop_hook, self.cluster, node, self.runtime
        )

    def _since_up(self, node: NodeSpec) -> str:
        """``node``'s log since the last boot came up (all of its tail when the mark is gone)."""
        log = self.log_of(node)
        mark = self._up_marks.get(node.rank, "")
        at = log.rfind(mark) if mark else -1
        return log[at + len(mark) :] if at >= 0 else log

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

    # ---- boot -------------------------------------------------------------------------------
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
        ensure_ports_free(self.cluster, self._t(self.cluster.head))  # issue #17: none foreign
        clocks = self.preflight()

        def upload(node: NodeSpec) -> None:
            self._t(node).put_text(
                f"{node.workdir}/{SCRIPT}", launchers[node.rank].script, mode=0o755
            )

        keep_ports(self.cluster)  # the pair these engines take, for the commands after
        self._progress("uploading launchers")
        self._fence()  # the new owner's launchers are not replaced either
        self._parallel(self.cluster.nodes, upload)
        order: list[int] = []
        for node in self.cluster.workers_desc:
            self._progress(f"starting {node.name} (worker)")
            self._start(node)
            order.append(node.rank)
            self._await_worker(node)
        head = self.cluster.head
        self._progress(f"starting {head.name} (head)")
        self._start(head)
        order.append(0)
        self._await_health(config)
        self._progress("smoke generation")
        text = self._smoke_check()
        self._log_gates()
        return DeployResult(
            launchers=launchers,
            start_order=tuple(order),
            clocks=tuple(clocks),
            boot_seconds=time.monotonic() - started,
            smoke_text=text,
        )

    def _start(self, node: NodeSpec) -> None:
        start = journaled(node, start_command(node), "start")
        self._fence()
        result = self._t(node).run(start, timeout=60)
        if result.returncode != 0 or not result.stdout.strip().isdigit():
            raise DeployError(
                f"{node.name}: the launcher did not start",
                failure_class="start",
                rank=node.rank,
                host=node.host,
                command=result.command,
                returncode=result.returncode,
                stderr_tail=tail(result.stderr, 15),
            )
        # issue #4: the start command returns once the engine is forked, a moment before the
        # engine has made itself a process group (setsid), which is what `alive` checks. Over
        # a fast transport the next check can land in that moment and call a live engine
        # dead, so the group must be seen once before the engine counts as started.
        deadline = time.monotonic() + START_CONFIRM_S
        while not self.alive(node):
            if time.monotonic() > deadline:
                raise self._blame.died(node, f"within {START_CONFIRM_S:g}s of its start")
            time.sleep(0.02)

    def _await_worker(self, node: NodeSpec) -> None:
        pattern = self.gates.worker_ready_line
        deadline = time.monotonic() + self.gates.worker_ready_timeout_s
        while True:
            if not self.alive(node):
                raise self._blame.died(node, "while starting")
            if pattern is None or re.search(pattern, self.log_of(node, 200_000)):
                return
            if time.monotonic() > deadline:
                raise self._blame.hung(
                    node,
                    f"{node.name}: no ready line /{pattern}/ within "
                    f"{self.gates.worker_ready_timeout_s:g}s",
                    "start",
                )
            time.sleep(self.gates.poll_s)

    def _await_health(self, config: Config) -> None:
        head = self.cluster.head
        url = self.cluster.base_url + self.gates.health_path
        deadline = time.monotonic() + self.gates.boot_timeout_s
        last_size = -1
        last_growth = time.monotonic()
        polls = 0
        self._progress("waiting for /health")
        # the head is polled directly, as the bench client talks to it: never through a proxy
        # the controller's environment names for the rest of its traffic
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                try:
                    if client.get(url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                polls += 1
                for node in [head, *self.cluster.workers_desc] if polls % 4 == 1 else [head]:
                    if not self.alive(node):
                        raise self._blame.lost(node)
                size = len(self.log_of(head, 2_000_000))
                now = time.monotonic()
                if size != last_size:
                    last_size, last_growth = size, now
                elif self.gates.stall_s is not None and now - last_growth > self.gates.stall_s:
                    raise self._blame.hung(
                        head,
                        f"{head.name}: boot wedged: no progress in the log for "
                        f"{self.gates.stall_s:g}s and /health never 200 (config {config.key})",
                        "boot_wedge",
                    )
                if now > deadline:
                    raise self._blame.hung(
                        head,
                        f"{head.name}: /health not 200 within {self.gates.boot_timeout_s:g}s",
                        "boot_timeout",
                    )
                time.sleep(self.gates.poll_s)

    # ---- after a failure (issue #4) ---------------------------------------------------------
    def restore(self, config: Config) -> DeployResult:
        """Boot ``config`` (the champion) again after a failure; if that fails too, every node
        is torn down again.

        Raises:
            DeployError, NodeError: the restore itself failed.
        """
        self._progress("restoring the champion")
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
            self._progress(f"deploy failed ({failure.failure_class}): tearing down every node")
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
            progress, self._progress = self._progress, _silent
            try:
                with contextlib.suppress(Exception):
                    self.teardown()
            finally:
                self._progress = progress
            raise

    def _smoke_check(self) -> str:
        head = self.cluster.head
        try:
            text = self._smoke(
                self.cluster.base_url,
                self.model,
                self.gates.smoke_prompt,
                self.gates.smoke_max_tokens,
            )
        except Exception as e:  # the bench client's errors and any transport error alike
            message = f"{head.name}: /health is 200 but a greedy generation failed: {e}"
            # a rank stopped (SIGSTOP, a suspended host) holds the group: the node's
            stopped = self._blame.stopped(message)
            if stopped is not None:
                raise stopped from e
            raise DeployError(
                message,
                failure_class="smoke_failed",
                rank=0,
                host=head.host,
                log_tail=tail(self.log_of(head), 15),
            ) from e
        if not text.strip():
            raise DeployError(
                f"{head.name}: /health is 200 but the greedy generation was empty",
                failure_class="smoke_failed",
                rank=0,
                host=head.host,
            )
        return text

    def _log_gates(self) -> None:
        logs = dict(
            zip(
                [n.rank for n in self.cluster.nodes],
                self._parallel(self.cluster.nodes, self.log_of),
                strict=True,
            )
        )
        # each log's last lines as the boot came up: what a node logs after them is what a
        # failure in the cells is read by (``logged_fault``), never the boot's own warnings
        self._up_marks = {rank: log[-UP_MARK_BYTES:] for rank, log in logs.items()}
        for node in self.cluster.nodes:
            log = logs[node.rank]
            for pattern in self.gates.must_not_log:
                hit = re.search(pattern, log)
                if hit:
                    raise DeployError(
                        f"{node.name}: boot log has a forbidden line: "
                        f"{_line_of(log, hit.start())!r}",
                        failure_class="gate_failed",
                        rank=node.rank,
                        host=node.host,
                    )
        head_log = logs[0]
        for pattern in self.gates.must_log:
            if not re.search(pattern, head_log):
                raise DeployError(
                    f"node-0: boot log lacks a required line /{pattern}/",
                    failure_class="gate_failed",
                    rank=0,
                    host=self.cluster.head.host,
                    log_tail=tail(head_log, 15),
                )


def _silent(message: str) -> None:
    """A progress that shows nothing."""


def _open() -> None:
    """A fence that lets every command through (a deployer that holds no lease)."""


def _line_of(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start : end if end >= 0 else len(text)]
