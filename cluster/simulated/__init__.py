"""The research testbed: a simulated cluster drawn from a twin landscape, without processes or HTTP.

``SimulatedTestbed`` (``cluster.simulated.testbed``) is the ``Testbed`` the research benchmark
(``bench/research.py``) runs thousands of experiments on. It uses the twin's model
(``cluster.twin.landscape``, ``node``, ``noise``) and ``cluster.errors``; it never drives a node
(no transport, SSH, deploy or bench client), which the import contracts in pyproject.toml check.
"""

from __future__ import annotations

from cluster.simulated.testbed import SimulatedTestbed, StepDrift

__all__ = ["SimulatedTestbed", "StepDrift"]
