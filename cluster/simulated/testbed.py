"""A simulated cluster: the twin's landscape without processes or HTTP.

Each ``deploy`` draws a boot factor (boot-to-boot spread) and fails the way the engine would
(out of memory, a wedge); each node may come up with its clocks stuck, at the landscape's
``stuck_clock_probability`` per node and boot, and the tensor-parallel group then runs at that
node's pace for the whole boot (as the twin's engine does; the next boot's preflight
power-cycles it, so every boot draws afresh). Each ``bench`` draws a cell from the landscape's
noise model and reports every node's clocks. The research benchmark runs thousands of
experiments through the real round loop on it.

The landscape has no drift; ``StepDrift`` injects one (every boot after the N-th runs at a
factor of the speed: the cluster changed under the loop), for checking the drift sentinel.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cluster.errors import DeployError, NodeError
from cluster.twin.landscape import Landscape
from cluster.twin.node import sm_clock_mhz
from cluster.twin.noise import stuck_at_boot
from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec, NodeClockRecord
from knobs.vocabulary import FailureClass


@dataclass(frozen=True)
class StepDrift:
    """Every boot after the ``after_boot``-th runs at ``factor`` × the landscape's speed."""

    factor: float
    after_boot: int

    def at(self, boot: int) -> float:
        """The speed factor of boot number ``boot`` (1 for the first)."""
        return self.factor if boot > self.after_boot else 1.0


class SimulatedTestbed:
    """A ``Testbed`` backed by a landscape's performance and noise model (``drift``: a step
    injected into it, none by default)."""

    def __init__(self, landscape: Landscape, seed: int, drift: StepDrift | None = None) -> None:
        self.landscape = landscape
        self.seed = seed
        self.drift = drift
        self.rng = random.Random(seed)
        self.boots = 0
        self.stuck_boots = 0  # boots with a node's clocks stuck
        self._config: Config | None = None
        self._factor = 1.0
        self._rates: tuple[float, ...] = ()

    def deploy(self, config: Config) -> dict[int, str]:
        """A simulated boot.

        Raises:
            DeployError: the landscape says this config does not boot (oom, kv_capacity,
                boot_wedge).
        """
        self.boots += 1
        self._config = None
        status, reason = self.landscape.boot_status(self.landscape.settings(config))
        if status != "ok":
            failure: FailureClass = (
                "oom"
                if status == "oom"
                else "kv_capacity"
                if status == "kv_capacity"
                else "boot_wedge"
            )
            raise DeployError(f"simulated boot failed: {reason}", failure_class=failure, rank=0)
        self._config = config
        self._factor = self.landscape.draw_boot_factor(self.rng)
        if self.drift is not None:
            self._factor *= self.drift.at(self.boots)
        noise = self.landscape.noise
        # the twin's own draw (a pure function of seed, node and boot), apart from the boot
        # and run noise: the same seed draws the same noise with or without stuck clocks
        self._rates = tuple(
            noise.stuck_clock_rate
            if stuck_at_boot(self.seed, rank, self.boots, noise.stuck_clock_probability)
            else 1.0
            for rank in range(self.landscape.topology.nnodes)
        )
        self.stuck_boots += min(self._rates) < 1.0
        return {0: f"# simulated launcher for {config.to_json()}\n"}

    def bench(self, cell: CellSpec) -> CellResultRecord:
        """One noisy cell.

        Raises:
            NodeError: nothing is deployed (class bench_failed).
        """
        if self._config is None:
            raise NodeError("nothing deployed", failure_class="bench_failed")
        # the group runs at its slowest node's pace
        factor = self._factor * min(self._rates, default=1.0)
        record = self.landscape.sample(self._config, cell, self.rng, factor)
        if record is None:
            raise NodeError("the config does not serve", failure_class="bench_failed")
        clocks = tuple(
            NodeClockRecord(rank=rank, sm_clock_mhz=sm_clock_mhz(rate), matmul_rate=rate)
            for rank, rate in enumerate(self._rates)
        )
        return record.model_copy(update={"clocks": clocks})

    def logs(self) -> dict[int, str]:
        """No logs in a simulation."""
        return {}

    def stop_all(self) -> None:
        """Nothing runs."""
        self._config = None

    def restore(self, config: Config) -> None:
        """A simulated champion boot."""
        self.deploy(config)
