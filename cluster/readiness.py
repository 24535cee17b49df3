"""The boot's gates, step by step, once every node's launcher is in place: an engine started
and seen alive, a worker's ready line, the head's ``/health`` (or its log stalled, or its
timeout), a greedy smoke generation, the boot-log gates; and where each node's log stood as
the boot came up, so that a failure in the cells is read from what was logged after it.

It owns when a step has passed and what a step that did not is called (a ``DeployError`` of
its class; which node is blamed is ``cluster.blame``'s). The order of the steps is
``Deployer.deploy``'s.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx

from cluster.blame import Blame
from cluster.errors import DeployError, tail
from cluster.gates import GateSpec
from cluster.inventory import NodeSpec
from cluster.launcher import journaled, start_command, started
from cluster.nodes import Nodes
from knobs.config import Config

#: How long a started engine may take to be seen alive (issue #4; see ``Boot.start``).
START_CONFIRM_S = 5.0
#: How much of each node's log, as the boot came up, marks where a failure in the cells is
#: read from (``Boot.since_up``).
UP_MARK_BYTES = 4096

#: The greedy smoke generation: (base URL, model, prompt, max tokens) → its text.
Smoke = Callable[[str, str, str, int], str]


class Boot:
    """The gates of one cluster's boots, over its nodes."""

    def __init__(
        self, nodes: Nodes, gates: GateSpec, blame: Blame, *, model: str, smoke: Smoke
    ) -> None:
        self.nodes = nodes
        self.cluster = nodes.cluster
        self.gates = gates
        self.model = model
        self._blame = blame
        self._smoke = smoke
        #: by rank, the end of each node's log as the last boot came up (``log_gates``)
        self._up_marks: dict[int, str] = {}
        #: by rank, the engine this process last started there: its process group's pid and
        #: start time (``launcher.started``), what ``teardown.stop_started`` stops by
        self.started: dict[int, tuple[int, str]] = {}

    def start(self, node: NodeSpec) -> None:
        """Start ``node``'s launcher and see its engine alive.

        Raises:
            DeployError: the launcher did not start (``start``), or its engine died at once.
            NodeError: the node could not be reached.
        """
        start = journaled(node, start_command(node), "start")
        self.nodes.fence()
        result = self.nodes.transport(node).run(start, timeout=60)
        engine = started(result.stdout)
        if result.returncode != 0 or engine is None:
            raise DeployError(
                f"{node.name}: the launcher did not start",
                failure_class="start",
                rank=node.rank,
                host=node.host,
                command=result.command,
                returncode=result.returncode,
                stderr_tail=tail(result.stderr, 15),
            )
        self.started[node.rank] = engine
        # issue #4: the start command returns once the engine is forked, a moment before the
        # engine has made itself a process group (setsid), which is what `alive` checks. Over
        # a fast transport the next check can land in that moment and call a live engine
        # dead, so the group must be seen once before the engine counts as started.
        deadline = time.monotonic() + START_CONFIRM_S
        while not self.nodes.alive(node):
            if time.monotonic() > deadline:
                raise self._blame.died(node, f"within {START_CONFIRM_S:g}s of its start")
            time.sleep(0.02)

    def await_worker(self, node: NodeSpec) -> None:
        """Wait for worker ``node``'s ready line (the profile's), its engine alive meanwhile.

        Raises:
            DeployError: the engine died, or no ready line came in time.
            NodeError: the node could not be reached.
        """
        pattern = self.gates.worker_ready_line
        deadline = time.monotonic() + self.gates.worker_ready_timeout_s
        while True:
            if not self.nodes.alive(node):
                raise self._blame.died(node, "while starting")
            if pattern is None or re.search(pattern, self.nodes.log_of(node, 200_000)):
                return
            if time.monotonic() > deadline:
                raise self._blame.hung(
                    node,
                    f"{node.name}: no ready line /{pattern}/ within "
                    f"{self.gates.worker_ready_timeout_s:g}s",
                    "start",
                )
            time.sleep(self.gates.poll_s)

    def await_health(self, config: Config) -> None:
        """Wait for the head's ``/health`` to answer 200, every engine alive meanwhile.

        Raises:
            DeployError: an engine died, the head's log stalled (``boot_wedge``) or the boot
                took too long (``boot_timeout``).
            NodeError: a node could not be reached.
        """
        head = self.cluster.head
        url = self.cluster.base_url + self.gates.health_path
        deadline = time.monotonic() + self.gates.boot_timeout_s
        last_size = -1
        last_growth = time.monotonic()
        polls = 0
        self.nodes.progress("waiting for /health")
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
                    if not self.nodes.alive(node):
                        raise self._blame.lost(node)
                size = len(self.nodes.log_of(head, 2_000_000))
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
                    raise self._blame.hung(head, self._timed_out(now - last_growth), "boot_timeout")
                time.sleep(self.gates.poll_s)

    def _timed_out(self, quiet_s: float) -> str:
        """A boot past ``gates.boot_timeout_s`` in words, naming the key: a head whose log was
        still growing (within the last ten polls, at least 5 s) was loading, not broken, and a
        stack that boots in twenty minutes needs a longer limit than a hand-written profile's
        two-minute default."""
        head, limit = self.cluster.head.name, self.gates.boot_timeout_s
        if quiet_s <= max(5.0, 10 * self.gates.poll_s):
            return (
                f"{head}: /health not 200 within {limit:g}s while its log was still growing: "
                "the engine may need longer to boot; raise gates.boot_timeout_s if a boot of "
                "this stack takes more"
            )
        return (
            f"{head}: /health not 200 within {limit:g}s (gates.boot_timeout_s); its log last "
            f"grew {quiet_s:.0f}s before"
        )

    def smoke_check(self) -> str:
        """The greedy smoke generation's text.

        Raises:
            DeployError: the generation failed or was empty (``smoke_failed``), or a rank was
                found stopped (``engine_stopped``).
        """
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
                log_tail=tail(self.nodes.log_of(head), 15),
            ) from e
        if not text.strip():
            raise DeployError(
                f"{head.name}: /health is 200 but the greedy generation was empty",
                failure_class="smoke_failed",
                rank=0,
                host=head.host,
            )
        return text

    def log_gates(self) -> None:
        """Mark where every node's log stands, then apply the boot-log gates to it.

        Raises:
            DeployError: a log has a forbidden line, or the head's lacks a required one
                (``gate_failed``).
            NodeError: a node could not be reached.
        """
        logs = dict(
            zip(
                [n.rank for n in self.cluster.nodes],
                self.nodes.on_every(self.cluster.nodes, self.nodes.log_of),
                strict=True,
            )
        )
        # each log's last lines as the boot came up: what a node logs after them is what a
        # failure in the cells is read by (``Deployer.logged_fault``), never the boot's own
        # warnings
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

    def since_up(self, node: NodeSpec) -> str:
        """``node``'s log since the last boot came up (all of its tail when the mark is gone)."""
        log = self.nodes.log_of(node)
        mark = self._up_marks.get(node.rank, "")
        at = log.rfind(mark) if mark else -1
        return log[at + len(mark) :] if at >= 0 else log


def _line_of(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start : end if end >= 0 else len(text)]
