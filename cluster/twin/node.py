"""A node's persistent "hardware" state: its boot counter and whether its clocks are stuck.

It lives in ``TWIN_NODE_DIR/node.json`` and survives engine restarts, as a stuck GB10 clock
survives everything but a power cycle. Without a node directory the state is fresh each time.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.errors import OrchestrateError

#: Nominal SM clock the twin reports for a healthy node (an assumption; see docs/twin.md).
NOMINAL_SM_CLOCK_MHZ = 2418.0

#: The variable that names a node's directory (the state file's home).
ENV_NODE_DIR = "TWIN_NODE_DIR"
STATE_FILE = "node.json"


class NodeStateError(OrchestrateError):
    """The node directory cannot be read or written; carries the path."""

    exit_code = 6

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


@dataclass
class NodeState:
    """What a node remembers between boots."""

    boots: int = 0
    stuck: bool = False
    stuck_rate: float = 1.0
    stuck_since_boot: int | None = None
    power_cycles: int = 0

    @property
    def matmul_rate(self) -> float:
        """The node's matmul rate relative to nominal (1.0 healthy)."""
        return self.stuck_rate if self.stuck else 1.0

    @property
    def sm_clock_mhz(self) -> float:
        """The node's SM clock."""
        return sm_clock_mhz(self.matmul_rate)


def sm_clock_mhz(matmul_rate: float) -> float:
    """The SM clock of a node whose matmul rate is ``matmul_rate`` of nominal."""
    return round(NOMINAL_SM_CLOCK_MHZ * matmul_rate, 1)


def node_dir(value: str | None) -> Path | None:
    """The node directory from ``TWIN_NODE_DIR`` (``None`` when unset or empty)."""
    return Path(value) if value else None


def load(directory: Path | None) -> NodeState:
    """The node's state (a fresh one when there is no directory or no state yet).

    Raises:
        NodeStateError: the state file exists but cannot be read or parsed.
    """
    if directory is None:
        return NodeState()
    path = directory / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return NodeState()
    except OSError as e:
        raise NodeStateError(f"cannot read {path}: {e.strerror}", path=str(path)) from None
    try:
        data = json.loads(text)
        return NodeState(**{k: v for k, v in data.items() if k in NodeState.__dataclass_fields__})
    except (ValueError, TypeError) as e:
        raise NodeStateError(f"{path} is not a node state file: {e}", path=str(path)) from None


def save(directory: Path | None, state: NodeState) -> None:
    """Write the node's state atomically (no-op without a directory).

    Raises:
        NodeStateError: the directory cannot be created or written.
    """
    if directory is None:
        return
    path = directory / STATE_FILE
    tmp = directory / f".{STATE_FILE}.{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(asdict(state), sort_keys=True))
        tmp.replace(path)
    except OSError as e:
        raise NodeStateError(f"cannot write {path}: {e.strerror}", path=str(path)) from None


def matmul_check(rate: float) -> dict[str, float]:
    """Run a short real matmul loop and report the node's clocks scaled by its state.

    The loop is real work (a 24×24 product in pure Python, a few milliseconds) so the query
    costs what a small GPU check costs; the reported rate is the node's state, not the CPU's.
    """
    n = 24
    a = [[(i * n + j) % 7 / 7.0 for j in range(n)] for i in range(n)]
    start = time.perf_counter()
    product = [[sum(a[i][k] * a[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    elapsed = time.perf_counter() - start
    assert product[0][0] >= 0 and elapsed >= 0
    return {"sm_clock_mhz": round(NOMINAL_SM_CLOCK_MHZ * rate, 1), "matmul_rate": round(rate, 4)}
