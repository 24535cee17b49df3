"""The names a profile's fields take that shell completion offers: the proposer kinds, the
approval modes and the embedded profiles. Kept apart from ``orchestrator.profile`` (which loads
the proposers' and the cluster's models) so that a TAB loads nothing else.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal

ProposerKind = Literal["optuna", "sweep", "claude", "hybrid"]
ApproveMode = Literal["auto", "ask", "queue"]


def embedded_profiles() -> list[str]:
    """Names of the profiles shipped inside the package."""
    folder = resources.files("orchestrator") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
