"""The vocabulary every other package speaks: knob specs, configurations, changes, records.

Imports nothing of ours; pydantic only.
"""

from __future__ import annotations

from knobs.catalog import CATALOGS, catalog
from knobs.config import Change, Config
from knobs.errors import KnobError
from knobs.records import CellResultRecord, CellSpec, NodeClockRecord
from knobs.space import ForbiddenCombination, KnobSpace
from knobs.spec import EffectPrior, KnobSpec, RenderSpec, Value

__all__ = [
    "CATALOGS",
    "CellResultRecord",
    "CellSpec",
    "Change",
    "Config",
    "EffectPrior",
    "ForbiddenCombination",
    "KnobError",
    "KnobSpace",
    "KnobSpec",
    "NodeClockRecord",
    "RenderSpec",
    "Value",
    "catalog",
]
