"""Deploy and teardown: stop everything → preflight → workers N-1…1 → head → /health →
a greedy smoke generation → boot-log gates. Every failure is a typed ``DeployError``."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field

from cluster.errors import DeployError, FailureClass, NodeError, tail
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import (
    LOG,
    SCRIPT,
    LauncherSpec,
    RenderedLauncher,
    alive_command,
    fill,
    placeholders,
    render_node,
    start_command,
    stop_command,
)
from cluster.transport import Transport, check
from knobs.config import Config
from knobs.records import NodeClockRecord
from knobs.space import KnobSpace

T = TypeVar("T")

DEFAULT_FAILURE_PATTERNS: dict[FailureClass, tuple[str, ...]] = {
    "oom": (r"out of memory", r"OutOfMemoryError", r"CUDA error: out of memory"),
    "worker_missing": (
        r"timed out waiting for .*worker",
        r"rendezvous .*timed out",
        r"lost .*worker",
    ),
}


class GateSpec(BaseModel):
    """How a boot is judged good: timeouts, readiness, smoke generation, log gates, clocks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    boot_timeout_s: float = Field(default=120.0, gt=0)
    stall_s: float | None = Field(
        default=None,
        gt=0,
        description="no new head log output for this long while not healthy: wedge",
    )
    poll_s: float = Field(default=0.25, gt=0)
    worker_ready_line: str | None = Field(
        default=None, description="regex a worker's log prints once it is up"
    )
    worker_ready_timeout_s: float = Field(default=30.0, gt=0)
    stop_grace_s: float = Field(default=10.0, gt=0)
    health_path: str = "/health"
    smoke_prompt: str = "The capital of France is"
    smoke_max_tokens: int = Field(default=8, ge=1, le=256)
    must_log: tuple[str, ...] = ()
    must_not_log: tuple[str, ...] = ()
    failure_patterns: dict[FailureClass, tuple[str, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_FAILURE_PATTERNS)
    )
    clocks_command: tuple[str, ...] | None = Field(
        default=None, description="argv printing JSON {sm_clock_mhz, matmul_rate} on a node"
    )
    min_matmul_rate: float = Field(default=0.9, gt=0)
    recover_command: tuple[str, ...] | None = Field(
        default=None, description="argv that power-cycles a node whose clocks are stuck"
    )


class DeployResult(BaseModel):
    """A healthy boot: what was rendered and the evidence that it is good."""

    model_config = ConfigDict(frozen=True)

    launchers: dict[int, RenderedLauncher]
    start_order: tuple[int, ...]
    clocks: tuple[NodeClockRecord, ...]
    boot_seconds: float
    smoke_text: str


Progress = Callable[[str], None]


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
    ) -> None:
        self.cluster = cluster
        self.launcher = launcher
        self.space = space
        self.gates = gates
        self.transports = dict(transports)
        self.model = model
        self.runtime = dict(runtime)
        self._smoke = smoke
        self._progress = progress or (lambda _msg: None)

    # ---- helpers ----------------------------------------------------------------------------
    def _t(self, node: NodeSpec) -> Transport:
        return self.transports[node.rank]

    def _parallel(self, nodes: Sequence[NodeSpec], fn: Callable[[NodeSpec], T]) -> list[T]:
        """``fn`` on every node at once; the first error (in rank order) is raised."""
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            futures = [pool.submit(fn, n) for n in nodes]
            return [f.result() for f in futures]

    def log_of(self, node: NodeSpec, max_bytes: int = 2_000_000) -> str:
        """The engine log of ``node`` ('' if none)."""
        return self._t(node).read_text(f"{node.workdir}/{LOG}", max_bytes=max_bytes)

    def logs(self) -> dict[int, str]:
        """Every node's engine log, by rank (a node that cannot be read gives its error)."""
        out: dict[int, str] = {}
        for node in self.cluster.nodes:
            try:
                out[node.rank] = self.log_of(node)
            except NodeError as e:
                out[node.rank] = f"<log unavailable: {e}>"
        return out

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
        order), each confirmed gone before the next.

        Raises:
            NodeError: a node could not be reached or its engine would not die.
        """
        out: dict[int, str] = {}
        for node in sorted(self.cluster.nodes, key=lambda n: n.rank):
            self._progress(f"stopping {node.name}")
            result = self._t(node).run(
                stop_command(node, self.gates.stop_grace_s), timeout=self.gates.stop_grace_s + 30
            )
            check(result, node, "stopping the engine")
            out[node.rank] = result.stdout.strip()
        return out

    def alive(self, node: NodeSpec) -> bool:
        """Whether the node's engine process group is alive."""
        return self._t(node).run(alive_command(node), timeout=30).returncode == 0

    # ---- preflight --------------------------------------------------------------------------
    def clocks(self) -> list[NodeClockRecord]:
        """Every node's clocks, read in parallel (empty when the profile has no clocks query).

        Raises:
            NodeError: the query failed or printed something unreadable.
        """
        command = self.gates.clocks_command
        if command is None:
            return []

        def one(node: NodeSpec) -> NodeClockRecord:
            values = placeholders(self.cluster, node, self.runtime)
            argv = [fill(t, values, f"clocks query of {node.name}") for t in command]
            result = check(self._t(node).run(argv, timeout=60), node, "the clocks query")
            try:
                data = json.loads(result.stdout.strip().splitlines()[-1])
                return NodeClockRecord(
                    rank=node.rank,
                    sm_clock_mhz=float(data["sm_clock_mhz"]),
                    matmul_rate=float(data["matmul_rate"]),
                )
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise NodeError(
                    f"{node.name}: the clocks query printed {tail(result.stdout, 2)!r}, "
                    "expected JSON with sm_clock_mhz and matmul_rate",
                    failure_class="gate_failed",
                    rank=node.rank,
                    host=node.host,
                    command=result.command,
                ) from e

        return self._parallel(self.cluster.nodes, one)

    def preflight(self) -> list[NodeClockRecord]:
        """Clocks gate on every node; a stuck node is power-cycled when the profile can.

        Raises:
            DeployError: clocks_stuck (with the node and its rate).
        """
        self._progress("preflight: clocks on every node")
        clocks = self.clocks()
        stuck = [c for c in clocks if c.matmul_rate < self.gates.min_matmul_rate]
        if stuck and self.gates.recover_command is not None:
            for record in stuck:
                node = self.cluster.by_rank(record.rank)
                self._progress(f"preflight: power-cycling {node.name} (clocks stuck)")
                values = placeholders(self.cluster, node, self.runtime)
                argv = [
                    fill(t, values, f"recover of {node.name}") for t in self.gates.recover_command
                ]
                check(self._t(node).run(argv, timeout=600), node, "the power cycle")
            clocks = self.clocks()
            stuck = [c for c in clocks if c.matmul_rate < self.gates.min_matmul_rate]
        if stuck:
            first = stuck[0]
            node = self.cluster.by_rank(first.rank)
            raise DeployError(
                f"{node.name}: clocks stuck (matmul rate {first.matmul_rate:.2f} < "
                f"{self.gates.min_matmul_rate:.2f}, sm clock {first.sm_clock_mhz:.0f} MHz)",
                failure_class="clocks_stuck",
                rank=node.rank,
                host=node.host,
            )
        return clocks

    # ---- boot -------------------------------------------------------------------------------
    def deploy(self, config: Config) -> DeployResult:
        """Boot ``config`` on every node. The caller tears down on failure (``stop_all``).

        Raises:
            DeployError: with its failure class and evidence.
            NodeError: a node could not be reached.
        """
        started = time.monotonic()
        launchers = self.render(config)
        self.stop_all()
        clocks = self.preflight()

        def upload(node: NodeSpec) -> None:
            self._t(node).put_text(
                f"{node.workdir}/{SCRIPT}", launchers[node.rank].script, mode=0o755
            )

        self._progress("uploading launchers")
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
        result = self._t(node).run(start_command(node), timeout=60)
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

    def _died(self, node: NodeSpec, what: str, *, default: FailureClass = "start") -> DeployError:
        log = self.log_of(node)
        failure = default
        for cls, patterns in self.gates.failure_patterns.items():
            if any(re.search(p, log, re.IGNORECASE) for p in patterns):
                failure = cls
                break
        return DeployError(
            f"{node.name}: engine exited {what}",
            failure_class=failure,
            rank=node.rank,
            host=node.host,
            log_tail=tail(log, 25),
        )

    def _await_worker(self, node: NodeSpec) -> None:
        pattern = self.gates.worker_ready_line
        deadline = time.monotonic() + self.gates.worker_ready_timeout_s
        while True:
            if not self.alive(node):
                raise self._died(node, "while starting")
            if pattern is None or re.search(pattern, self.log_of(node, 200_000)):
                return
            if time.monotonic() > deadline:
                raise DeployError(
                    f"{node.name}: no ready line /{pattern}/ within "
                    f"{self.gates.worker_ready_timeout_s:g}s",
                    failure_class="start",
                    rank=node.rank,
                    host=node.host,
                    log_tail=tail(self.log_of(node), 25),
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
        with httpx.Client(timeout=5.0) as client:
            while True:
                try:
                    if client.get(url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                polls += 1
                for node in [head, *self.cluster.workers_desc] if polls % 4 == 1 else [head]:
                    if not self.alive(node):
                        lost: FailureClass = "start" if node.rank == 0 else "worker_missing"
                        raise self._died(node, "before /health was 200", default=lost)
                size = len(self.log_of(head, 2_000_000))
                now = time.monotonic()
                if size != last_size:
                    last_size, last_growth = size, now
                elif self.gates.stall_s is not None and now - last_growth > self.gates.stall_s:
                    raise DeployError(
                        f"{head.name}: boot wedged: no progress in the log for "
                        f"{self.gates.stall_s:g}s and /health never 200 (config {config.key})",
                        failure_class="boot_wedge",
                        rank=0,
                        host=head.host,
                        log_tail=tail(self.log_of(head), 25),
                    )
                if now > deadline:
                    raise DeployError(
                        f"{head.name}: /health not 200 within {self.gates.boot_timeout_s:g}s",
                        failure_class="boot_timeout",
                        rank=0,
                        host=head.host,
                        log_tail=tail(self.log_of(head), 25),
                    )
                time.sleep(self.gates.poll_s)

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
            raise DeployError(
                f"{head.name}: /health is 200 but a greedy generation failed: {e}",
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
        for node in self.cluster.nodes:
            log = self.log_of(node)
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
        head_log = self.log_of(self.cluster.head)
        for pattern in self.gates.must_log:
            if not re.search(pattern, head_log):
                raise DeployError(
                    f"node-0: boot log lacks a required line /{pattern}/",
                    failure_class="gate_failed",
                    rank=0,
                    host=self.cluster.head.host,
                    log_tail=tail(head_log, 15),
                )


def _line_of(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start : end if end >= 0 else len(text)]
