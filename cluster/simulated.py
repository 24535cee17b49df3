"""A simulated cluster: the twin's landscape without processes or HTTP.

Each ``deploy`` draws a boot factor (boot-to-boot spread) and fails the way the engine would
(out of memory, a wedge); each ``bench`` draws a cell from the landscape's noise model. The
research benchmark runs thousands of experiments through the real round loop on it.
"""

from __future__ import annotations

import random

from cluster.errors import DeployError, FailureClass, NodeError
from cluster.twin.landscape import Landscape
from knobs.config import Config
from knobs.records import CellResultRecord, CellSpec


class SimulatedTestbed:
    """A ``Testbed`` backed by a landscape's performance and noise model."""

    def __init__(self, landscape: Landscape, seed: int) -> None:
        self.landscape = landscape
        self.rng = random.Random(seed)
        self.boots = 0
        self._config: Config | None = None
        self._factor = 1.0

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
        return {0: f"# simulated launcher for {config.to_json()}\n"}

    def bench(self, cell: CellSpec) -> CellResultRecord:
        """One noisy cell.

        Raises:
            NodeError: nothing is deployed (class bench_failed).
        """
        if self._config is None:
            raise NodeError("nothing deployed", failure_class="bench_failed")
        record = self.landscape.sample(self._config, cell, self.rng, self._factor)
        if record is None:
            raise NodeError("the config does not serve", failure_class="bench_failed")
        return record

    def logs(self) -> dict[int, str]:
        """No logs in a simulation."""
        return {}

    def stop_all(self) -> None:
        """Nothing runs."""
        self._config = None

    def restore(self, config: Config) -> None:
        """A simulated champion boot."""
        self.deploy(config)
