"""Settings: the profile, then ``ORCHESTRATE_*`` environment variables, then flags."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cluster.twin import models_dir
from orchestrator.engines import placeholders as engine_placeholders
from orchestrator.errors import UsageError
from orchestrator.profile import Profile

DEFAULT_LEDGER = "sqlite:///orchestrate.db"
DEFAULT_MLFLOW = "sqlite:///mlflow.db"


@dataclass(frozen=True)
class Settings:
    """Where the ledger and MLflow live, resolved once at the CLI and passed down."""

    ledger_url: str
    mlflow_uri: str
    artifact_root: Path | None

    @classmethod
    def resolve(cls, profile: Profile | None) -> Settings:
        """Profile values, overridden by the environment, else the defaults."""
        ledger = os.environ.get("ORCHESTRATE_LEDGER") or (profile and profile.ledger_url)
        mlflow = os.environ.get("MLFLOW_TRACKING_URI") or (profile and profile.mlflow_uri)
        return cls(
            ledger_url=ledger or DEFAULT_LEDGER,
            mlflow_uri=mlflow or DEFAULT_MLFLOW,
            # None: the sink keeps artifacts in mlartifacts/ next to a sqlite store
            artifact_root=Path(art).resolve()
            if (art := os.environ.get("ORCHESTRATE_ARTIFACTS"))
            else None,
        )


#: How long the cluster's lease and node claims outlive a holder that stopped renewing them
#: (killed, suspended, cut off): the default of ``lease_ttl_s``.
LEASE_TTL_S = 120.0
#: The shortest TTL taken: claims expire in whole seconds on each node's clock, renewed every
#: third of it.
_LEASE_TTL_MIN_S = 3.0


def lease_ttl_s() -> float:
    """The TTL of the lease and claims a command takes: ``ORCHESTRATE_LEASE_TTL_S``, else
    ``LEASE_TTL_S``. A shorter one hands the cluster of a suspended or lost orchestrator to the
    next command sooner, and takes it from one whose renewals are late (a loaded host).

    Raises:
        UsageError: the variable is not a number of seconds of at least 3.
    """
    raw = os.environ.get("ORCHESTRATE_LEASE_TTL_S", "").strip()
    if not raw:
        return LEASE_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = float("nan")
    if not ttl >= _LEASE_TTL_MIN_S or ttl == float("inf"):
        raise UsageError(
            f"ORCHESTRATE_LEASE_TTL_S={raw!r}: expected seconds, at least {_LEASE_TTL_MIN_S:g} "
            f"(unset: {LEASE_TTL_S:g})"
        )
    return ttl


def runtime_placeholders() -> dict[str, str]:
    """Launcher placeholders this machine provides: the Python that runs orchestrate (for
    local nodes), where the twin's drafter directories are installed, and the engines that
    ``orchestrate engines install`` builds (``{vllm_cpu}``, ``{vllm_cpu_models}``, …)."""
    return {"python": sys.executable, "twin_models": str(models_dir()), **engine_placeholders()}
